// Filters (x|name(args)) and tests (x is name(args)) with jinja2's semantics: the ones
// chat templates use, plus their close relatives.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_strings.h"
#include "util/error.h"

namespace hyserve::jinja {
namespace {

Args tail_args(const Args& args, size_t skip) {
  Args out;
  for (size_t i = skip; i < args.positional.size(); ++i)
    out.positional.push_back(args.positional[i]);
  out.keyword = args.keyword;
  return out;
}

// select / reject / selectattr / rejectattr.
Value select_items(const Value& input, const Args& args, bool by_attr, bool keep) {
  List out;
  size_t next = 0;
  std::string attr;
  if (by_attr) attr = string_arg(args, next++, "attribute", "selectattr");
  const Value* test = args.positional.size() > next ? &args.positional[next] : nullptr;
  if (test && !test->is_string()) fail_builtin("test name must be a string");
  const Args test_args = tail_args(args, next + 1);
  for (const auto& item : iterate(input)) {
    const Value subject = by_attr ? get_path(item, attr) : item;
    const bool pass = test ? apply_test(test->as_string(), subject, test_args) : subject.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

// The sort key of jinja2's sort / unique / min / max: strings lowered unless case_sensitive.
Value sort_key(const Value& item, const Args& args, size_t attr_index) {
  const Value* attribute = arg(args, attr_index, "attribute");
  Value key = attribute && !attribute->is_none() ? get_path(item, py_str(*attribute)) : item;
  const Value* case_sensitive = arg(args, attr_index - 1, "case_sensitive");
  if (key.is_string() && !(case_sensitive && case_sensitive->truthy()))
    key = Value(py_lower(key.as_string()));
  return key;
}

bool less_or_fail_builtin(const Value& a, const Value& b) {
  const auto less = py_less(a, b);
  if (!less)
    fail_builtin("'<' not supported between instances of " + quoted_type(a) + " and " +
                 quoted_type(b));
  return *less;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value filter_tojson(const Value& input, const Args& args) {
  JsonOptions o;
  if (const Value* v = arg(args, 0, "ensure_ascii")) o.ensure_ascii = v->truthy();
  if (const Value* v = arg(args, 1, "indent"); v && !v->is_none()) {
    if (v->is_string()) {
      o.indent = v->as_string();
    } else if (is_integral(*v)) {
      o.indent = std::string(std::max<int64_t>(0, to_int(*v)), ' ');
    } else {
      fail_builtin("indent must be an int or a string");
    }
  }
  if (const Value* v = arg(args, 2, "separators"); v && !v->is_none()) {
    if (!v->is_list() || v->as_list().size() != 2 || !v->as_list()[0].is_string() ||
        !v->as_list()[1].is_string()) {
      fail_builtin("separators must be a pair of strings");
    }
    o.separators = std::make_pair(v->as_list()[0].as_string(), v->as_list()[1].as_string());
  }
  if (const Value* v = arg(args, 3, "sort_keys")) o.sort_keys = v->truthy();
  try {
    return Value(json_dumps(input, o));
  } catch (const std::invalid_argument& e) {
    fail_builtin(e.what());
  }
}

Value filter_indent(const Value& input, const Args& args) {
  const Value width = arg_or(args, 0, "width", Value(int64_t{4}));
  const bool first = arg_or(args, 1, "first", Value(false)).truthy();
  const bool blank = arg_or(args, 2, "blank", Value(false)).truthy();
  const std::string pad = width.is_string() ? width.as_string() : std::string(to_int(width), ' ');
  const std::string s = py_str(input) + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p = s.find('\n'); p != std::string::npos; p = s.find('\n', start)) {
    lines.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

Value filter_int(const Value& input, const Args& args) {
  const Value fallback = arg_or(args, 0, "default", Value(int64_t{0}));
  if (is_integral(input)) return Value(to_int(input));
  if (input.is_float()) return Value(static_cast<int64_t>(input.as_float()));
  if (input.is_string()) {
    const std::string s = py_strip(input.as_string(), nullptr, true, true);
    try {
      size_t used = 0;
      const int64_t i = std::stoll(s, &used);
      if (used == s.size()) return Value(i);
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_float(const Value& input, const Args& args) {
  const Value fallback = arg_or(args, 0, "default", Value(0.0));
  if (input.is_number()) return Value(input.as_number());
  if (input.is_string()) {
    const std::string s = py_strip(input.as_string(), nullptr, true, true);
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

using FilterFn = std::function<Value(const Value&, const Args&)>;
using FilterTable = std::map<std::string, FilterFn, std::less<>>;

// abs, float, int, round.
void add_number_filters(FilterTable& t) {
  t["abs"] = [](const Value& v, const Args&) {
    if (is_integral(v)) return Value(std::abs(to_int(v)));
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    fail_builtin("bad operand type for abs(): " + quoted_type(v));
  };
  t["float"] = filter_float;
  t["int"] = filter_int;
  t["round"] = [](const Value& v, const Args& a) {
    const int64_t precision = to_int(arg_or(a, 0, "precision", Value(int64_t{0})));
    const std::string method = py_str(arg_or(a, 1, "method", Value("common")));
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_number() * scale;
    double r;
    if (method == "common")
      r = std::nearbyint(x);
    else if (method == "ceil")
      r = std::ceil(x);
    else if (method == "floor")
      r = std::floor(x);
    else
      fail_builtin("method must be common, ceil or floor");
    return Value(r / scale);
  };
}

// Filters of a string (or of any value's py_str), and default.
void add_string_filters(FilterTable& t) {
  t["capitalize"] = [](const Value& v, const Args&) { return Value(py_capitalize(py_str(v))); };
  t["default"] = [](const Value& v, const Args& a) {
    const bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return arg_or(a, 0, "default_value", Value(""));
    return v;
  };
  t["d"] = t["default"];
  t["escape"] = [](const Value& v, const Args&) { return Value(html_escape(py_str(v))); };
  t["e"] = t["escape"];
  t["indent"] = filter_indent;
  t["lower"] = [](const Value& v, const Args&) { return Value(py_lower(py_str(v))); };
  t["upper"] = [](const Value& v, const Args&) { return Value(py_upper(py_str(v))); };
  t["title"] = [](const Value& v, const Args&) { return Value(py_title(py_str(v))); };
  t["replace"] = [](const Value& v, const Args& a) {
    const Value count = arg_or(a, 2, "count", Value(None{}));
    return Value(py_replace(py_str(v), py_str(arg_or(a, 0, "old", Value(""))),
                            py_str(arg_or(a, 1, "new", Value(""))),
                            count.is_none() ? -1 : to_int(count)));
  };
  t["safe"] = [](const Value& v, const Args&) { return v; };
  t["string"] = [](const Value& v, const Args&) { return Value(py_str(v)); };
  t["tojson"] = filter_tojson;
  t["trim"] = [](const Value& v, const Args& a) {
    return Value(py_strip(py_str(v), arg(a, 0, "chars"), true, true));
  };
  t["wordcount"] = [](const Value& v, const Args&) {
    return Value(static_cast<int64_t>(py_split(py_str(v), nullptr, -1, false).size()));
  };
}

// Filters of a sequence: items, first / last, join, list, map, reverse, select / reject.
void add_sequence_filters(FilterTable& t) {
  t["first"] = [](const Value& v, const Args&) {
    const List items = iterate(v);
    return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
  };
  t["last"] = [](const Value& v, const Args&) {
    const List items = iterate(v);
    return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
  };
  t["items"] = [](const Value& v, const Args&) {
    List out;
    if (v.is_undefined()) return Value(std::move(out));
    if (!v.is_mapping()) fail_builtin("Can only get item pairs from a mapping.");
    for (const auto& [k, item] : v.as_dict().items)
      out.push_back(Value::tuple(List{Value(k), item}));
    return Value(std::move(out));
  };
  t["join"] = [](const Value& v, const Args& a) {
    const std::string sep = py_str(arg_or(a, 0, "d", Value("")));
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += py_str(attribute && !attribute->is_none() ? get_path(item, py_str(*attribute)) : item);
    }
    return Value(out);
  };
  t["length"] = [](const Value& v, const Args&) { return Value(py_len(v)); };
  t["count"] = t["length"];
  t["list"] = [](const Value& v, const Args&) { return Value(iterate(v)); };
  t["map"] = [](const Value& v, const Args& a) {
    List out;
    const Value* attribute = arg(a, 99, "attribute");
    for (const auto& item : iterate(v)) {
      if (attribute) {
        Value x = get_path(item, py_str(*attribute));
        if (x.is_undefined()) x = arg_or(a, 99, "default", x);
        out.push_back(x);
      } else {
        if (a.positional.empty() || !a.positional[0].is_string())
          fail_builtin("map requires a filter name");
        out.push_back(apply_filter(a.positional[0].as_string(), item, tail_args(a, 1)));
      }
    }
    return Value(std::move(out));
  };
  t["reverse"] = [](const Value& v, const Args&) {
    if (v.is_string()) {
      auto cps = utf8_decode(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value(utf8_encode(cps));
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  };
  t["select"] = [](const Value& v, const Args& a) { return select_items(v, a, false, true); };
  t["reject"] = [](const Value& v, const Args& a) { return select_items(v, a, false, false); };
  t["selectattr"] = [](const Value& v, const Args& a) { return select_items(v, a, true, true); };
  t["rejectattr"] = [](const Value& v, const Args& a) { return select_items(v, a, true, false); };
}

// max, min, sort, sum, unique: a sequence compared or reduced.
void add_aggregate_filters(FilterTable& t) {
  t["max"] = [](const Value& v, const Args& a) {
    const List items = iterate(v);
    if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      if (less_or_fail_builtin(sort_key(items[best], a, 1), sort_key(items[i], a, 1))) best = i;
    }
    return items[best];
  };
  t["min"] = [](const Value& v, const Args& a) {
    const List items = iterate(v);
    if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      if (less_or_fail_builtin(sort_key(items[i], a, 1), sort_key(items[best], a, 1))) best = i;
    }
    return items[best];
  };
  t["sort"] = [](const Value& v, const Args& a) {
    List items = iterate(v);
    const bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less_or_fail_builtin(sort_key(y, a, 2), sort_key(x, a, 2))
                     : less_or_fail_builtin(sort_key(x, a, 2), sort_key(y, a, 2));
    });
    return Value(std::move(items));
  };
  t["sum"] = [](const Value& v, const Args& a) {
    const Value* attribute = arg(a, 0, "attribute");
    Value total = arg_or(a, 1, "start", Value(int64_t{0}));
    for (const auto& item : iterate(v)) {
      total =
          binary_op("+", total,
                    attribute && !attribute->is_none() ? get_path(item, py_str(*attribute)) : item);
    }
    return total;
  };
  t["unique"] = [](const Value& v, const Args& a) {
    List out, keys;
    for (const auto& item : iterate(v)) {
      const Value key = sort_key(item, a, 1);
      if (std::none_of(keys.begin(), keys.end(),
                       [&](const Value& k) { return py_equal(k, key); })) {
        keys.push_back(key);
        out.push_back(item);
      }
    }
    return Value(std::move(out));
  };
}

const FilterTable& filters() {
  static const FilterTable table = [] {
    FilterTable t;
    add_number_filters(t);
    add_string_filters(t);
    add_sequence_filters(t);
    add_aggregate_filters(t);
    return t;
  }();
  return table;
}

// ---- tests ----

using TestFn = std::function<bool(const Value&, const Args&)>;

const Value& test_arg(const Args& a) {
  if (a.positional.empty()) fail_builtin("test expects an argument");
  return a.positional[0];
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = [] {
    std::map<std::string, TestFn, std::less<>> t;
    t["defined"] = [](const Value& v, const Args&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const Args&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const Args&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, const Args&) { return v.is_bool(); };
    t["true"] = [](const Value& v, const Args&) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](const Value& v, const Args&) { return v.is_bool() && !v.as_bool(); };
    t["integer"] = [](const Value& v, const Args&) { return v.is_int(); };
    t["float"] = [](const Value& v, const Args&) { return v.is_float(); };
    t["number"] = [](const Value& v, const Args&) { return v.is_number(); };
    t["string"] = [](const Value& v, const Args&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const Args&) { return v.is_mapping(); };
    t["iterable"] = [](const Value& v, const Args&) {
      return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined();
    };
    t["sequence"] = [](const Value& v, const Args&) {
      return v.is_string() || v.is_list() || v.is_mapping();
    };
    t["callable"] = [](const Value& v, const Args&) {
      return v.is_callable() || v.is_undefined();  // jinja2's Undefined defines __call__
    };
    t["odd"] = [](const Value& v, const Args&) { return is_integral(v) && to_int(v) % 2 != 0; };
    t["even"] = [](const Value& v, const Args&) { return is_integral(v) && to_int(v) % 2 == 0; };
    t["divisibleby"] = [](const Value& v, const Args& a) {
      const int64_t d = to_int(test_arg(a));
      if (d == 0) fail_builtin("integer division or modulo by zero");
      return to_int(v) % d == 0;
    };
    t["lower"] = [](const Value& v, const Args&) { return py_lower(py_str(v)) == py_str(v); };
    t["upper"] = [](const Value& v, const Args&) { return py_upper(py_str(v)) == py_str(v); };
    t["sameas"] = [](const Value& v, const Args& a) {
      const Value& other = test_arg(a);
      if (v.is_dict() && other.is_dict()) return v.dict_ptr() == other.dict_ptr();
      if (v.is_list() || v.is_dict() || other.is_list() || other.is_dict()) return false;
      return v.type_name() == other.type_name() && py_equal(v, other);
    };
    t["eq"] = [](const Value& v, const Args& a) { return py_equal(v, test_arg(a)); };
    t["ne"] = [](const Value& v, const Args& a) { return !py_equal(v, test_arg(a)); };
    t["lt"] = [](const Value& v, const Args& a) {
      return binary_op("<", v, test_arg(a)).as_bool();
    };
    t["le"] = [](const Value& v, const Args& a) {
      return binary_op("<=", v, test_arg(a)).as_bool();
    };
    t["gt"] = [](const Value& v, const Args& a) {
      return binary_op(">", v, test_arg(a)).as_bool();
    };
    t["ge"] = [](const Value& v, const Args& a) {
      return binary_op(">=", v, test_arg(a)).as_bool();
    };
    t["in"] = [](const Value& v, const Args& a) {
      return binary_op("in", v, test_arg(a)).as_bool();
    };
    t["equalto"] = t["=="] = t["eq"];
    t["!="] = t["ne"];
    t["lessthan"] = t["<"] = t["lt"];
    t["<="] = t["le"];
    t["greaterthan"] = t[">"] = t["gt"];
    t[">="] = t["ge"];
    t["filter"] = [](const Value& v, const Args&) {
      return v.is_string() && has_filter(v.as_string());
    };
    t["test"] = [](const Value& v, const Args&) {
      return v.is_string() && has_test(v.as_string());
    };
    t["escaped"] = [](const Value&, const Args&) { return false; };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) > 0;
}
bool has_test(std::string_view name) {
  return tests().count(name) > 0;
}

Value apply_filter(const std::string& name, const Value& input, const Args& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail_builtin("No filter named '" + name + "'.");
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, const Args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail_builtin("No test named '" + name + "'.");
  return it->second(input, args);
}

}  // namespace hyserve::jinja
