// `<think>` reasoning parsing; see reasoning_parser.h for the rules.
#include "tokenizer/reasoning_parser.h"

#include <algorithm>

#include "tokenizer/kimi_k3_tool_parser.h"

namespace hyserve {
namespace {

// Length of the longest proper suffix of `text` that is a prefix of `marker`.
size_t partial_marker_length(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  const size_t max_len = std::min(text.size(), marker.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

// Where reasoning ends in `text` and how many bytes the end marker takes (a tool-call
// section marker ends reasoning but stays in the content). npos when neither is present.
std::pair<size_t, size_t> find_reasoning_end(std::string_view text,
                                             std::string_view section_marker) {
  const size_t think_end = text.find(kThinkEnd);
  const size_t section =
      section_marker.empty() ? std::string_view::npos : text.find(section_marker);
  if (think_end != std::string_view::npos &&
      (section == std::string_view::npos || think_end < section)) {
    return {think_end, kThinkEnd.size()};
  }
  return {section, 0};
}

}  // namespace

ReasoningSplit split_reasoning(std::string_view text, bool thinking_enabled,
                               std::string_view section_marker) {
  if (!thinking_enabled) return {"", std::string(text)};
  if (text.substr(0, kThinkBegin.size()) == kThinkBegin) text.remove_prefix(kThinkBegin.size());
  const auto [end, marker_size] = find_reasoning_end(text, section_marker);
  if (end == std::string_view::npos) return {std::string(text), ""};
  return {std::string(text.substr(0, end)), std::string(text.substr(end + marker_size))};
}

ReasoningStreamParser::ReasoningStreamParser(bool thinking_enabled, std::string_view section_marker)
    : state_(thinking_enabled ? State::kStart : State::kContent), section_marker_(section_marker) {}

ReasoningSplit ReasoningStreamParser::feed(std::string_view delta) {
  ReasoningSplit out;
  if (state_ == State::kContent) {
    out.content = std::string(delta);
    return out;
  }
  buffer_.append(delta);
  if (state_ == State::kStart) {
    const std::string_view buf = buffer_;
    if (buf.size() < kThinkBegin.size() && kThinkBegin.substr(0, buf.size()) == buf) return out;
    if (buf.substr(0, kThinkBegin.size()) == kThinkBegin) buffer_.erase(0, kThinkBegin.size());
    state_ = State::kReasoning;
  }
  const std::string_view buf = buffer_;
  const auto [end, marker_size] = find_reasoning_end(buf, section_marker_);
  if (end != std::string_view::npos) {
    out.reasoning = std::string(buf.substr(0, end));
    out.content = std::string(buf.substr(end + marker_size));
    buffer_.clear();
    state_ = State::kContent;
    return out;
  }
  const size_t keep =
      std::max(partial_marker_length(buf, kThinkEnd), partial_marker_length(buf, section_marker_));
  out.reasoning = std::string(buf.substr(0, buf.size() - keep));
  buffer_.erase(0, buf.size() - keep);
  return out;
}

ReasoningSplit ReasoningStreamParser::finish() {
  ReasoningSplit out;
  out.reasoning = std::move(buffer_);
  buffer_.clear();
  return out;
}

}  // namespace hyserve
