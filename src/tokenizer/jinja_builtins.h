// What templates can call and apply: operators, attribute and item access (with Python's
// str / dict / list methods), filters, tests and the globals transformers defines
// (raise_exception, strftime_now, namespace, dict, range). Each mirrors jinja2's
// ImmutableSandboxedEnvironment: mutating methods are refused, ranges are capped.
// Filters and tests are implemented in jinja_filters.cpp, str methods in jinja_strings.cpp.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tokenizer/jinja_value.h"

namespace hyserve::jinja {

// An error inside a builtin; the evaluator re-throws it as a TemplateError with the
// line and column of the expression.
class BuiltinError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& input, const Args& args);
bool apply_test(const std::string& name, const Value& input, const Args& args);

// a + b, a ~ b, a == b, a in b, ... for every binary operator the parser produces.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// -a, +a, not a.
Value unary_op(const std::string& op, const Value& a);

// obj.name: dict keys, namespace attributes and bound methods; Undefined when absent.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: dict keys, list and string indices (negative from the end); Undefined when absent.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] for lists and strings; null parts are Undefined or None.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop visits: list items, dict keys, string characters; none for Undefined.
List iterate(const Value& v);

// raise_exception, strftime_now, namespace, dict, range.
Dict default_globals();

// Helpers shared by the builtins' source files.
[[noreturn]] void fail_builtin(const std::string& message);
void check_defined(const Value& v);       // throws the Undefined's hint
std::string quoted_type(const Value& v);  // "'str'"
int64_t to_int(const Value& v);           // int or bool
bool is_integral(const Value& v);
int64_t py_len(const Value& v);  // len(): code points, list items, dict keys; 0 for Undefined
const Value* arg(const Args& args, size_t index, std::string_view name);
Value arg_or(const Args& args, size_t index, std::string_view name, Value fallback);
std::string string_arg(const Args& args, size_t index, std::string_view name, const char* what);
// jinja2's attribute getter for filters: "a.b.0" reads item a, then b, then index 0.
Value get_path(const Value& item, const std::string& path);

}  // namespace hyserve::jinja
