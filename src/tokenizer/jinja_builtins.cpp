#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

#include "util/error.h"

namespace hyserve::jinja {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw BuiltinError(message);
}

void check_defined(const Value& v) {
  if (v.is_undefined()) fail(v.as_undefined().hint);
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
  if (v == nullptr || !v->is_string()) fail(str_cat(what, " expects a string argument"));
  return v->as_string();
}

// ---- strings (indexed in code points, as Python does) ----

std::string ascii_map(std::string s, int (*fn)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(fn(c));
  }
  return s;
}
std::string lower(const std::string& s) {
  return ascii_map(s, ::tolower);
}
std::string upper(const std::string& s) {
  return ascii_map(s, ::toupper);
}

std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80)
    out[0] = static_cast<char>(::toupper(out[0]));
  return out;
}

// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    const bool letter = u >= 0x80 || std::isalpha(u);
    if (u < 0x80 && std::isalpha(u))
      c = static_cast<char>(prev_letter ? ::tolower(u) : ::toupper(u));
    prev_letter = letter;
  }
  return out;
}

// Python str.strip / lstrip / rstrip: whitespace, or any of `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) {
    if (!chars->is_string()) fail("strip arg must be None or str");
    set = utf8_decode(chars->as_string());
  }
  auto strippable = [&](char32_t cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strippable(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strippable(cps[e - 1])) --e;
  }
  return utf8_encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
}

// Python str.split / rsplit.
List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  if (sep == nullptr || sep->is_none()) {
    auto cps = utf8_decode(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    std::vector<std::vector<char32_t>> parts;
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_py_space(cps[e - 1])) --e;
        parts.emplace_back(cps.begin() + i, cps.begin() + e);
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      parts.emplace_back(cps.begin() + i, cps.begin() + j);
      i = j;
    }
    if (from_right) {
      std::reverse(parts.begin(), parts.end());
      for (auto& p : parts) std::reverse(p.begin(), p.end());
    }
    for (auto& p : parts) out.push_back(Value(utf8_encode(p)));
    return out;
  }
  if (!sep->is_string()) fail("must be str or None, not " + sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      const size_t p = s.find(d, start);
      if (p == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
      parts.push_back(s.substr(start, p - start));
      start = p + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (true) {
      if (end < d.size() || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
      const size_t p = s.rfind(d, end - d.size());
      if (p == std::string::npos) break;
      parts.push_back(s.substr(p + d.size(), end - p - d.size()));
      end = p;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value(std::move(p)));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    const auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + with;
    start = p + old.size();
    ++done;
  }
  return out + s.substr(start);
}

// startswith / endswith with a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail("startswith/endswith arg must be str or a tuple of str");
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const auto& a : affix.as_list()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

int64_t py_len(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(utf8_decode(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  fail("object of type " + quoted_type(v) + " has no len()");
}

// ---- methods ----

Value bound(std::function<Value(const Args&)> fn) {
  return Value(Function(std::move(fn)));
}

Value string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bound([s, prefix](const Args& a) {
      const Value* affix = arg(a, 0, "prefix");
      if (affix == nullptr) fail("startswith/endswith takes at least 1 argument");
      return Value(affix_match(s, *affix, prefix));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bound([s, left, right](const Args& a) {
      return Value(strip(s, arg(a, 0, "chars"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return bound([s, from_right](const Args& a) {
      const Value max = arg_or(a, 1, "maxsplit", Value(int64_t{-1}));
      return Value(split(s, arg(a, 0, "sep"), to_int(max), from_right));
    });
  }
  if (name == "replace") {
    return bound([s](const Args& a) {
      const Value count = arg_or(a, 2, "count", Value(int64_t{-1}));
      return Value(replace(s, string_arg(a, 0, "old", "replace"),
                           string_arg(a, 1, "new", "replace"), to_int(count)));
    });
  }
  if (name == "upper") return bound([s](const Args&) { return Value(upper(s)); });
  if (name == "lower") return bound([s](const Args&) { return Value(lower(s)); });
  if (name == "title") return bound([s](const Args&) { return Value(title(s)); });
  if (name == "capitalize") return bound([s](const Args&) { return Value(capitalize(s)); });
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
      if (items == nullptr) fail("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(*items)) {
        if (!item.is_string())
          fail("sequence item: expected str instance, " + item.type_name() + " found");
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
      if (key == nullptr) fail("get expected at least 1 argument, got 0");
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

// ---- filters ----

// jinja2's make_attrgetter: "a.b.0" reads item a, then b, then index 0.
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
  if (test && !test->is_string()) fail("test name must be a string");
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
    key = Value(lower(key.as_string()));
  return key;
}

bool less_or_fail(const Value& a, const Value& b) {
  const auto less = py_less(a, b);
  if (!less)
    fail("'<' not supported between instances of " + quoted_type(a) + " and " + quoted_type(b));
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
      fail("indent must be an int or a string");
    }
  }
  if (const Value* v = arg(args, 2, "separators"); v && !v->is_none()) {
    if (!v->is_list() || v->as_list().size() != 2 || !v->as_list()[0].is_string() ||
        !v->as_list()[1].is_string()) {
      fail("separators must be a pair of strings");
    }
    o.separators = std::make_pair(v->as_list()[0].as_string(), v->as_list()[1].as_string());
  }
  if (const Value* v = arg(args, 3, "sort_keys")) o.sort_keys = v->truthy();
  try {
    return Value(json_dumps(input, o));
  } catch (const std::invalid_argument& e) {
    fail(e.what());
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
    const std::string s = strip(input.as_string(), nullptr, true, true);
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
    const std::string s = strip(input.as_string(), nullptr, true, true);
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

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = [] {
    std::map<std::string, FilterFn, std::less<>> t;
    t["abs"] = [](const Value& v, const Args&) {
      if (is_integral(v)) return Value(std::abs(to_int(v)));
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      fail("bad operand type for abs(): " + quoted_type(v));
    };
    t["capitalize"] = [](const Value& v, const Args&) { return Value(capitalize(py_str(v))); };
    t["default"] = [](const Value& v, const Args& a) {
      const bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy()))
        return arg_or(a, 0, "default_value", Value(""));
      return v;
    };
    t["d"] = t["default"];
    t["escape"] = [](const Value& v, const Args&) { return Value(html_escape(py_str(v))); };
    t["e"] = t["escape"];
    t["first"] = [](const Value& v, const Args&) {
      const List items = iterate(v);
      return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
    };
    t["last"] = [](const Value& v, const Args&) {
      const List items = iterate(v);
      return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
    };
    t["float"] = filter_float;
    t["int"] = filter_int;
    t["indent"] = filter_indent;
    t["items"] = [](const Value& v, const Args&) {
      List out;
      if (v.is_undefined()) return Value(std::move(out));
      if (!v.is_mapping()) fail("Can only get item pairs from a mapping.");
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
        out +=
            py_str(attribute && !attribute->is_none() ? get_path(item, py_str(*attribute)) : item);
      }
      return Value(out);
    };
    t["length"] = [](const Value& v, const Args&) { return Value(py_len(v)); };
    t["count"] = t["length"];
    t["list"] = [](const Value& v, const Args&) { return Value(iterate(v)); };
    t["lower"] = [](const Value& v, const Args&) { return Value(lower(py_str(v))); };
    t["upper"] = [](const Value& v, const Args&) { return Value(upper(py_str(v))); };
    t["title"] = [](const Value& v, const Args&) { return Value(title(py_str(v))); };
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
            fail("map requires a filter name");
          out.push_back(apply_filter(a.positional[0].as_string(), item, tail_args(a, 1)));
        }
      }
      return Value(std::move(out));
    };
    t["max"] = [](const Value& v, const Args& a) {
      const List items = iterate(v);
      if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
      size_t best = 0;
      for (size_t i = 1; i < items.size(); ++i) {
        if (less_or_fail(sort_key(items[best], a, 1), sort_key(items[i], a, 1))) best = i;
      }
      return items[best];
    };
    t["min"] = [](const Value& v, const Args& a) {
      const List items = iterate(v);
      if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
      size_t best = 0;
      for (size_t i = 1; i < items.size(); ++i) {
        if (less_or_fail(sort_key(items[i], a, 1), sort_key(items[best], a, 1))) best = i;
      }
      return items[best];
    };
    t["replace"] = [](const Value& v, const Args& a) {
      const Value count = arg_or(a, 2, "count", Value(None{}));
      return Value(replace(py_str(v), py_str(arg_or(a, 0, "old", Value(""))),
                           py_str(arg_or(a, 1, "new", Value(""))),
                           count.is_none() ? -1 : to_int(count)));
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
        fail("method must be common, ceil or floor");
      return Value(r / scale);
    };
    t["safe"] = [](const Value& v, const Args&) { return v; };
    t["select"] = [](const Value& v, const Args& a) { return select_items(v, a, false, true); };
    t["reject"] = [](const Value& v, const Args& a) { return select_items(v, a, false, false); };
    t["selectattr"] = [](const Value& v, const Args& a) { return select_items(v, a, true, true); };
    t["rejectattr"] = [](const Value& v, const Args& a) { return select_items(v, a, true, false); };
    t["sort"] = [](const Value& v, const Args& a) {
      List items = iterate(v);
      const bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return reverse ? less_or_fail(sort_key(y, a, 2), sort_key(x, a, 2))
                       : less_or_fail(sort_key(x, a, 2), sort_key(y, a, 2));
      });
      return Value(std::move(items));
    };
    t["string"] = [](const Value& v, const Args&) { return Value(py_str(v)); };
    t["sum"] = [](const Value& v, const Args& a) {
      const Value* attribute = arg(a, 0, "attribute");
      Value total = arg_or(a, 1, "start", Value(int64_t{0}));
      for (const auto& item : iterate(v)) {
        total = binary_op(
            "+", total,
            attribute && !attribute->is_none() ? get_path(item, py_str(*attribute)) : item);
      }
      return total;
    };
    t["tojson"] = filter_tojson;
    t["trim"] = [](const Value& v, const Args& a) {
      return Value(strip(py_str(v), arg(a, 0, "chars"), true, true));
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
    t["wordcount"] = [](const Value& v, const Args&) {
      return Value(static_cast<int64_t>(split(py_str(v), nullptr, -1, false).size()));
    };
    return t;
  }();
  return table;
}

// ---- tests ----

using TestFn = std::function<bool(const Value&, const Args&)>;

const Value& test_arg(const Args& a) {
  if (a.positional.empty()) fail("test expects an argument");
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
      if (d == 0) fail("integer division or modulo by zero");
      return to_int(v) % d == 0;
    };
    t["lower"] = [](const Value& v, const Args&) { return lower(py_str(v)) == py_str(v); };
    t["upper"] = [](const Value& v, const Args&) { return upper(py_str(v)) == py_str(v); };
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

// Python's floor division and modulo on integers.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + op + ": " + quoted_type(a) + " and " + quoted_type(b));
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
      fail("can only concatenate str (not \"" + b.type_name() + "\") to str");
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
  if (op == "%" && a.is_string()) fail("string formatting with % is not supported");
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  const bool ints = is_integral(a) && is_integral(b);
  if (op == "/") {
    if (b.as_number() == 0) fail("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (ints) {
    const int64_t x = to_int(a), y = to_int(b);
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) fail("integer division or modulo by zero");
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
  if (y == 0) fail("float division by zero");
  const double q = std::floor(x / y);
  if (op == "//") return Value(q);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value(m);
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string())
      fail("'in <string>' requires string as left operand, not " + needle.type_name());
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
  fail("argument of type " + quoted_type(haystack) + " is not iterable");
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
  if (it == filters().end()) fail("No filter named '" + name + "'.");
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, const Args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail("No test named '" + name + "'.");
  return it->second(input, args);
}

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
      fail("'" + op + "' not supported between instances of " + quoted_type(a) + " and " +
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
  fail("bad operand type for unary " + op + ": " + quoted_type(a));
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
        const Value& x = test_arg(a);
        const List& items = obj.as_list();
        int64_t n = 0;
        for (size_t i = 0; i < items.size(); ++i) {
          if (!py_equal(items[i], x)) continue;
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") fail(py_repr(x) + " is not in list");
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
  if (!obj.is_list() && !obj.is_string()) fail(quoted_type(obj) + " object is not subscriptable");
  auto bound_of = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!is_integral(v)) fail(str_cat("slice ", what, " must be an integer or None"));
    return to_int(v);
  };
  const int64_t n = py_len(obj);
  const int64_t s = bound_of(step, "step").value_or(1);
  if (s == 0) fail("slice step cannot be zero");
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
  fail(quoted_type(v) + " object is not iterable");
}

Dict default_globals() {
  constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
  Dict g;
  g.set("raise_exception", Value(Function([](const Args& a) -> Value {
          fail(a.positional.empty() ? std::string() : py_str(a.positional[0]));
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
      if (!p.is_mapping()) fail("expected a mapping as positional argument");
      for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    return Value(d);
  };
  g.set("namespace", Value(Function([make_dict](const Args& a) {
          for (const auto& [k, v] : a.keyword) {
            if (!k.empty() && k[0] == '_')
              fail(
                  "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                  "got '" +
                  k + "'. Please rename the attribute.");
          }
          return make_dict(a, true);
        })));
  g.set("dict", Value(Function([make_dict](const Args& a) { return make_dict(a, false); })));
  g.set("range", Value(Function([](const Args& a) {
          if (a.positional.empty() || a.positional.size() > 3)
            fail("range expected 1 to 3 arguments");
          for (const auto& p : a.positional) {
            if (!is_integral(p))
              fail(quoted_type(p) + " object cannot be interpreted as an integer");
          }
          const bool one = a.positional.size() == 1;
          const int64_t start = one ? 0 : to_int(a.positional[0]);
          const int64_t stop = one ? to_int(a.positional[0]) : to_int(a.positional[1]);
          const int64_t step = a.positional.size() == 3 ? to_int(a.positional[2]) : 1;
          if (step == 0) fail("range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (static_cast<int64_t>(out.size()) >= kMaxRange) {
              fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            }
            out.push_back(Value(i));
          }
          return Value(std::move(out));
        })));
  return g;
}

}  // namespace hyserve::jinja
