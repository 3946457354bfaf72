// The server's per-choice output processing on real token streams of the bundled
// tokenizer: tool calls and reasoning come out of the markers the model emits, split
// across tokens; stop strings are cut with their hold-back.
#include "server/generation.h"

#include <filesystem>
#include <utility>

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

// Forced tool calls (tool_choice required / named): the constrained text after the reasoning
// is the calls, never content; finish_reason "tool_calls" for required, "stop" for named.
TEST(ServerGeneration, ForcedToolCallsAfterReasoning) {
  const auto tok = Tokenizer::load(kTiny);
  struct Case {
    ForcedToolMode mode;
    std::string text;
    std::string finish_reason;
    std::vector<ToolCall> calls;
  };
  const std::vector<Case> cases = {
      {ForcedToolMode::kNamed,
       "hmm</think> {\"city\": \"Paris\"}",
       "stop",
       {{"functions.get_weather:3", "get_weather", "{\"city\": \"Paris\"}"}}},
      {ForcedToolMode::kRequired,
       "hmm</think>[{\"name\": \"ping\", \"parameters\": {}}, {\"parameters\": {\"a\": 1}, "
       "\"name\": \"add\"}]",
       "tool_calls",
       {{"functions.ping:3", "ping", "{}"}, {"functions.add:4", "add", "{\"a\": 1}"}}},
  };
  for (const Case& c : cases) {
    ChoiceOptions o;
    o.parse_reasoning = true;
    o.forced_tools = c.mode;
    o.forced_function = "get_weather";
    o.first_tool_call_index = 3;
    ChoiceProcessor p(*tok, o);
    std::string content, reasoning;
    std::vector<ToolCall> streamed;
    ChoiceDelta last;
    for (const RequestOutput& out : outputs(tok->encode(c.text, true), "stop")) {
      last = p.feed(out);
      content += last.content;
      reasoning += last.reasoning;
      for (const ToolCallDelta& t : last.tool_calls) {
        if (t.id) streamed.push_back({*t.id, *t.name, ""});
        ASSERT_FALSE(streamed.empty());
        streamed.back().arguments += t.arguments;
      }
    }
    EXPECT_EQ(last.finish_reason, c.finish_reason);
    EXPECT_EQ(reasoning, "hmm");
    EXPECT_EQ(content, "");
    EXPECT_EQ(p.all_content(), "");
    for (const std::vector<ToolCall>* calls : {&std::as_const(streamed), &p.all_tool_calls()}) {
      ASSERT_EQ(calls->size(), c.calls.size());
      for (size_t i = 0; i < calls->size(); ++i) {
        EXPECT_EQ((*calls)[i].id, c.calls[i].id);
        EXPECT_EQ((*calls)[i].name, c.calls[i].name);
        EXPECT_EQ((*calls)[i].arguments, c.calls[i].arguments);
      }
    }
  }
}

// Echo with logprobs: the prompt's entries, the first without a logprob.
TEST(ServerGeneration, PromptTokenLogprobsForEcho) {
  const auto tok = Tokenizer::load(kTiny);
  const std::vector<int32_t> prompt = tok->encode("ab cd", false);
  ASSERT_GE(prompt.size(), 2u);
  std::vector<std::optional<OutputToken>> entries(prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i)
    entries[i] = OutputToken{prompt[i], -0.5f, 1, {{prompt[i], -0.5f}, {prompt[0], -2.0f}}};
  ChoiceProcessor p(*tok, {});
  const std::vector<TokenLogprob> lp = p.prompt_token_logprobs(prompt, entries, 1);
  ASSERT_EQ(lp.size(), prompt.size());
  std::string text;
  for (const TokenLogprob& t : lp) text += t.token;
  EXPECT_EQ(text, "ab cd");
  EXPECT_FALSE(lp[0].logprob.has_value());
  EXPECT_TRUE(lp[0].top_logprobs.empty());
  for (size_t i = 1; i < lp.size(); ++i) {
    EXPECT_EQ(lp[i].logprob, -0.5f);
    ASSERT_EQ(lp[i].top_logprobs.size(), 1u);  // top_n of the engine's two
  }
}

}  // namespace
}  // namespace hyserve
