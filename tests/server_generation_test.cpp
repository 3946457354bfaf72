// The server's per-choice output processing on real token streams of the bundled
// tokenizer: tool calls and reasoning come out of the markers the model emits, split
// across tokens; stop strings are cut with their hold-back.
#include "server/generation.h"

#include <filesystem>

#include <gtest/gtest.h>

namespace hyserve {
namespace {

const std::filesystem::path kTiny =
    std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";

// The engine output that delivers `ids` one token per output; the last one finishes.
std::vector<RequestOutput> outputs(const std::vector<int32_t>& ids, const std::string& reason) {
  std::vector<RequestOutput> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    RequestOutput o;
    o.new_tokens.push_back({ids[i], -1.0f, 0, {}});
    o.finished = i + 1 == ids.size();
    if (o.finished) o.finish_reason = reason;
    out.push_back(o);
  }
  return out;
}

TEST(ServerGeneration, ToolCallsAndReasoningFromATokenStream) {
  const auto tok = Tokenizer::load(kTiny);
  const std::string text =
      "thinking about it</think>Let me check.<|tool_calls_section_begin|><|tool_call_begin|>"
      "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  const std::vector<int32_t> ids = tok->encode(text, /*allow_special=*/true);
  ASSERT_GT(ids.size(), 10u);
  ChoiceOptions o;
  o.parse_reasoning = true;
  o.parse_tool_calls = true;
  ChoiceProcessor p(*tok, o);
  std::string content, reasoning, name, args, id;
  ChoiceDelta last;
  for (const RequestOutput& out : outputs(ids, "stop")) {
    last = p.feed(out);
    content += last.content;
    reasoning += last.reasoning;
    for (const ToolCallDelta& t : last.tool_calls) {
      if (t.id) id = *t.id;
      if (t.name) name = *t.name;
      args += t.arguments;
    }
  }
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.finish_reason, "tool_calls");
  EXPECT_EQ(reasoning, "thinking about it");
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(id, "functions.get_weather:0");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, "{\"city\": \"Paris\"}");
  ASSERT_EQ(p.all_tool_calls().size(), 1u);
  EXPECT_EQ(p.all_tool_calls()[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(p.all_content(), "Let me check.");
}

// A model's turn ends with <|im_end|>, the EOS the engine stops at. The parsers keep special
// tokens in the text, but the stopping token's text is left out (vLLM's rule), so it is
// neither content nor the stop_reason.
TEST(ServerGeneration, EosTextIsNotContentWhenParsing) {
  const auto tok = Tokenizer::load(kTiny);
  const int32_t eos = tok->token_id("<|im_end|>");
  ASSERT_GE(eos, 0);
  std::vector<int32_t> ids = tok->encode(
      "ok</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
      "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
      /*allow_special=*/true);
  ids.push_back(eos);
  std::vector<RequestOutput> outs = outputs(ids, "stop");
  outs.back().stop_token_id = eos;  // as the engine reports an EOS stop
  ChoiceOptions o;
  o.parse_reasoning = true;
  o.parse_tool_calls = true;
  ChoiceProcessor p(*tok, o);
  std::string content;
  ChoiceDelta last;
  for (const RequestOutput& out : outs) {
    last = p.feed(out);
    content += last.content;
  }
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.finish_reason, "tool_calls");
  EXPECT_TRUE(last.stop_reason.is_null());
  EXPECT_EQ(content, "");
  EXPECT_EQ(p.all_content(), "");
  EXPECT_EQ(p.all_reasoning(), "ok");
  ASSERT_EQ(p.all_tool_calls().size(), 1u);
  EXPECT_EQ(p.all_tool_calls()[0].id, "functions.f:0");
  EXPECT_EQ(p.num_tokens(), static_cast<int64_t>(ids.size()));  // EOS still counts
}

TEST(ServerGeneration, EosTextIsKeptWhenAskedFor) {
  const auto tok = Tokenizer::load(kTiny);
  const int32_t eos = tok->token_id("<|im_end|>");
  std::vector<RequestOutput> outs = outputs({tok->encode("hi", false)[0], eos}, "stop");
  outs.back().stop_token_id = eos;
  ChoiceOptions o;
  o.skip_special_tokens = false;
  o.include_stop_str_in_output = true;
  ChoiceProcessor p(*tok, o);
  for (const RequestOutput& out : outs) p.feed(out);
  EXPECT_EQ(p.all_content(), "hi<|im_end|>");
}

TEST(ServerGeneration, StopStringIsCutAndHeldBack) {
  const auto tok = Tokenizer::load(kTiny);
  const std::vector<int32_t> ids = tok->encode("one two three four", false);
  ChoiceOptions o;
  o.stop = {"three"};
  ChoiceProcessor p(*tok, o);
  std::string content;
  ChoiceDelta d;
  for (const RequestOutput& out : outputs(ids, "length")) {
    d = p.feed(out);
    content += d.content;
    // Nothing past the stop string's start ever leaves.
    EXPECT_EQ(content.find("thr"), std::string::npos) << content;
    if (d.finished) break;
  }
  EXPECT_TRUE(d.finished);
  EXPECT_TRUE(d.stop_string_hit);
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_EQ(d.stop_reason, "three");
  EXPECT_EQ(content, "one two ");
}

// An EOS id that is an ordinary token (the tiny model's id 2) ends the output without its
// text, like a stop token id, but is not reported as the stop_reason.
TEST(ServerGeneration, EosTextIsDroppedWithoutAStopReason) {
  const auto tok = Tokenizer::load(kTiny);
  std::vector<int32_t> ids = tok->encode("{}", false);
  ids.push_back(2);
  ChoiceProcessor p(*tok, ChoiceOptions{});
  std::string content;
  ChoiceDelta d;
  std::vector<RequestOutput> outs = outputs(ids, "stop");
  outs.back().stop_token_id = 2;
  for (const RequestOutput& out : outs) {
    d = p.feed(out);
    content += d.content;
  }
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_TRUE(d.stop_reason.is_null());
  EXPECT_EQ(content, "{}");
}

}  // namespace
}  // namespace hyserve
