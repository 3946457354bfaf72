// DeepSeek-V3.2's DSML tool-call parser (deepseek_v32) and the deepseek_v3 reasoning parser:
// non-streaming results, and streaming deltas that rebuild them at every split point.
#include "tokenizer/deepseek_v32_tool_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/parser_registry.h"
#include "util/error.h"

namespace hyserve {
namespace {

const std::string kCalls =
    "Let me check.\n\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">杭州 \"east\"\n\\</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\"> {\"unit\": \"C\"} </｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"now\">\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>";

struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;  // rebuilt from the deltas
  std::vector<ToolCall> final_calls;
};

// Feeds `pieces`, checking the delta shape: a call's first delta has id and name and no
// arguments; later ones carry arguments only, for the latest call.
Streamed stream(const std::vector<std::string>& pieces) {
  DeepSeekV32ToolCallStreamParser parser;
  Streamed s;
  auto take = [&](const ToolParserDelta& d) {
    s.content += d.content;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (c.id) {
        EXPECT_EQ(c.index, static_cast<int32_t>(s.calls.size()));
        EXPECT_TRUE(c.name.has_value());
        EXPECT_EQ(c.arguments, "");
        s.calls.push_back({*c.id, *c.name, ""});
      } else {
        EXPECT_FALSE(c.name.has_value());
        EXPECT_FALSE(c.arguments.empty());
        EXPECT_EQ(c.index, static_cast<int32_t>(s.calls.size()) - 1);
        if (!s.calls.empty()) s.calls.back().arguments += c.arguments;
      }
    }
  };
  for (const std::string& p : pieces) take(parser.feed(p));
  take(parser.finish());
  s.final_calls = parser.calls();
  return s;
}

TEST(DeepSeekV32ToolParser, ParsesSeveralCalls) {
  const ToolCallParseResult r = parse_deepseek_v32_tool_calls(kCalls);
  EXPECT_EQ(r.content, "Let me check.\n\n");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments,
            R"({"city": "杭州 \"east\"\n\\", "days": 3, "opts": {"unit": "C"}})");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  for (const ToolCall& c : r.tool_calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    EXPECT_EQ(c.id.size(), 5u + 24u);
  }
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(DeepSeekV32ToolParser, NonJsonValueBecomesAString) {
  const auto r = parse_deepseek_v32_tool_calls(
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"sh\">\n"
      "<｜DSML｜parameter name=\"cmd\" string=\"false\">ls -l</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"cmd": "ls -l"})");
}

TEST(DeepSeekV32ToolParser, TextWithoutCallsIsContent) {
  const std::string text = "plain <｜DSML｜ text, <｜DSML｜function_call no";
  const auto r = parse_deepseek_v32_tool_calls(text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(DeepSeekV32ToolParser, MalformedBlocksStayContent) {
  for (const std::string& text : {
           std::string("a<｜DSML｜function_calls>\nnot a call"),
           std::string("<｜DSML｜function_calls><｜DSML｜invoke nam=\"f\">x"),
           std::string("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"\">"),
           std::string("b<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f"),
           std::string("c<｜DSML｜function_ca"),
       }) {
    const auto r = parse_deepseek_v32_tool_calls(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.tool_calls.empty());
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      const Streamed s = stream({text.substr(0, cut), text.substr(cut)});
      EXPECT_EQ(s.content, text) << "split at " << cut;
      EXPECT_TRUE(s.calls.empty());
    }
  }
  // A parameter that breaks the format ends the block: the rest is content and the broken
  // call is not complete.
  const auto r = parse_deepseek_v32_tool_calls(
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter x>1");
  EXPECT_EQ(r.content, "<｜DSML｜parameter x>1");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(DeepSeekV32ToolStream, EverySplitPointMatchesNonStreaming) {
  const ToolCallParseResult want = parse_deepseek_v32_tool_calls(kCalls);
  for (size_t a = 0; a <= kCalls.size(); ++a) {
    for (size_t b = a; b <= kCalls.size(); b += 7) {
      const Streamed s = stream({kCalls.substr(0, a), kCalls.substr(a, b - a), kCalls.substr(b)});
      ASSERT_EQ(s.content, want.content) << a << "," << b;
      ASSERT_EQ(s.calls.size(), want.tool_calls.size()) << a << "," << b;
      for (size_t i = 0; i < s.calls.size(); ++i) {
        EXPECT_EQ(s.calls[i].name, want.tool_calls[i].name);
        EXPECT_EQ(s.calls[i].arguments, want.tool_calls[i].arguments) << a << "," << b;
        EXPECT_EQ(s.calls[i].id, s.final_calls[i].id);
        EXPECT_EQ(s.calls[i].arguments, s.final_calls[i].arguments);
      }
    }
  }
}

TEST(DeepSeekV32ToolStream, ByteAtATime) {
  std::vector<std::string> bytes;
  for (const char c : kCalls) bytes.emplace_back(1, c);
  const Streamed s = stream(bytes);
  const ToolCallParseResult want = parse_deepseek_v32_tool_calls(kCalls);
  EXPECT_EQ(s.content, want.content);
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, want.tool_calls[0].arguments);
  EXPECT_EQ(s.calls[1].arguments, "{}");
}

// ---- deepseek_v3 reasoning (vLLM: R1's split in thinking mode, identity otherwise) -------

ReasoningSplit stream_reasoning(const std::string& name, bool thinking,
                                const std::vector<std::string>& pieces) {
  ReasoningStreamParser parser = make_reasoning_parser(name, thinking);
  ReasoningSplit all;
  auto add = [&](const ReasoningSplit& d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
  };
  for (const auto& p : pieces) add(parser.feed(p));
  add(parser.finish());
  return all;
}

TEST(DeepSeekV3Reasoning, SplitsAtThinkEndOnly) {
  const std::string text = "plan <|tool_calls_section_begin|> x</think>answer" + kCalls;
  const ReasoningSplit r = stream_reasoning("deepseek_v3", true, {text});
  EXPECT_EQ(r.reasoning, "plan <|tool_calls_section_begin|> x");
  EXPECT_EQ(r.content, "answer" + kCalls);
  EXPECT_EQ(stream_reasoning("deepseek_v3", true, {"<think>all reasoning"}).reasoning,
            "all reasoning");
  const ReasoningSplit off = stream_reasoning("deepseek_v3", false, {text});
  EXPECT_EQ(off.reasoning, "");
  EXPECT_EQ(off.content, text);
  // kimi_k3 keeps its rule.
  EXPECT_EQ(stream_reasoning("kimi_k3", true, {"a<|tool_calls_section_begin|>b"}).reasoning, "a");
}

TEST(DeepSeekV3Reasoning, ThenToolParserAtEverySplitPoint) {
  const std::string text = "<think>Need weather.</think>" + kCalls;
  const ToolCallParseResult want = parse_deepseek_v32_tool_calls(kCalls);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ReasoningStreamParser reasoning = make_reasoning_parser("deepseek_v3", true);
    DeepSeekV32ToolCallStreamParser tools;
    std::string thought, content, args;
    size_t num_calls = 0;
    auto take = [&](const ToolParserDelta& d) {
      content += d.content;
      for (const ToolCallDelta& c : d.tool_calls) {
        if (c.id) ++num_calls;
        args += c.arguments;
      }
    };
    for (const std::string& piece : {text.substr(0, cut), text.substr(cut)}) {
      const ReasoningSplit r = reasoning.feed(piece);
      thought += r.reasoning;
      take(tools.feed(r.content));
    }
    const ReasoningSplit r = reasoning.finish();
    thought += r.reasoning;
    take(tools.feed(r.content));
    take(tools.finish());
    EXPECT_EQ(thought, "Need weather.") << cut;
    EXPECT_EQ(content, want.content) << cut;
    EXPECT_EQ(num_calls, 2u);
    EXPECT_EQ(args, want.tool_calls[0].arguments + want.tool_calls[1].arguments) << cut;
  }
}

TEST(ParserRegistry, KnowsVllmNames) {
  EXPECT_TRUE(is_tool_call_parser_name("kimi_k3"));
  EXPECT_TRUE(is_tool_call_parser_name("deepseek_v32"));
  EXPECT_FALSE(is_tool_call_parser_name("deepseek_v3"));
  EXPECT_TRUE(is_reasoning_parser_name("deepseek_v3"));
  EXPECT_FALSE(is_reasoning_parser_name("deepseek_v32"));
  EXPECT_THROW(make_tool_call_parser("hermes"), InvalidArgument);
  EXPECT_THROW(make_reasoning_parser("qwen3", true), InvalidArgument);
  EXPECT_NE(
      dynamic_cast<DeepSeekV32ToolCallStreamParser*>(make_tool_call_parser("deepseek_v32").get()),
      nullptr);
}

}  // namespace
}  // namespace hyserve
