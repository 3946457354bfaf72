#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

#include "tokenizer/jinja_strings.h"

#include "util/error.h"

namespace hyserve::jinja {

[[noreturn]] void fail_builtin(const std::string& message) {
  throw BuiltinError(message);
}

void check_defined(const Value& v) {
  if (v.is_undefined()) fail_builtin(v.as_undefined().hint);
}

std::string quoted_type(const Value& v) {
  return str_cat("'", v.type_name(), "'");
}

int64_t to_int(const Value& v) {
  return v.is_bool() ? int64_t(v.as_bool()) : v.as_int();
}
bool is_integral(const Value& v) {
  return v.is_int() || v.is_bool();
}

const Value* arg(const Args& args, size_t index, std::string_view name) {
  return args.get(index, name);
}
Value arg_or(const Args& args, size_t index, std::string_view name, Value fallback) {
  const Value* v = args.get(index, name);
  return v ? *v : fallback;
}
std::string string_arg(const Args& args, size_t index, std::string_view name, const char* what) {
  const Value* v = args.get(index, name);
  if (v == nullptr || !v->is_string()) fail_builtin(str_cat(what, " expects a string argument"));
  return v->as_string();
}

int64_t py_len(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(utf8_decode(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  fail_builtin("object of type " + quoted_type(v) + " has no len()");
}

Value get_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

namespace {

// ---- methods ----

Value bound(std::function<Value(const Args&)> fn) {
  return Value(Function(std::move(fn)));
}

Value string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bound([s, prefix](const Args& a) {
      const Value* affix = arg(a, 0, "prefix");
      if (affix == nullptr) fail_builtin("startswith/endswith takes at least 1 argument");
      return Value(py_affix_match(s, *affix, prefix));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bound([s, left, right](const Args& a) {
      return Value(py_strip(s, arg(a, 0, "chars"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return bound([s, from_right](const Args& a) {
      const Value max = arg_or(a, 1, "maxsplit", Value(int64_t{-1}));
      return Value(py_split(s, arg(a, 0, "sep"), to_int(max), from_right));
    });
  }
  if (name == "replace") {
    return bound([s](const Args& a) {
      const Value count = arg_or(a, 2, "count", Value(int64_t{-1}));
      return Value(py_replace(s, string_arg(a, 0, "old", "replace"),
                              string_arg(a, 1, "new", "replace"), to_int(count)));
    });
  }
  if (name == "upper") return bound([s](const Args&) { return Value(py_upper(s)); });
  if (name == "lower") return bound([s](const Args&) { return Value(py_lower(s)); });
  if (name == "title") return bound([s](const Args&) { return Value(py_title(s)); });
  if (name == "capitalize") return bound([s](const Args&) { return Value(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "count") {
    return bound([s, name](const Args& a) {
      const std::string sub = string_arg(a, 0, "sub", name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(int64_t(utf8_decode(s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) return Value(int64_t{-1});
      return Value(int64_t(utf8_decode(std::string_view(s).substr(0, p)).size()));
    });
  }
  if (name == "join") {
    return bound([s](const Args& a) {
      const Value* items = arg(a, 0, "iterable");
      if (items == nullptr) fail_builtin("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(*items)) {
        if (!item.is_string())
          fail_builtin("sequence item: expected str instance, " + item.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += item.as_string();
      }
      return Value(out);
    });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    return bound([s, name](const Args&) {
      if (s.empty()) return Value(false);
      for (char32_t cp : utf8_decode(s)) {
        const bool ascii = cp < 0x80;
        bool ok;
        if (name == "isspace")
          ok = is_py_space(cp);
        else if (name == "isdigit")
          ok = ascii && std::isdigit(int(cp));
        else if (name == "isalpha")
          ok = ascii && std::isalpha(int(cp));
        else
          ok = ascii && std::isalnum(int(cp));
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value(Undefined{"'str object' has no attribute '" + name + "'"});
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "get") {
    return bound([d](const Args& a) {
      const Value* key = arg(a, 0, "key");
      if (key == nullptr) fail_builtin("get expected at least 1 argument, got 0");
      const Value* found = key->is_string() ? d.as_dict().find(key->as_string()) : nullptr;
      return found ? *found : arg_or(a, 1, "default", Value(None{}));
    });
  }
  if (name == "items") {
    return bound([d](const Args&) { return apply_filter("items", d, Args{}); });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return bound([d, keys](const Args&) {
      List out;
      for (const auto& [k, v] : d.as_dict().items) out.push_back(keys ? Value(k) : v);
      return Value(std::move(out));
    });
  }
  return Value(Undefined{});
}

const char* const kUnsafeListMethods[] = {"append", "clear",  "extend",  "insert",
                                          "pop",    "remove", "reverse", "sort"};
const char* const kUnsafeDictMethods[] = {"clear", "pop", "popitem", "setdefault", "update"};

Value unsafe(const Value& obj, const std::string& name) {
  return Value(Undefined{"access to attribute '" + name + "' of '" + obj.type_name() +
                         "' object is unsafe."});
}

// Python's floor division and modulo on integers.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail_builtin("unsupported operand type(s) for " + op + ": " + quoted_type(a) + " and " +
               quoted_type(b));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  check_defined(a);
  check_defined(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(out));
    }
    if (a.is_string() && b.is_number())
      fail_builtin("can only concatenate str (not \"" + b.type_name() + "\") to str");
  }
  if (op == "*") {
    const bool left_seq = (a.is_string() || a.is_list()) && is_integral(b);
    const bool right_seq = (b.is_string() || b.is_list()) && is_integral(a);
    if (left_seq || right_seq) {
      const Value& seq = left_seq ? a : b;
      const int64_t n = to_int(left_seq ? b : a);
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value(out);
      }
      List out;
      for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
      return Value(std::move(out));
    }
  }
  if (op == "%" && a.is_string()) fail_builtin("string formatting with % is not supported");
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  const bool ints = is_integral(a) && is_integral(b);
  if (op == "/") {
    if (b.as_number() == 0) fail_builtin("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (ints) {
    const int64_t x = to_int(a), y = to_int(b);
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) fail_builtin("integer division or modulo by zero");
      return op == "//" ? Value(floor_div(x, y)) : Value(x - floor_div(x, y) * y);
    }
    if (op == "**") {
      if (y < 0) return Value(std::pow(double(x), double(y)));
      int64_t r = 1;
      for (int64_t i = 0; i < y; ++i) r *= x;
      return Value(r);
    }
  }
  const double x = a.as_number(), y = b.as_number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) fail_builtin("float division by zero");
  const double q = std::floor(x / y);
  if (op == "//") return Value(q);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value(m);
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string())
      fail_builtin("'in <string>' requires string as left operand, not " + needle.type_name());
    return haystack.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (haystack.is_mapping())
    return needle.is_string() && haystack.as_dict().find(needle.as_string());
  if (haystack.is_list() || haystack.is_undefined()) {
    for (const auto& item : iterate(haystack)) {
      if (py_equal(item, needle)) return true;
    }
    return false;
  }
  fail_builtin("argument of type " + quoted_type(haystack) + " is not iterable");
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(py_str(a) + py_str(b));
  if (op == "==") return Value(py_equal(a, b));
  if (op == "!=") return Value(!py_equal(a, b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    check_defined(a);
    check_defined(b);
    const bool swap = op == ">" || op == "<=";
    const auto less = swap ? py_less(b, a) : py_less(a, b);
    if (!less)
      fail_builtin("'" + op + "' not supported between instances of " + quoted_type(a) + " and " +
                   quoted_type(b));
    return Value(op == "<" || op == ">" ? *less : !*less);
  }
  return arithmetic(op, a, b);
}

Value unary_op(const std::string& op, const Value& a) {
  if (op == "not") return Value(!a.truthy());
  check_defined(a);
  if (is_integral(a)) return Value(op == "-" ? -to_int(a) : to_int(a));
  if (a.is_float()) return Value(op == "-" ? -a.as_float() : a.as_float());
  fail_builtin("bad operand type for unary " + op + ": " + quoted_type(a));
}

Value get_attribute(const Value& obj, const std::string& name) {
  check_defined(obj);
  if (obj.is_namespace()) {
    const Value* v = obj.as_dict().find(name);
    return v ? *v : Value(Undefined{"'Namespace object' has no attribute '" + name + "'"});
  }
  if (obj.is_dict()) {
    for (const char* m : kUnsafeDictMethods) {
      if (name == m) return unsafe(obj, name);
    }
    Value method = dict_method(obj, name);
    if (!method.is_undefined()) return method;
    const Value* v = obj.as_dict().find(name);
    return v ? *v : Value(Undefined{"'dict object' has no attribute '" + name + "'"});
  }
  if (obj.is_string()) return string_method(obj.as_string(), name);
  if (obj.is_list()) {
    for (const char* m : kUnsafeListMethods) {
      if (name == m) return unsafe(obj, name);
    }
    if (name == "index" || name == "count") {
      return bound([obj, name](const Args& a) {
        if (a.positional.size() != 1) fail_builtin(name + "() takes exactly one argument");
        const Value& x = a.positional[0];
        const List& items = obj.as_list();
        int64_t n = 0;
        for (size_t i = 0; i < items.size(); ++i) {
          if (!py_equal(items[i], x)) continue;
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") fail_builtin(py_repr(x) + " is not in list");
        return Value(n);
      });
    }
  }
  const std::string owner = obj.is_none() ? "'None'" : "'" + obj.type_name() + " object'";
  return Value(Undefined{owner + " has no attribute '" + name + "'"});
}

Value get_item(const Value& obj, const Value& key) {
  check_defined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      const Value* v = obj.as_dict().find(key.as_string());
      if (v) return *v;
      if (obj.is_namespace()) return get_attribute(obj, key.as_string());
    }
    return Value(Undefined{"'dict object' has no attribute '" + py_str(key) + "'"});
  }
  if ((obj.is_list() || obj.is_string()) && is_integral(key)) {
    const int64_t size = py_len(obj);
    int64_t i = to_int(key);
    if (i < 0) i += size;
    if (i < 0 || i >= size) {
      return Value(Undefined{obj.type_name() + " object has no element " + py_str(key)});
    }
    if (obj.is_list()) return obj.as_list()[i];
    std::string out;
    utf8_append(out, utf8_decode(obj.as_string())[i]);
    return Value(out);
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value(
      Undefined{"'" + obj.type_name() + " object' has no attribute '" + py_str(key) + "'"});
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  check_defined(obj);
  if (!obj.is_list() && !obj.is_string())
    fail_builtin(quoted_type(obj) + " object is not subscriptable");
  auto bound_of = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!is_integral(v)) fail_builtin(str_cat("slice ", what, " must be an integer or None"));
    return to_int(v);
  };
  const int64_t n = py_len(obj);
  const int64_t s = bound_of(step, "step").value_or(1);
  if (s == 0) fail_builtin("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = s < 0 ? -1 : 0;
    } else if (x >= n) {
      x = s < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = adjust(bound_of(start, "start"), s < 0 ? n - 1 : 0);
  const int64_t e = adjust(bound_of(stop, "stop"), s < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) picks.push_back(static_cast<size_t>(i));
  if (obj.is_list()) {
    List out;
    for (size_t i : picks) out.push_back(obj.as_list()[i]);
    return Value(std::move(out));
  }
  const auto cps = utf8_decode(obj.as_string());
  std::vector<char32_t> out;
  for (size_t i : picks) out.push_back(cps[i]);
  return Value(utf8_encode(out));
}

List iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_undefined()) return {};
  List out;
  if (v.is_mapping()) {
    for (const auto& [k, item] : v.as_dict().items) out.push_back(Value(k));
    return out;
  }
  if (v.is_string()) {
    for (char32_t cp : utf8_decode(v.as_string())) {
      std::string s;
      utf8_append(s, cp);
      out.push_back(Value(std::move(s)));
    }
    return out;
  }
  fail_builtin(quoted_type(v) + " object is not iterable");
}

Dict default_globals() {
  constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
  Dict g;
  g.set("raise_exception", Value(Function([](const Args& a) -> Value {
          fail_builtin(a.positional.empty() ? std::string() : py_str(a.positional[0]));
        })));
  g.set("strftime_now", Value(Function([](const Args& a) {
          const std::string format = string_arg(a, 0, "format", "strftime_now");
          const std::time_t now = std::time(nullptr);
          std::tm local{};
          localtime_r(&now, &local);
          char buf[512];
          const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
          return Value(std::string(buf, n));
        })));
  auto make_dict = [](const Args& a, bool is_namespace) {
    auto d = std::make_shared<Dict>();
    d->is_namespace = is_namespace;
    for (const auto& p : a.positional) {
      if (!p.is_mapping()) fail_builtin("expected a mapping as positional argument");
      for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    return Value(d);
  };
  g.set("namespace", Value(Function([make_dict](const Args& a) {
          for (const auto& [k, v] : a.keyword) {
            if (!k.empty() && k[0] == '_')
              fail_builtin(
                  "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                  "got '" +
                  k + "'. Please rename the attribute.");
          }
          return make_dict(a, true);
        })));
  g.set("dict", Value(Function([make_dict](const Args& a) { return make_dict(a, false); })));
  g.set("range", Value(Function([](const Args& a) {
          if (a.positional.empty() || a.positional.size() > 3)
            fail_builtin("range expected 1 to 3 arguments");
          for (const auto& p : a.positional) {
            if (!is_integral(p))
              fail_builtin(quoted_type(p) + " object cannot be interpreted as an integer");
          }
          const bool one = a.positional.size() == 1;
          const int64_t start = one ? 0 : to_int(a.positional[0]);
          const int64_t stop = one ? to_int(a.positional[0]) : to_int(a.positional[1]);
          const int64_t step = a.positional.size() == 3 ? to_int(a.positional[2]) : 1;
          if (step == 0) fail_builtin("range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (static_cast<int64_t>(out.size()) >= kMaxRange) {
              fail_builtin(
                  "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            }
            out.push_back(Value(i));
          }
          return Value(std::move(out));
        })));
  return g;
}

}  // namespace hyserve::jinja
