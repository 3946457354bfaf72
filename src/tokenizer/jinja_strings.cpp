#include "tokenizer/jinja_strings.h"

#include <algorithm>
#include <cctype>

#include "tokenizer/jinja_builtins.h"

namespace hyserve::jinja {
namespace {

std::string ascii_map(std::string s, int (*fn)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(fn(c));
  }
  return s;
}

}  // namespace

std::string py_lower(const std::string& s) {
  return ascii_map(s, ::tolower);
}
std::string py_upper(const std::string& s) {
  return ascii_map(s, ::toupper);
}

std::string py_capitalize(const std::string& s) {
  std::string out = py_lower(s);
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80)
    out[0] = static_cast<char>(::toupper(out[0]));
  return out;
}

// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string py_title(const std::string& s) {
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
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) {
    if (!chars->is_string()) fail_builtin("strip arg must be None or str");
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
List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
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
  if (!sep->is_string()) fail_builtin("must be str or None, not " + sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) fail_builtin("empty separator");
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

std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
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
bool py_affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail_builtin("startswith/endswith arg must be str or a tuple of str");
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

}  // namespace hyserve::jinja
