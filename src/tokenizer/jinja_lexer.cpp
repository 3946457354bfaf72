#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "tokenizer/jinja_value.h"

namespace hyserve::jinja {

TemplateError::TemplateError(const std::string& message, int line, int column)
    : Error(message + " (line " + std::to_string(line) + ", column " + std::to_string(column) +
            ")"),
      message_(message),
      line_(line),
      column_(column) {}

namespace {

// "\r\n" and "\r" become "\n"; a single trailing newline is dropped (keep_trailing_newline
// is False in transformers' environment).
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Length in bytes of the UTF-8 code point starting at s[pos] when it is whitespace
// (Python's \s), else 0.
size_t space_length(const std::string& s, size_t pos) {
  const auto c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return is_py_space(c) ? 1 : 0;
  const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  const auto cps = utf8_decode(std::string_view(s).substr(pos, len));
  return !cps.empty() && is_py_space(cps[0]) ? len : 0;
}

size_t skip_spaces(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    const size_t len = space_length(s, pos);
    if (len == 0) break;
    pos += len;
  }
  return pos;
}

std::string rstrip_spaces(const std::string& s) {
  auto cps = utf8_decode(s);
  while (!cps.empty() && is_py_space(cps.back())) cps.pop_back();
  return utf8_encode(cps);
}

bool all_spaces(const std::string& s) {
  for (char32_t cp : utf8_decode(s)) {
    if (!is_py_space(cp)) return false;
  }
  return !s.empty();
}

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit(TokenKind::kText, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                            ? src_[tag + 2]
                            : '\0';
      std::string text = src_.substr(pos, tag - pos);
      if (sign == '-') {
        text = rstrip_spaces(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the indentation before a block or comment tag.
        const size_t line_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_pos > 0 || line_starting) && all_spaces(text.substr(line_pos))) {
          text.resize(line_pos);
        }
      }
      if (!text.empty()) emit(TokenKind::kText, text, pos);
      const size_t body = tag + 2 + (sign ? 1 : 0);
      size_t end;
      if (kind == '#') {
        end = lex_comment(tag, body);
      } else if (kind == '%' && is_raw_begin(body, &end)) {
        end = lex_raw(tag, end);
      } else {
        end = lex_tag(tag, body, kind == '{');
      }
      line_starting = src_[end - 1] == '\n';
      pos = end;
    }
    tokens_.push_back({TokenKind::kEnd, "", line_of(src_.size()), column_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Matches the end of a block or comment tag at `pos` ("+%}", "-%}" + spaces, "%}" + one
  // newline); returns the position after it, or npos.
  size_t match_block_end(size_t pos, char close) const {
    auto at = [&](size_t p, char a, char b) {
      return p + 1 < src_.size() && src_[p] == a && src_[p + 1] == b;
    };
    if (pos < src_.size() && src_[pos] == '+' && at(pos + 1, close, '}')) return pos + 3;
    if (pos < src_.size() && src_[pos] == '-' && at(pos + 1, close, '}')) {
      return skip_spaces(src_, pos + 3);
    }
    if (at(pos, close, '}')) {
      return pos + 2 < src_.size() && src_[pos + 2] == '\n' ? pos + 3 : pos + 2;
    }
    return std::string::npos;
  }

  size_t lex_comment(size_t tag, size_t body) {
    for (size_t i = body; i < src_.size(); ++i) {
      const size_t end = match_block_end(i, '#');
      if (end != std::string::npos) return end;
    }
    fail("Missing end of comment tag", tag);
  }

  // `{% raw %}` (with optional whitespace control): sets *end after its closing "%}".
  bool is_raw_begin(size_t body, size_t* end) const {
    size_t p = skip_spaces(src_, body);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_spaces(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *end = skip_spaces(src_, p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t tag, size_t pos) {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t p = i + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : '\0';
      if (sign) ++p;
      p = skip_spaces(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      const size_t end = match_block_end(skip_spaces(src_, p + 6), '%');
      if (end == std::string::npos) continue;
      std::string text = src_.substr(pos, i - pos);
      if (sign == '-') {
        text = rstrip_spaces(text);
      } else if (sign != '+') {
        const size_t line_pos = text.rfind('\n') + 1;
        if (line_pos > 0 && all_spaces(text.substr(line_pos))) text.resize(line_pos);
      }
      if (!text.empty()) emit(TokenKind::kText, text, pos);
      return end;
    }
    fail("Missing end of raw directive", tag);
  }

  size_t lex_tag(size_t tag, size_t pos, bool is_var) {
    emit(is_var ? TokenKind::kVarBegin : TokenKind::kBlockBegin, is_var ? "{{" : "{%", tag);
    std::vector<char> balance;
    while (true) {
      pos = skip_spaces(src_, pos);
      if (pos >= src_.size()) fail("unexpected end of template, expected end of tag", pos);
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (is_var) {
          if (src_.compare(pos, 3, "-}}") == 0) end = skip_spaces(src_, pos + 3);
          if (src_.compare(pos, 2, "}}") == 0) end = pos + 2;
        } else {
          end = match_block_end(pos, '%');
        }
        if (end != std::string::npos) {
          emit(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", pos);
          return end;
        }
      }
      const char c = src_[pos];
      if (is_digit(c)) {
        // After a dot (`items.0`) only an integer: jinja2's float rule has (?<!\.).
        pos = lex_number(pos, pos > 0 && src_[pos - 1] == '.');
      } else if (is_name_start(c)) {
        size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        emit(TokenKind::kName, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, balance);
      }
    }
  }

  size_t lex_number(size_t pos, bool integer_only) {
    size_t end = pos;
    while (end < src_.size() && is_digit(src_[end])) ++end;
    bool is_float = false;
    if (integer_only) {
      emit(TokenKind::kInt, src_.substr(pos, end - pos), pos);
      return end;
    }
    if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      is_float = true;
      ++end;
      while (end < src_.size() && is_digit(src_[end])) ++end;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t p = end + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        is_float = true;
        while (p < src_.size() && is_digit(src_[p])) ++p;
        end = p;
      }
    }
    emit(is_float ? TokenKind::kFloat : TokenKind::kInt, src_.substr(pos, end - pos), pos);
    return end;
  }

  // A quoted string; escapes are decoded as Python's "unicode-escape" codec does.
  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) fail("unexpected end of string", pos);
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail("unexpected end of string", pos);
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < digits; ++k, ++i) {
            if (i >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[i]))) {
              fail("truncated \\" + std::string(1, e) + " escape in string", pos);
            }
            cp = cp * 16 + std::stoi(std::string(1, src_[i]), nullptr, 16);
          }
          utf8_append(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + (src_[i++] - '0');
            }
            utf8_append(value, cp);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    emit(TokenKind::kString, value, pos);
    return i + 1;
  }

  size_t lex_operator(size_t pos, std::vector<char>& balance) {
    static const char* kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) {
        emit(TokenKind::kOperator, op, pos);
        return pos + 2;
      }
    }
    const char c = src_[pos];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      fail(str_cat("unexpected char '", c, "'"), pos);
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(str_cat("unexpected '", c, "'"), pos);
      if (balance.back() != c)
        fail(str_cat("unexpected '", c, "', expected '", balance.back(), "'"), pos);
      balance.pop_back();
    }
    emit(TokenKind::kOperator, std::string(1, c), pos);
    return pos + 1;
  }

  int line_of(size_t pos) const {
    return 1 + static_cast<int>(std::count(src_.begin(), src_.begin() + pos, '\n'));
  }
  int column_of(size_t pos) const {
    const size_t nl = pos == 0 ? std::string::npos : src_.rfind('\n', pos - 1);
    return static_cast<int>(pos - (nl == std::string::npos ? 0 : nl + 1)) + 1;
  }

  void emit(TokenKind kind, std::string value, size_t pos) {
    // Lines are counted incrementally: tokens arrive in source order.
    line_ += static_cast<int>(std::count(src_.begin() + line_pos_, src_.begin() + pos, '\n'));
    line_pos_ = pos;
    tokens_.push_back({kind, std::move(value), line_, column_of(pos)});
  }

  [[noreturn]] void fail(const std::string& message, size_t pos) const {
    throw TemplateError(message, line_of(pos), column_of(pos));
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_pos_ = 0;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace hyserve::jinja
