// Jinja lexer: splits a template into text and tag tokens the way jinja2's lexer does
// with trim_blocks=True and lstrip_blocks=True (how transformers renders chat templates):
// newlines normalized to "\n", one trailing newline dropped, `-` / `+` whitespace control,
// comments removed, {% raw %} kept verbatim, braces balanced inside tags.
#pragma once

#include <string>
#include <vector>

#include "util/error.h"

namespace hyserve::jinja {

// Any template error: syntax (while compiling) or runtime (while rendering), including
// raise_exception(). what() is "message (line L, column C)"; message() is the bare text.
class TemplateError : public Error {
 public:
  TemplateError(const std::string& message, int line, int column);
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  std::string message_;
  int line_;
  int column_;
};

enum class TokenKind {
  kText,        // template data between tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier (keywords such as `and`, `if`, `in` are names too)
  kString,      // string literal, escapes already decoded
  kInt,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEnd,       // end of template
};

struct Token {
  TokenKind kind;
  std::string value;
  int line;    // 1-based
  int column;  // 1-based, in bytes of the (newline-normalized) template
};

std::vector<Token> tokenize(const std::string& source);

}  // namespace hyserve::jinja
