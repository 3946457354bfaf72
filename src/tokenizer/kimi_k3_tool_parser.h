// Tool-call parser for the Kimi marker format (`--tool-call-parser kimi_k3`):
//
//   <|tool_calls_section_begin|>
//     <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>
//     ...
//   <|tool_calls_section_end|>
//
// Text before the section is content; the call id is the header "functions.NAME:IDX".
// parse_kimi_tool_calls() splits a finished completion; KimiToolCallStreamParser is fed text
// deltas as the detokenizer produces them (markers may be split at any byte: a partial
// marker is held back, never emitted as content) and yields deltas in vLLM's streaming
// shape: a call's id and name once the header is complete, then argument string pieces.
// Arguments are trimmed of surrounding whitespace in both modes, so the streamed pieces
// concatenate to exactly the non-streaming arguments string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_call_parser.h"

namespace hyserve {

inline constexpr std::string_view kToolCallsSectionBegin = "<|tool_calls_section_begin|>";
inline constexpr std::string_view kToolCallsSectionEnd = "<|tool_calls_section_end|>";
inline constexpr std::string_view kToolCallBegin = "<|tool_call_begin|>";
inline constexpr std::string_view kToolCallArgumentBegin = "<|tool_call_argument_begin|>";
inline constexpr std::string_view kToolCallEnd = "<|tool_call_end|>";

// Splits a finished completion. A call without its <|tool_call_end|> is dropped.
ToolCallParseResult parse_kimi_tool_calls(std::string_view text);

// The name from a call header: "functions.get_weather:0" -> "get_weather" (text after the
// last '.' before the last ':'; vLLM's rule).
std::string tool_name_from_call_id(std::string_view id);

class KimiToolCallStreamParser : public ToolCallStreamParser {
 public:
  ToolParserDelta feed(std::string_view delta) override;
  // End of generation: emits what was held back (a partial marker in content becomes
  // content; held argument text of an unterminated call is emitted).
  ToolParserDelta finish() override;
  // parse_kimi_tool_calls of the text fed so far.
  std::vector<ToolCall> calls() const override;
  // Calls whose header has been emitted so far.
  int32_t num_tool_calls() const { return num_calls_; }

 private:
  enum class State { kContent, kSection, kHeader, kArguments };

  void step(ToolParserDelta& out);
  void emit_arguments(ToolParserDelta& out, std::string_view text);

  State state_ = State::kContent;
  std::string buffer_;  // received, not yet emitted or consumed
  std::string text_;    // everything received
  int32_t num_calls_ = 0;
  bool arguments_started_ = false;  // leading whitespace of the current call's args skipped
};

}  // namespace hyserve
