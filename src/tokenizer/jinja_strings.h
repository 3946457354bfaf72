// Python's str methods on UTF-8 strings (code-point aware where Python is): what
// templates call as 'x'.strip(), .split(), .replace(), ... and the filters built on them.
// Case mapping covers ASCII only; other code points pass through unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/jinja_value.h"

namespace hyserve::jinja {

std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);
// str.strip / lstrip / rstrip: whitespace when chars is null or None, else any of chars.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
// str.split / rsplit: on runs of whitespace when sep is null or None; maxsplit < 0: no limit.
List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right);
// str.replace; count < 0 replaces all.
std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count);
// str.startswith / endswith with a string or a tuple of strings.
bool py_affix_match(const std::string& s, const Value& affix, bool prefix);

}  // namespace hyserve::jinja
