#include "tokenizer/jinja_template.h"

#include <unordered_map>

#include "tokenizer/jinja_builtins.h"

namespace hyserve::jinja {
namespace {

using Scope = std::unordered_map<std::string, Value>;

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Dict& context) {
    scopes_.emplace_back();
    for (const auto& [k, v] : default_globals().items) scopes_.back()[k] = v;
    for (const auto& [k, v] : context.items) scopes_.back()[k] = v;
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Flow exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += py_str(eval(*s.expr));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond).truthy()) return exec(body, out);
        }
        return exec(s.else_body, out);
      case Stmt::Kind::kFor:
        return exec_for(s, out);
      case Stmt::Kind::kSet:
        exec_set(s);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec(s.body, captured);
        scopes_.back()[s.targets[0]] = Value(std::move(captured));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scopes_.back()[s.text] = make_macro(s);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // Each iteration runs in a fresh scope, as in jinja2: assignments in the body are not
  // seen by the next iteration nor after the loop.
  Flow exec_for(const Stmt& s, std::string& out) {
    List items;
    const Value iterable = eval(*s.expr);
    located(s.line, s.column, [&] { items = iterate(iterable); });
    if (s.condition) {
      List kept;
      for (const auto& item : items) {
        scopes_.emplace_back();
        bind(s.targets, item, s);
        const bool keep = eval(*s.condition).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Dict loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(n - i));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("depth", Value(1));
      loop.set("depth0", Value(0));
      loop.set("previtem", i > 0 ? items[i - 1] : Value(Undefined{"there is no previous item"}));
      loop.set("nextitem", i + 1 < n ? items[i + 1] : Value(Undefined{"there is no next item"}));
      loop.set("cycle", Value(Function([i](const Args& a) {
                 if (a.positional.empty()) throw BuiltinError("no items for cycling given");
                 return a.positional[i % a.positional.size()];
               })));
      scopes_.emplace_back();
      scopes_.back()["loop"] = Value(std::move(loop));
      bind(s.targets, items[i], s);
      const Flow flow = exec(s.body, out);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    if (n == 0) return exec(s.else_body, out);
    return Flow::kNormal;
  }

  void bind(const std::vector<std::string>& targets, const Value& value, const Stmt& s) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = value;
      return;
    }
    List parts;
    located(s.line, s.column, [&] { parts = iterate(value); });
    if (parts.size() != targets.size()) {
      throw TemplateError(parts.size() > targets.size()
                              ? str_cat("too many values to unpack (expected ", targets.size(), ")")
                              : str_cat("not enough values to unpack (expected ", targets.size(),
                                        ", got ", parts.size(), ")"),
                          s.line, s.column);
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = parts[i];
  }

  void exec_set(const Stmt& s) {
    Value value = eval(*s.expr);
    if (s.attr.empty()) {
      bind(s.targets, value, s);
      return;
    }
    const Value target = lookup(s.targets[0]);
    if (!target.is_namespace()) {
      throw TemplateError("cannot assign attribute on non-namespace object", s.line, s.column);
    }
    if (s.attr[0] == '_') {
      throw TemplateError(
          "Chat templates cannot store underscore-prefixed attributes on a "
          "namespace, but got '" +
              s.attr + "'. Please rename the attribute.",
          s.line, s.column);
    }
    target.dict_ptr()->set(s.attr, std::move(value));
  }

  // A macro: called with positional and keyword arguments, renders its body in a scope
  // over the template's top-level variables and returns the text.
  Value make_macro(const Stmt& s) {
    const Stmt* macro = &s;
    return Value(Function([this, macro](const Args& args) {
      if (args.positional.size() > macro->params.size()) {
        throw BuiltinError("macro '" + macro->text + "' takes not more than " +
                           std::to_string(macro->params.size()) + " argument(s)");
      }
      std::vector<Scope> saved(scopes_.begin() + 1, scopes_.end());
      scopes_.resize(1);
      scopes_.emplace_back();
      for (size_t i = 0; i < macro->params.size(); ++i) {
        const auto& [name, def] = macro->params[i];
        const Value* given = args.get(i, name);
        scopes_.back()[name] = given ? *given
                               : def
                                   ? eval(*def)
                                   : Value(Undefined{"parameter '" + name + "' was not provided"});
      }
      std::string out;
      exec(macro->body, out);
      scopes_.resize(1);
      scopes_.insert(scopes_.end(), saved.begin(), saved.end());
      return Value(std::move(out));
    }));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value(Undefined{"'" + name + "' is undefined"});
  }

  // Runs fn, turning builtin errors into TemplateErrors located at (line, column).
  template <typename Fn>
  static void located(int line, int column, Fn&& fn) {
    try {
      fn();
    } catch (const BuiltinError& e) {
      throw TemplateError(e.what(), line, column);
    }
  }

  Args eval_args(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [name, value] : e.kwargs) args.keyword.emplace_back(name, eval(*value));
    return args;
  }

  Value eval(const Expr& e) {
    using Kind = Expr::Kind;
    switch (e.kind) {
      case Kind::kLiteral:
        return e.value;
      case Kind::kName:
        return lookup(e.name);
      case Kind::kAnd: {
        Value left = eval(*e.args[0]);
        return left.truthy() ? eval(*e.args[1]) : left;
      }
      case Kind::kOr: {
        Value left = eval(*e.args[0]);
        return left.truthy() ? left : eval(*e.args[1]);
      }
      case Kind::kCondition:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2]
                   ? eval(*e.args[2])
                   : Value(Undefined{"the inline if-expression on line " + std::to_string(e.line) +
                                     " evaluated to false and no else section was defined."});
      case Kind::kList:
      case Kind::kTuple: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return e.kind == Kind::kTuple ? Value::tuple(std::move(items)) : Value(std::move(items));
      }
      case Kind::kDict: {
        Dict d;
        for (size_t i = 0; i < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          if (!key.is_string()) throw TemplateError("dict keys must be strings", e.line, e.column);
          d.set(key.as_string(), eval(*e.args[i + 1]));
        }
        return Value(std::move(d));
      }
      default:
        break;
    }
    // Everything else can fail inside a builtin: evaluate operands, then apply in place.
    Value result;
    switch (e.kind) {
      case Kind::kGetAttr: {
        const Value obj = eval(*e.args[0]);
        located(e.line, e.column, [&] { result = get_attribute(obj, e.name); });
        return result;
      }
      case Kind::kGetItem: {
        const Value obj = eval(*e.args[0]);
        const Value key = eval(*e.args[1]);
        located(e.line, e.column, [&] { result = get_item(obj, key); });
        return result;
      }
      case Kind::kSlice: {
        const Value obj = eval(*e.args[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1]) parts[i] = eval(*e.args[i + 1]);
        }
        located(e.line, e.column, [&] { result = get_slice(obj, parts[0], parts[1], parts[2]); });
        return result;
      }
      case Kind::kCall: {
        const Value callee = eval(*e.args[0]);
        const Args args = eval_args(e, 1);
        located(e.line, e.column, [&] {
          if (callee.is_undefined()) throw BuiltinError(callee.as_undefined().hint);
          if (!callee.is_callable())
            throw BuiltinError(py_repr(callee) + " object is not callable");
          result = callee.as_function()(args);
        });
        return result;
      }
      case Kind::kFilter: {
        const Value input = eval(*e.args[0]);
        const Args args = eval_args(e, 1);
        located(e.line, e.column, [&] { result = apply_filter(e.name, input, args); });
        return result;
      }
      case Kind::kTest: {
        const Value input = eval(*e.args[0]);
        const Args args = eval_args(e, 1);
        bool pass = false;
        located(e.line, e.column, [&] { pass = apply_test(e.name, input, args); });
        return Value(pass != e.negated);
      }
      case Kind::kUnary: {
        const Value operand = eval(*e.args[0]);
        located(e.line, e.column, [&] { result = unary_op(e.name, operand); });
        return result;
      }
      case Kind::kBinary: {
        const Value left = eval(*e.args[0]);
        const Value right = eval(*e.args[1]);
        located(e.line, e.column, [&] { result = binary_op(e.name, left, right); });
        return result;
      }
      default:
        throw TemplateError("unsupported expression", e.line, e.column);
    }
  }

  std::vector<Scope> scopes_;  // [0]: globals, render variables and top-level sets
};

}  // namespace

Template::Template(const std::string& source)
    : body_(std::make_shared<const Body>(parse_template(source))) {}

std::string Template::render(const Dict& context) const {
  Renderer renderer(context);
  std::string out;
  renderer.exec(*body_, out);
  return out;
}

}  // namespace hyserve::jinja
