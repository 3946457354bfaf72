// Reasoning parser for `<think>...</think>` output (`--reasoning-parser kimi_k3`, and
// `deepseek_v3`: the same split without the tool-call section rule, as vLLM's DeepSeek-R1
// parser; see parser_registry.h).
//
// Reasoning is on by default: text before `</think>` is reasoning even when the opening
// `<think>` is not in the output (Kimi's chat template puts it in the generation prompt);
// a leading `<think>` in the output is dropped. Reasoning also ends where a tool-call section
// begins (`<|tool_calls_section_begin|>`, the `section_marker` argument; empty for none):
// that marker and what follows are content, to be handed to the tool-call parser. With thinking
// disabled (chat_template_kwargs.thinking == false) everything is content. Without an end marker,
// everything is reasoning.
//
// split_reasoning() splits a finished completion; ReasoningStreamParser is fed text deltas
// (markers may be split at any byte and are held back until decided) and emits reasoning and
// content deltas that concatenate to exactly the non-streaming split.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/kimi_k3_tool_parser.h"

namespace hyserve {

inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

ReasoningSplit split_reasoning(std::string_view text, bool thinking_enabled = true,
                               std::string_view section_marker = kToolCallsSectionBegin);

class ReasoningStreamParser {
 public:
  explicit ReasoningStreamParser(bool thinking_enabled = true,
                                 std::string_view section_marker = kToolCallsSectionBegin);

  // Consumes one text delta; returns what can be emitted now.
  ReasoningSplit feed(std::string_view delta);
  // End of generation: emits what was held back.
  ReasoningSplit finish();

 private:
  enum class State { kStart, kReasoning, kContent };

  State state_;
  std::string_view section_marker_;  // a static marker, or empty
  std::string buffer_;               // received, not yet emitted (a possible partial marker)
};

}  // namespace hyserve
