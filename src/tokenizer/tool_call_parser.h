// What every tool-call parser shares (--tool-call-parser; the names in parser_registry.h):
// the calls of a finished completion (ToolCall), the deltas of a streamed one in vLLM's
// shape (ToolCallDelta, ToolParserDelta) and the streaming interface (ToolCallStreamParser).
// The formats: kimi_k3_tool_parser.h (Kimi's markers), deepseek_v32_tool_parser.h (DSML).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve {

struct ToolCall {
  std::string id;         // "functions.get_weather:0"
  std::string name;       // "get_weather"
  std::string arguments;  // the JSON text as generated (not re-serialized)
};

struct ToolCallParseResult {
  std::string content;  // text before the tool-call section (all of it when there is none)
  std::vector<ToolCall> tool_calls;  // complete calls only, in order
};

// One entry of a streamed `delta.tool_calls`. The first delta of a call carries id and name
// (arguments ""); later ones carry only argument text.
struct ToolCallDelta {
  int32_t index = 0;                // position of the call in this choice
  std::optional<std::string> id;    // set on the first delta of a call
  std::optional<std::string> name;  // set on the first delta of a call
  std::string arguments;
};

struct ToolParserDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
  // Appends argument text of call `index`: to this delta's last piece when that is the
  // same call's and carries no header (id), else as a new piece.
  void append_arguments(int32_t index, std::string_view text);
};

// A streaming tool-call parser of one output format (--tool-call-parser; see
// parser_registry.h for the names).
class ToolCallStreamParser {
 public:
  virtual ~ToolCallStreamParser() = default;
  // Consumes one text delta; returns what can be emitted now.
  virtual ToolParserDelta feed(std::string_view delta) = 0;
  // End of generation: emits what was held back.
  virtual ToolParserDelta finish() = 0;
  // The complete calls of everything fed so far (a non-streaming message's tool_calls).
  virtual std::vector<ToolCall> calls() const = 0;
};

}  // namespace hyserve
