// Tool-call parser for DeepSeek-V3.2's DSML format (`--tool-call-parser deepseek_v32`):
//
//   <｜DSML｜function_calls>
//   <｜DSML｜invoke name="get_weather">
//   <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
//   <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   ...
//   </｜DSML｜function_calls>
//
// Text before the block is content (as in vLLM, the "\n\n" before it included). A call's
// arguments are the JSON object of its parameters, written as DeepSeek's reference decoder
// writes it: {"city": "Paris", "days": 3} (", " and ": "); a string="true" value becomes a
// JSON string, a string="false" value is kept as written when it is JSON and becomes a
// string otherwise, so the arguments are always JSON. Call ids are "call_" + 24 random hex
// digits (vLLM's).
//
// Streaming: the id and name once the invoke tag is complete, then argument pieces (string
// values as they arrive, other values whole); pieces concatenate to exactly the
// non-streaming arguments. Markers split across deltas are held back. Output that does not
// follow the format is kept as content: a block whose first element is not a well-formed
// invoke is content from its opening tag on; after an invoke has started, text that breaks
// the format ends the block and is content (the broken call is not in calls()). A call
// without its </｜DSML｜invoke> is not in calls().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_call_parser.h"

namespace hyserve {

class DeepSeekV32ToolCallStreamParser : public ToolCallStreamParser {
 public:
  ToolParserDelta feed(std::string_view delta) override;
  ToolParserDelta finish() override;
  std::vector<ToolCall> calls() const override { return calls_; }

  // What a tag at the buffer's start is, as far as the received bytes tell.
  enum class Match { kYes, kNo, kNeedMore };

 private:
  enum class State { kContent, kBlock, kInvoke, kValue };

  void step(ToolParserDelta& out);
  Match match_invoke(std::string& name, size_t& length) const;
  Match match_parameter(std::string& name, bool& is_string, size_t& length) const;
  // The block (or its rest) is not DSML: the held tag text becomes content.
  void give_up(ToolParserDelta& out);
  // The call's first delta (id and name); then its argument pieces.
  void begin_call(ToolParserDelta& out, std::string name);
  void add_arguments(ToolParserDelta& out, std::string_view text);
  void end_value(ToolParserDelta& out, std::string_view raw);

  State state_ = State::kContent;
  std::string buffer_;  // received, not yet emitted or consumed
  std::string held_;    // the block's consumed tag text while no call has started in it
  bool block_has_call_ = false;
  int32_t num_started_ = 0;     // calls whose first delta was emitted
  ToolCall current_;            // the call being parsed (arguments so far)
  bool has_parameter_ = false;  // the current call has written a parameter
  bool value_is_string_ = false;
  std::string value_;  // a string="false" value, held until its end tag
  std::vector<ToolCall> calls_;
};

// Splits a finished completion (feeds it whole to the stream parser).
ToolCallParseResult parse_deepseek_v32_tool_calls(std::string_view text);

}  // namespace hyserve
