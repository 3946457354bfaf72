// DSML tool-call parsing; see deepseek_v32_tool_parser.h for the format and the contract.
#include "tokenizer/deepseek_v32_tool_parser.h"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "tokenizer/deepseek_v32_encoding.h"

namespace hyserve {
namespace {

// Longest name (function or parameter) held back while its closing quote is awaited.
constexpr size_t kMaxNameBytes = 256;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// True when `text` is a proper prefix of `marker` (more bytes may complete it).
bool is_partial(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

// Length of the longest proper suffix of `text` that is a prefix of `marker`.
size_t partial_marker_length(std::string_view text, std::string_view marker) {
  const size_t max_len = std::min(text.size(), marker.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

// The inside of a JSON string literal as Python's json.dumps(ensure_ascii=False) writes it.
// Byte-wise, so a piece split inside a UTF-8 character escapes the same as the whole.
std::string json_escape(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xF];
          out += kHex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string new_call_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 0xF];
  return id;
}

// A left-to-right matcher of one tag at the start of `buf`.
class TagMatcher {
 public:
  using Match = int;  // 0 yes, 1 no, 2 need more (mirrors the parser's enum)
  explicit TagMatcher(std::string_view buf) : buf_(buf) {}

  Match literal(std::string_view s) {
    const size_t n = std::min(s.size(), buf_.size() - pos_);
    if (buf_.substr(pos_, n) != s.substr(0, n)) return kNo;
    if (n < s.size()) return kNeedMore;
    pos_ += n;
    return kYes;
  }
  // At least `min` whitespace characters, and a byte after them.
  Match spaces(size_t min) {
    const size_t start = pos_;
    while (pos_ < buf_.size() && is_space(buf_[pos_])) ++pos_;
    if (pos_ == buf_.size()) return kNeedMore;
    return pos_ - start >= min ? kYes : kNo;
  }
  // A quoted name's text up to the closing quote (consumed).
  Match name(std::string& out) {
    const size_t quote = buf_.find('"', pos_);
    if (quote == std::string_view::npos) {
      return buf_.size() - pos_ > kMaxNameBytes ? kNo : kNeedMore;
    }
    const std::string_view text = buf_.substr(pos_, quote - pos_);
    if (text.empty() || text.size() > kMaxNameBytes ||
        text.find_first_of("<>\n") != std::string_view::npos) {
      return kNo;
    }
    out = std::string(text);
    pos_ = quote + 1;
    return kYes;
  }
  size_t pos() const { return pos_; }

  static constexpr Match kYes = 0, kNo = 1, kNeedMore = 2;

 private:
  std::string_view buf_;
  size_t pos_ = 0;
};

}  // namespace

namespace {

DeepSeekV32ToolCallStreamParser::Match to_match(int r) {
  using Match = DeepSeekV32ToolCallStreamParser::Match;
  return r == TagMatcher::kYes ? Match::kYes : r == TagMatcher::kNo ? Match::kNo : Match::kNeedMore;
}

}  // namespace

// <｜DSML｜invoke name="NAME">, whitespace allowed around the attribute.
DeepSeekV32ToolCallStreamParser::Match DeepSeekV32ToolCallStreamParser::match_invoke(
    std::string& name, size_t& length) const {
  TagMatcher m(buffer_);
  int r = TagMatcher::kYes;
  if ((r = m.literal(kDsmlInvokeBegin)) != TagMatcher::kYes ||
      (r = m.spaces(1)) != TagMatcher::kYes || (r = m.literal("name=\"")) != TagMatcher::kYes ||
      (r = m.name(name)) != TagMatcher::kYes || (r = m.spaces(0)) != TagMatcher::kYes ||
      (r = m.literal(">")) != TagMatcher::kYes) {
    return to_match(r);
  }
  length = m.pos();
  return Match::kYes;
}

// <｜DSML｜parameter name="NAME" string="true|false">
DeepSeekV32ToolCallStreamParser::Match DeepSeekV32ToolCallStreamParser::match_parameter(
    std::string& name, bool& is_string, size_t& length) const {
  TagMatcher m(buffer_);
  int r = TagMatcher::kYes;
  if ((r = m.literal(kDsmlParameterBegin)) != TagMatcher::kYes ||
      (r = m.spaces(1)) != TagMatcher::kYes || (r = m.literal("name=\"")) != TagMatcher::kYes ||
      (r = m.name(name)) != TagMatcher::kYes || (r = m.spaces(1)) != TagMatcher::kYes ||
      (r = m.literal("string=\"")) != TagMatcher::kYes) {
    return to_match(r);
  }
  TagMatcher yes = m, no = m;
  const int r_true = yes.literal("true\"");
  const int r_false = no.literal("false\"");
  if (r_true == TagMatcher::kYes) {
    is_string = true;
    m = yes;
  } else if (r_false == TagMatcher::kYes) {
    is_string = false;
    m = no;
  } else {
    return r_true == TagMatcher::kNeedMore || r_false == TagMatcher::kNeedMore ? Match::kNeedMore
                                                                               : Match::kNo;
  }
  if ((r = m.spaces(0)) != TagMatcher::kYes || (r = m.literal(">")) != TagMatcher::kYes) {
    return to_match(r);
  }
  length = m.pos();
  return Match::kYes;
}

ToolParserDelta DeepSeekV32ToolCallStreamParser::feed(std::string_view delta) {
  buffer_.append(delta);
  ToolParserDelta out;
  step(out);
  return out;
}

void DeepSeekV32ToolCallStreamParser::give_up(ToolParserDelta& out) {
  out.content += held_;
  held_.clear();
  state_ = State::kContent;
}

void DeepSeekV32ToolCallStreamParser::begin_call(ToolParserDelta& out, std::string name) {
  current_ = ToolCall{new_call_id(), std::move(name), ""};
  has_parameter_ = false;
  ToolCallDelta header;
  header.index = num_started_++;
  header.id = current_.id;
  header.name = current_.name;
  out.tool_calls.push_back(std::move(header));
}

void DeepSeekV32ToolCallStreamParser::add_arguments(ToolParserDelta& out, std::string_view text) {
  if (text.empty()) return;
  current_.arguments.append(text);
  out.append_arguments(num_started_ - 1, text);
}

void DeepSeekV32ToolCallStreamParser::end_value(ToolParserDelta& out, std::string_view raw) {
  if (value_is_string_) {
    add_arguments(out, json_escape(raw) + "\"");
    return;
  }
  value_.append(raw);
  const std::string_view value = trim(value_);
  if (!value.empty() && nlohmann::json::accept(value)) {
    add_arguments(out, value);
  } else {
    add_arguments(out, "\"" + json_escape(value_) + "\"");
  }
  value_.clear();
}

// Advances the state machine over buffer_ as far as the received bytes allow.
void DeepSeekV32ToolCallStreamParser::step(ToolParserDelta& out) {
  for (;;) {
    const std::string_view buf = buffer_;
    switch (state_) {
      case State::kContent: {
        const size_t pos = buf.find(kDsmlFunctionCallsBegin);
        if (pos != std::string_view::npos) {
          out.content.append(buf.substr(0, pos));
          held_ = std::string(kDsmlFunctionCallsBegin);
          buffer_.erase(0, pos + kDsmlFunctionCallsBegin.size());
          block_has_call_ = false;
          state_ = State::kBlock;
          continue;
        }
        const size_t keep = partial_marker_length(buf, kDsmlFunctionCallsBegin);
        out.content.append(buf.substr(0, buf.size() - keep));
        buffer_.erase(0, buf.size() - keep);
        return;
      }
      case State::kBlock: {
        size_t ws = 0;
        while (ws < buf.size() && is_space(buf[ws])) ++ws;
        if (ws > 0) {
          held_.append(buf.substr(0, ws));
          buffer_.erase(0, ws);
          continue;
        }
        if (buf.empty()) return;
        if (buf.starts_with(kDsmlFunctionCallsEnd)) {
          buffer_.erase(0, kDsmlFunctionCallsEnd.size());
          held_.clear();
          state_ = State::kContent;
          continue;
        }
        if (is_partial(buf, kDsmlFunctionCallsEnd)) return;
        std::string name;
        size_t length = 0;
        const Match m = match_invoke(name, length);
        if (m == Match::kNeedMore) return;
        if (m == Match::kNo) {
          give_up(out);
          continue;
        }
        begin_call(out, std::move(name));
        block_has_call_ = true;
        held_.clear();
        buffer_.erase(0, length);
        state_ = State::kInvoke;
        continue;
      }
      case State::kInvoke: {
        size_t ws = 0;
        while (ws < buf.size() && is_space(buf[ws])) ++ws;
        if (ws > 0) {
          buffer_.erase(0, ws);
          continue;
        }
        if (buf.empty()) return;
        if (buf.starts_with(kDsmlInvokeEnd)) {
          add_arguments(out, has_parameter_ ? "}" : "{}");
          calls_.push_back(current_);
          buffer_.erase(0, kDsmlInvokeEnd.size());
          state_ = State::kBlock;
          continue;
        }
        if (is_partial(buf, kDsmlInvokeEnd)) return;
        std::string name;
        bool is_string = false;
        size_t length = 0;
        const Match m = match_parameter(name, is_string, length);
        if (m == Match::kNeedMore) return;
        if (m == Match::kNo) {
          give_up(out);
          continue;
        }
        std::string prefix = has_parameter_ ? ", " : "{";
        prefix += python_json_dumps(nlohmann::ordered_json(name)) + ": ";
        if (is_string) prefix += '"';
        add_arguments(out, prefix);
        has_parameter_ = true;
        value_is_string_ = is_string;
        value_.clear();
        buffer_.erase(0, length);
        state_ = State::kValue;
        continue;
      }
      case State::kValue: {
        const size_t pos = buf.find(kDsmlParameterEnd);
        if (pos != std::string_view::npos) {
          end_value(out, buf.substr(0, pos));
          buffer_.erase(0, pos + kDsmlParameterEnd.size());
          state_ = State::kInvoke;
          continue;
        }
        const size_t emit = buf.size() - partial_marker_length(buf, kDsmlParameterEnd);
        if (value_is_string_) {
          add_arguments(out, json_escape(buf.substr(0, emit)));
        } else {
          value_.append(buf.substr(0, emit));
        }
        buffer_.erase(0, emit);
        return;
      }
    }
  }
}

ToolParserDelta DeepSeekV32ToolCallStreamParser::finish() {
  ToolParserDelta out;
  if (state_ == State::kContent) {
    out.content = std::move(buffer_);
  } else if (state_ == State::kBlock && !block_has_call_) {
    out.content = held_ + buffer_;
  }
  buffer_.clear();
  held_.clear();
  value_.clear();
  state_ = State::kContent;
  return out;
}

ToolCallParseResult parse_deepseek_v32_tool_calls(std::string_view text) {
  DeepSeekV32ToolCallStreamParser parser;
  ToolCallParseResult result;
  result.content = parser.feed(text).content;
  result.content += parser.finish().content;
  result.tool_calls = parser.calls();
  return result;
}

}  // namespace hyserve
