// Jinja parser: tokens to a tree of statements and expressions, with jinja2's grammar and
// operator precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary <
// postfix . [] () and filters | / tests `is`). Unknown filters and tests are compile-time
// errors, as in jinja2.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_value.h"

namespace hyserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // [args...]
    kTuple,      // (args...) or a, b: evaluated as a list
    kDict,       // {kwargs key expr: value}: keys in args[2i], values in args[2i+1]
    kGetAttr,    // args[0].name
    kGetItem,    // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null parts absent)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..]); negated flag
    kUnary,      // name in {"-", "+", "not"} args[0]
    kBinary,     // args[0] name args[1] for + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,        // args[0] and args[1]
    kOr,         // args[0] or args[1]
    kCondition,  // args[0] if args[1] else args[2] (else part may be null)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body)...; else_body
    kFor,       // for targets in expr [if condition]: body; else_body
    kSet,       // set targets = expr, or set targets[0].attr = expr (namespace)
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace: `set targets[0].attr = expr`
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name and default (or null)
};

// Parses a whole template; throws TemplateError with the line and column on bad syntax.
Body parse_template(const std::string& source);

}  // namespace hyserve::jinja
