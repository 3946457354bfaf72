#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace hyserve::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

namespace {

template <typename Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value(None{});
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List list;
      for (const auto& item : j) list.push_back(value_from_json(item));
      return Value(std::move(list));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = j.begin(); it != j.end(); ++it)
        dict.set(it.key(), value_from_json(it.value()));
      return Value(std::move(dict));
    }
    default:
      throw std::invalid_argument("JSON value of this type cannot be passed to a template");
  }
}

}  // namespace

Value Value::tuple(List l) {
  Value v(std::move(l));
  v.is_tuple_ = true;
  return v;
}

Value Value::from_json(const nlohmann::json& j) {
  return value_from_json(j);
}
Value Value::from_json(const nlohmann::ordered_json& j) {
  return value_from_json(j);
}

double Value::as_number() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !as_list().empty();
  if (is_dict()) return is_namespace() || !as_dict().items.empty();
  return true;
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return is_tuple() ? "tuple" : "list";
  if (is_namespace()) return "Namespace";
  if (is_dict()) return "dict";
  return "function";
}

// ---- UTF-8 ----

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 1;
    char32_t cp = c;
    if (c >= 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else if (c >= 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xC0) {
      len = 2;
      cp = c & 0x1F;
    }
    if (i + len > s.size()) len = 1;  // truncated sequence: keep the byte as is
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(len == 1 ? char32_t(c) : cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) utf8_append(out, cp);
  return out;
}

bool is_py_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- str / repr ----

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const auto e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

namespace {

// Python's str.isprintable() for non-ASCII code points, for the common categories that
// are not printable (Zs, Zl, Zp, Cc, Cf, Co, Cs); unassigned code points are not known.
bool is_py_printable(char32_t cp) {
  if (cp < 0xA1 || cp == 0xAD) return false;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F) return false;
  if (cp == 0x1680 || cp == 0x180E || (cp >= 0x2000 && cp <= 0x200F)) return false;
  if ((cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000) {
    return false;
  }
  if ((cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB))
    return false;
  if (cp == 0xFFFE || cp == 0xFFFF || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F)) {
    return false;
  }
  return cp < 0xF0000;
}

void append_hex(std::string& out, const char* prefix, char32_t cp, int width) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s%0*x", prefix, width, static_cast<unsigned>(cp));
  out += buf;
}

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : utf8_decode(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp < 0x7F || is_py_printable(cp)) {
      utf8_append(out, cp);
    } else if (cp <= 0xFF) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp <= 0xFFFF) {
      append_hex(out, "\\u", cp, 4);
    } else {
      append_hex(out, "\\U", cp, 8);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string py_repr(const Value& v) {
  if (v.is_string()) return repr_string(v.as_string());
  if (v.is_list()) {
    std::string out = v.is_tuple() ? "(" : "[";
    const auto& list = v.as_list();
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += ", ";
      out += py_repr(list[i]);
    }
    if (v.is_tuple()) return out + (list.size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (v.is_namespace()) {
    std::string out = "<Namespace {";
    bool first = true;
    for (const auto& [k, item] : v.as_dict().items) {
      if (!first) out += ", ";
      first = false;
      out += repr_string(k) + ": " + py_repr(item);
    }
    return out + "}>";
  }
  if (v.is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, item] : v.as_dict().items) {
      if (!first) out += ", ";
      first = false;
      out += repr_string(k) + ": " + py_repr(item);
    }
    return out + "}";
  }
  return py_str(v);
}

std::string py_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return py_float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_callable()) return "<function>";
  return py_repr(v);
}

// ---- comparison ----

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    const int64_t x = a.is_int() ? a.as_int() : int64_t(a.as_bool());
    const int64_t y = b.is_int() ? b.as_int() : int64_t(b.as_bool());
    return x == y;
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    if (a.is_tuple() != b.is_tuple() || x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!py_equal(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_mapping() && b.is_mapping()) {
    const auto& x = a.as_dict().items;
    if (x.size() != b.as_dict().items.size()) return false;
    for (const auto& [k, item] : x) {
      const Value* other = b.as_dict().find(k);
      if (other == nullptr || !py_equal(item, *other)) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) return a.dict_ptr() == b.dict_ptr();
  return false;
}

std::optional<bool> py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_number() < b.as_number();
    const int64_t x = a.is_int() ? a.as_int() : int64_t(a.as_bool());
    const int64_t y = b.is_int() ? b.as_int() : int64_t(b.as_bool());
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return std::nullopt;
}

// ---- json.dumps ----

namespace {

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        append_hex(out, "\\u", 0xD800 | (v >> 10), 4);
        append_hex(out, "\\u", 0xDC00 | (v & 0x3FF), 4);
      } else {
        append_hex(out, "\\u", cp, 4);
      }
    } else {
      utf8_append(out, cp);
    }
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const JsonOptions& o, const std::string& item_sep,
          const std::string& key_sep, int level) {
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    if (std::isnan(d)) {
      out += "NaN";
    } else if (std::isinf(d)) {
      out += d > 0 ? "Infinity" : "-Infinity";
    } else {
      out += py_float_repr(d);
    }
  } else if (v.is_string()) {
    dump_string(out, v.as_string(), o.ensure_ascii);
  } else if (v.is_list() || v.is_mapping()) {
    const bool is_list = v.is_list();
    const size_t size = is_list ? v.as_list().size() : v.as_dict().items.size();
    const char open = is_list ? '[' : '{';
    const char close = is_list ? ']' : '}';
    if (size == 0) {
      out += open;
      out += close;
      return;
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    if (!is_list) {
      for (const auto& entry : v.as_dict().items) entries.push_back(&entry);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
    }
    std::string newline;
    if (o.indent) {
      newline = "\n";
      for (int i = 0; i <= level; ++i) newline += *o.indent;
    }
    out += open;
    for (size_t i = 0; i < size; ++i) {
      if (i > 0) out += item_sep;
      out += newline;
      if (is_list) {
        dump(out, v.as_list()[i], o, item_sep, key_sep, level + 1);
      } else {
        dump_string(out, entries[i]->first, o.ensure_ascii);
        out += key_sep;
        dump(out, entries[i]->second, o, item_sep, key_sep, level + 1);
      }
    }
    if (o.indent) {
      out += "\n";
      for (int i = 0; i < level; ++i) out += *o.indent;
    }
    out += close;
  } else {
    throw std::invalid_argument("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& options) {
  std::string item_sep = options.indent ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first;
    key_sep = options.separators->second;
  }
  std::string out;
  dump(out, v, options, item_sep, key_sep, 0);
  return out;
}

}  // namespace hyserve::jinja
