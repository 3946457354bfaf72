// Kimi tool-call parsing; see kimi_k3_tool_parser.h for the format and the streaming contract.
#include "tokenizer/kimi_k3_tool_parser.h"

#include <algorithm>

namespace hyserve {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return rtrim(s);
}

// Length of the longest proper suffix of `text` that is a prefix of `marker`: the bytes
// that might be the start of a marker split across deltas.
size_t partial_marker_length(std::string_view text, std::string_view marker) {
  const size_t max_len = std::min(text.size(), marker.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

std::string tool_name_from_call_id(std::string_view id) {
  std::string_view name = id.substr(0, std::min(id.rfind(':'), id.size()));
  const size_t dot = name.rfind('.');
  if (dot != std::string_view::npos) name.remove_prefix(dot + 1);
  return std::string(name);
}

ToolCallParseResult parse_kimi_tool_calls(std::string_view text) {
  ToolCallParseResult result;
  const size_t section = text.find(kToolCallsSectionBegin);
  if (section == std::string_view::npos) {
    result.content = std::string(text);
    return result;
  }
  result.content = std::string(text.substr(0, section));
  std::string_view rest = text.substr(section + kToolCallsSectionBegin.size());
  rest = rest.substr(0, rest.find(kToolCallsSectionEnd));
  for (;;) {
    const size_t begin = rest.find(kToolCallBegin);
    if (begin == std::string_view::npos) break;
    rest.remove_prefix(begin + kToolCallBegin.size());
    const size_t arg_begin = rest.find(kToolCallArgumentBegin);
    const size_t end = rest.find(kToolCallEnd);
    if (arg_begin == std::string_view::npos || end == std::string_view::npos || end < arg_begin) {
      break;
    }
    ToolCall call;
    call.id = std::string(trim(rest.substr(0, arg_begin)));
    call.name = tool_name_from_call_id(call.id);
    const size_t args_start = arg_begin + kToolCallArgumentBegin.size();
    call.arguments = std::string(trim(rest.substr(args_start, end - args_start)));
    result.tool_calls.push_back(std::move(call));
    rest.remove_prefix(end + kToolCallEnd.size());
  }
  return result;
}

ToolParserDelta KimiToolCallStreamParser::feed(std::string_view delta) {
  buffer_.append(delta);
  text_.append(delta);
  ToolParserDelta out;
  step(out);
  return out;
}

void KimiToolCallStreamParser::emit_arguments(ToolParserDelta& out, std::string_view text) {
  if (!arguments_started_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    arguments_started_ = true;
  }
  out.append_arguments(num_calls_ - 1, text);
}

// Advances the state machine over buffer_ as far as the received bytes allow.
void KimiToolCallStreamParser::step(ToolParserDelta& out) {
  for (;;) {
    const std::string_view buf = buffer_;
    switch (state_) {
      case State::kContent: {
        const size_t pos = buf.find(kToolCallsSectionBegin);
        if (pos != std::string_view::npos) {
          out.content.append(buf.substr(0, pos));
          buffer_.erase(0, pos + kToolCallsSectionBegin.size());
          state_ = State::kSection;
          continue;
        }
        const size_t keep = partial_marker_length(buf, kToolCallsSectionBegin);
        out.content.append(buf.substr(0, buf.size() - keep));
        buffer_.erase(0, buf.size() - keep);
        return;
      }
      case State::kSection: {
        // Between calls: only whitespace and markers are expected; other text is dropped.
        const size_t call = buf.find(kToolCallBegin);
        const size_t end = buf.find(kToolCallsSectionEnd);
        if (call != std::string_view::npos && (end == std::string_view::npos || call < end)) {
          buffer_.erase(0, call + kToolCallBegin.size());
          state_ = State::kHeader;
          continue;
        }
        if (end != std::string_view::npos) {
          buffer_.erase(0, end + kToolCallsSectionEnd.size());
          state_ = State::kContent;
          continue;
        }
        const size_t keep = std::max(partial_marker_length(buf, kToolCallBegin),
                                     partial_marker_length(buf, kToolCallsSectionEnd));
        buffer_.erase(0, buf.size() - keep);
        return;
      }
      case State::kHeader: {
        const size_t pos = buf.find(kToolCallArgumentBegin);
        if (pos == std::string_view::npos) return;
        ToolCallDelta header;
        header.index = num_calls_;
        header.id = std::string(trim(buf.substr(0, pos)));
        header.name = tool_name_from_call_id(*header.id);
        out.tool_calls.push_back(std::move(header));
        ++num_calls_;
        arguments_started_ = false;
        buffer_.erase(0, pos + kToolCallArgumentBegin.size());
        state_ = State::kArguments;
        continue;
      }
      case State::kArguments: {
        const size_t pos = buf.find(kToolCallEnd);
        if (pos != std::string_view::npos) {
          emit_arguments(out, rtrim(buf.substr(0, pos)));
          buffer_.erase(0, pos + kToolCallEnd.size());
          state_ = State::kSection;
          continue;
        }
        // Hold back a partial end marker and the whitespace before it: both are trimmed if
        // the marker completes.
        size_t emit = buf.size() - partial_marker_length(buf, kToolCallEnd);
        while (emit > 0 && is_space(buf[emit - 1])) --emit;
        emit_arguments(out, buf.substr(0, emit));
        buffer_.erase(0, emit);
        return;
      }
    }
  }
}

std::vector<ToolCall> KimiToolCallStreamParser::calls() const {
  return parse_kimi_tool_calls(text_).tool_calls;
}

ToolParserDelta KimiToolCallStreamParser::finish() {
  ToolParserDelta out;
  if (state_ == State::kContent) {
    out.content = std::move(buffer_);
  } else if (state_ == State::kArguments) {
    emit_arguments(out, rtrim(buffer_));
  }
  buffer_.clear();
  return out;
}

}  // namespace hyserve
