// Values of the Jinja interpreter, with Python's semantics where templates can see them:
// str() / repr() of every type, truthiness, equality and ordering, json.dumps (the tojson
// filter of transformers), and UTF-8 strings measured and sliced in code points.
// Lists and dicts are shared by pointer: templates cannot mutate them (the sandbox is
// immutable), except namespaces, whose attributes `set ns.x = ...` assigns in place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyserve::jinja {

class Value;

using List = std::vector<Value>;

// A dict with string keys in insertion order (Python's dict order).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): attribute access and assignment, always truthy

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

// Call arguments: positional then keyword, as written at the call site.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`; nullptr when absent.
  const Value* get(size_t index, std::string_view name) const;
};

using Function = std::function<Value(const Args&)>;

// jinja2's default Undefined: renders empty, iterates empty, is falsy; any other use
// (attribute, item, arithmetic, call) is an error that quotes `hint`.
struct Undefined {
  std::string hint;  // e.g. "'x' is undefined" or "'dict object' has no attribute 'y'"
};

struct None {};

class Value {
 public:
  Value() : data_(Undefined{}) {}
  Value(None) : data_(None{}) {}
  Value(Undefined u) : data_(std::move(u)) {}
  Value(bool b) : data_(b) {}
  Value(int64_t i) : data_(i) {}
  Value(int i) : data_(static_cast<int64_t>(i)) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(List l) : data_(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : data_(std::make_shared<Dict>(std::move(d))) {}
  Value(std::shared_ptr<Dict> d) : data_(std::move(d)) {}
  Value(Function f) : data_(std::make_shared<Function>(std::move(f))) {}

  // JSON to Value; ordered_json keeps the key order the client sent (Python does too).
  // A tuple: a list that Python prints as (a, b) and that never equals a list.
  static Value tuple(List l);
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(data_); }
  bool is_none() const { return std::holds_alternative<None>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }
  bool is_float() const { return std::holds_alternative<double>(data_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(data_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(data_); }
  bool is_tuple() const { return is_tuple_; }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(data_); }
  bool is_namespace() const { return is_dict() && dict_ptr()->is_namespace; }
  bool is_mapping() const { return is_dict() && !dict_ptr()->is_namespace; }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Function>>(data_); }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  // int, bool or float as a double (Python's numeric tower).
  double as_number() const;
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<List>>(data_); }
  const Dict& as_dict() const { return *dict_ptr(); }
  const std::shared_ptr<Dict>& dict_ptr() const { return std::get<std::shared_ptr<Dict>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(data_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(data_); }

  // Python truthiness (bool(x)); Undefined is false, a namespace is true.
  bool truthy() const;
  // Python's type name, for error messages: "str", "int", "dict", ...
  std::string type_name() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Function>>
      data_;
  bool is_tuple_ = false;
};

// Python str(x) as Jinja prints it: Undefined is "", None is "None", floats use repr.
std::string py_str(const Value& v);
// Python repr(x): strings quoted as Python quotes them; containers recursively.
std::string py_repr(const Value& v);
// Python float.__repr__: shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string py_float_repr(double d);
// Python ==: 1 == 1.0 == True, lists elementwise, dicts regardless of order.
bool py_equal(const Value& a, const Value& b);
// Python <: numbers, strings (code point order) and lists; nullopt when Python raises.
std::optional<bool> py_less(const Value& a, const Value& b);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as transformers' tojson
// filter calls it. `indent` empty means no indent; separators default as in Python.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
// Throws std::invalid_argument naming the type that JSON cannot hold (Undefined, functions).
std::string json_dumps(const Value& v, const JsonOptions& options);

// UTF-8 helpers: strings are stored as UTF-8 and indexed in code points, as Python does.
std::vector<char32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<char32_t>& cps);
void utf8_append(std::string& out, char32_t cp);
// Python str.isspace() for one code point.
bool is_py_space(char32_t cp);

}  // namespace hyserve::jinja
