#include "tokenizer/jinja_parser.h"

#include <algorithm>

#include "tokenizer/jinja_builtins.h"

namespace hyserve::jinja {
namespace {

using Kind = Expr::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_all() {
    std::string end;
    return parse_body({}, &end);
  }

 private:
  // ---- token helpers ----

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).value == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).value == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& message, const Token& at) const {
    throw TemplateError(message, at.line, at.column);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kVarEnd:
        return "end of print statement";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kString:
        return "string";
      default:
        return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(str_cat("expected token '", op, "', got ", describe(peek())), peek());
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) fail("expected a name, got " + describe(peek()), peek());
    return next().value;
  }
  void expect_kind(TokenKind kind) {
    if (peek().kind != kind) {
      fail(kind == TokenKind::kBlockEnd
               ? "expected end of statement block, got " + describe(peek())
               : "expected end of print statement, got " + describe(peek()),
           peek());
    }
    next();
  }

  ExprPtr make(Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  ExprPtr make2(Kind kind, const Token& at, std::string name, ExprPtr a, ExprPtr b) {
    auto e = make(kind, at);
    e->name = std::move(name);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // ---- statements ----

  // Parses statements until a `{% name %}` with name in `ends` (consumed up to the name,
  // which is stored in *end) or the end of the template (only when `ends` is empty).
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEnd) {
        if (ends.empty()) return body;
        std::string expected;
        for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
        fail("Unexpected end of template. Jinja was looking for the following tags: " + expected,
             t);
      }
      if (t.kind == TokenKind::kText) {
        auto s = make_stmt(Stmt::Kind::kText, t);
        s->text = next().value;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kVarBegin) {
        auto s = make_stmt(Stmt::Kind::kOutput, next());
        s->expr = parse_tuple();
        expect_kind(TokenKind::kVarEnd);
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const Token& name = peek(1);
        if (name.kind == TokenKind::kName &&
            std::find(ends.begin(), ends.end(), name.value) != ends.end()) {
          next();
          *end = next().value;
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t), t);
      }
    }
  }

  StmtPtr make_stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  StmtPtr parse_statement() {
    const Token& t = peek();
    if (t.kind != TokenKind::kName) fail("tag name expected", t);
    const std::string tag = t.value;
    std::string end;
    if (tag == "if") {
      auto s = make_stmt(Stmt::Kind::kIf, next());
      auto cond = parse_expression(false);
      while (true) {
        expect_kind(TokenKind::kBlockEnd);
        Body body = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end != "elif") break;
        cond = parse_expression(false);
      }
      if (end == "else") {
        expect_kind(TokenKind::kBlockEnd);
        s->else_body = parse_body({"endif"}, &end);
      }
      expect_kind(TokenKind::kBlockEnd);
      return s;
    }
    if (tag == "for") {
      auto s = make_stmt(Stmt::Kind::kFor, next());
      const bool paren = skip_op("(");
      do {
        s->targets.push_back(expect_name());
      } while (skip_op(","));
      if (paren) expect_op(")");
      if (!skip_name("in")) fail("expected 'in', got " + describe(peek()), peek());
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->condition = parse_expression();
      if (is_name("recursive")) fail("recursive loops are not supported", peek());
      expect_kind(TokenKind::kBlockEnd);
      s->body = parse_body({"endfor", "else"}, &end);
      if (end == "else") {
        expect_kind(TokenKind::kBlockEnd);
        s->else_body = parse_body({"endfor"}, &end);
      }
      expect_kind(TokenKind::kBlockEnd);
      return s;
    }
    if (tag == "set") {
      auto s = make_stmt(Stmt::Kind::kSet, next());
      s->targets.push_back(expect_name());
      if (skip_op(".")) {
        s->attr = expect_name();
      } else {
        while (skip_op(",")) s->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        s->expr = parse_tuple();
        expect_kind(TokenKind::kBlockEnd);
        return s;
      }
      if (s->targets.size() != 1 || !s->attr.empty()) fail("expected token '='", peek());
      s->kind = Stmt::Kind::kSetBlock;
      expect_kind(TokenKind::kBlockEnd);
      s->body = parse_body({"endset"}, &end);
      expect_kind(TokenKind::kBlockEnd);
      return s;
    }
    if (tag == "macro") {
      auto s = make_stmt(Stmt::Kind::kMacro, next());
      s->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        std::string param = expect_name();
        ExprPtr def = skip_op("=") ? parse_expression() : nullptr;
        s->params.emplace_back(std::move(param), std::move(def));
      }
      expect_kind(TokenKind::kBlockEnd);
      s->body = parse_body({"endmacro"}, &end);
      if (peek().kind == TokenKind::kName) next();
      expect_kind(TokenKind::kBlockEnd);
      return s;
    }
    if (tag == "break" || tag == "continue") {
      auto s = make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, next());
      expect_kind(TokenKind::kBlockEnd);
      return s;
    }
    fail("Encountered unknown tag '" + tag + "'.", t);
  }

  // ---- expressions ----

  bool at_tuple_end() const {
    const auto k = peek().kind;
    return k == TokenKind::kVarEnd || k == TokenKind::kBlockEnd || k == TokenKind::kEnd ||
           is_op(")") || is_name("if");
  }

  // expr or expr, expr, ... (a tuple, evaluated as a list).
  ExprPtr parse_tuple(bool with_condexpr = true) {
    const Token& start = peek();
    auto first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make(Kind::kTuple, start);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (at_tuple_end()) break;
      tuple->args.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr = true) {
    auto expr = parse_or();
    if (!with_condexpr) return expr;
    while (is_name("if")) {
      auto cond = make(Kind::kCondition, next());
      auto test = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      const Token& t = next();
      left = make2(Kind::kOr, t, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      const Token& t = next();
      left = make2(Kind::kAnd, t, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make(Kind::kUnary, next());
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    auto left = parse_math1();
    bool compared = false;
    while (true) {
      const Token& t = peek();
      std::string op;
      if (t.kind == TokenKind::kOperator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
           t.value == ">" || t.value == ">=")) {
        op = t.value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        return left;
      }
      if (compared) fail("chained comparisons are not supported", t);
      compared = true;
      left = make2(Kind::kBinary, t, op, std::move(left), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = make2(Kind::kBinary, t, t.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    auto left = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      left = make2(Kind::kBinary, t, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = make2(Kind::kBinary, t, t.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    auto left = parse_unary();
    while (is_op("**")) {
      const Token& t = next();
      left = make2(Kind::kBinary, t, "**", std::move(left), parse_unary());
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter = true) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(Kind::kUnary, peek());
      node->name = next().value;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    if (t.kind == TokenKind::kName) {
      next();
      auto e = make(Kind::kLiteral, t);
      if (t.value == "true" || t.value == "True") {
        e->value = Value(true);
      } else if (t.value == "false" || t.value == "False") {
        e->value = Value(false);
      } else if (t.value == "none" || t.value == "None") {
        e->value = Value(None{});
      } else {
        e->kind = Kind::kName;
        e->name = t.value;
      }
      return e;
    }
    if (t.kind == TokenKind::kString) {
      auto e = make(Kind::kLiteral, t);
      std::string s;
      while (peek().kind == TokenKind::kString) s += next().value;
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == TokenKind::kInt || t.kind == TokenKind::kFloat) {
      auto e = make(Kind::kLiteral, next());
      e->value = t.kind == TokenKind::kInt ? Value(static_cast<int64_t>(std::stoll(t.value)))
                                           : Value(std::stod(t.value));
      return e;
    }
    if (is_op("(")) {
      next();
      if (skip_op(")")) return make(Kind::kTuple, t);
      auto inner = parse_expression();
      if (is_op(",")) {
        auto tuple = make(Kind::kTuple, t);
        tuple->args.push_back(std::move(inner));
        while (skip_op(",")) {
          if (is_op(")")) break;
          tuple->args.push_back(parse_expression());
        }
        inner = std::move(tuple);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      auto e = make(Kind::kList, next());
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression());
      }
      return e;
    }
    if (is_op("{")) {
      auto e = make(Kind::kDict, next());
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      return e;
    }
    fail("unexpected " + describe(t), t);
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Token& t = next();
        if (peek().kind == TokenKind::kInt) {
          auto index = make(Kind::kLiteral, peek());
          index->value = Value(static_cast<int64_t>(std::stoll(next().value)));
          node = make2(Kind::kGetItem, t, "", std::move(node), std::move(index));
        } else {
          auto e = make(Kind::kGetAttr, t);
          e->name = expect_name();
          e->args.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        auto call = make(Kind::kCall, peek());
        call->args.push_back(std::move(node));
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();  // [
    std::vector<ExprPtr> parts;
    if (!is_op(":")) {
      auto index = parse_expression();
      if (!is_op(":")) {
        expect_op("]");
        return make2(Kind::kGetItem, t, "", std::move(node), std::move(index));
      }
      parts.push_back(std::move(index));
    } else {
      parts.push_back(nullptr);
    }
    next();  // :
    parts.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression());
    if (skip_op(":")) {
      parts.push_back(is_op("]") ? nullptr : parse_expression());
    } else {
      parts.push_back(nullptr);
    }
    expect_op("]");
    auto slice = make(Kind::kSlice, t);
    slice->args.push_back(std::move(node));
    for (auto& p : parts) slice->args.push_back(std::move(p));
    return slice;
  }

  // (positional..., name=value...) appended to e.args (after what is already there) and
  // e.kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs are not supported", peek());
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string name = next().value;
        next();
        e.kwargs.emplace_back(std::move(name), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument", peek());
        e.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        const Token& t = next();
        auto e = make(Kind::kFilter, t);
        const Token& name = peek();
        e->name = expect_name();
        if (!has_filter(e->name)) fail("No filter named '" + e->name + "'.", name);
        e->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        const Token& t = next();
        auto e = make(Kind::kTest, t);
        e->negated = skip_name("not");
        const Token& name = peek();
        e->name = expect_name();
        if (!has_test(e->name)) fail("No test named '" + e->name + "'.", name);
        e->args.push_back(std::move(node));
        const Token& a = peek();
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((a.kind == TokenKind::kName || a.kind == TokenKind::kString ||
                    a.kind == TokenKind::kInt || a.kind == TokenKind::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        auto call = make(Kind::kCall, peek());
        call->args.push_back(std::move(node));
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(tokenize(source)).parse_all();
}

}  // namespace hyserve::jinja
