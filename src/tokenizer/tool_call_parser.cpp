// The tool-call deltas every parser emits; see tool_call_parser.h.
#include "tokenizer/tool_call_parser.h"

namespace hyserve {

void ToolParserDelta::append_arguments(int32_t index, std::string_view text) {
  if (text.empty()) return;
  if (!tool_calls.empty() && tool_calls.back().index == index && !tool_calls.back().id) {
    tool_calls.back().arguments.append(text);
    return;
  }
  ToolCallDelta piece;
  piece.index = index;
  piece.arguments = std::string(text);
  tool_calls.push_back(std::move(piece));
}

}  // namespace hyserve
