#include "tokenizer/kimi_k3_tool_parser.h"

#include "server/forced_tool_calls.h"
#include "tokenizer/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hyserve {
namespace {

const std::string kTwoCalls =
    "Let me check. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
    "<|tool_call_begin|> functions.add:1 <|tool_call_argument_begin|> {\"a\": 1, \"b\": 2} \n"
    "<|tool_call_end|><|tool_calls_section_end|>";

// Rebuilds the non-streaming result from a stream of deltas, checking vLLM's delta order:
// each call starts with one delta holding id, name and arguments "", then argument pieces.
ToolCallParseResult collect(const std::vector<ToolParserDelta>& deltas) {
  ToolCallParseResult result;
  for (const auto& delta : deltas) {
    result.content += delta.content;
    for (const auto& call : delta.tool_calls) {
      if (call.id) {
        EXPECT_EQ(call.index, static_cast<int32_t>(result.tool_calls.size()));
        EXPECT_TRUE(call.name.has_value());
        EXPECT_EQ(call.arguments, "");
        result.tool_calls.push_back({*call.id, *call.name, ""});
      } else {
        EXPECT_FALSE(call.name.has_value());
        EXPECT_FALSE(call.arguments.empty());
        EXPECT_EQ(call.index, static_cast<int32_t>(result.tool_calls.size()) - 1);
        if (result.tool_calls.empty()) continue;
        result.tool_calls.back().arguments += call.arguments;
      }
    }
  }
  return result;
}

ToolCallParseResult stream(const std::vector<std::string>& pieces) {
  KimiToolCallStreamParser parser;
  std::vector<ToolParserDelta> deltas;
  for (const auto& piece : pieces) deltas.push_back(parser.feed(piece));
  deltas.push_back(parser.finish());
  return collect(deltas);
}

void expect_same(const ToolCallParseResult& got, const ToolCallParseResult& want,
                 const std::string& where) {
  EXPECT_EQ(got.content, want.content) << where;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << where;
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id) << where << " call " << i;
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << where << " call " << i;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << where << " call " << i;
  }
}

TEST(KimiToolCallParser, ParsesContentAndCalls) {
  const auto result = parse_kimi_tool_calls(kTwoCalls);
  EXPECT_EQ(result.content, "Let me check. ");
  ASSERT_EQ(result.tool_calls.size(), 2u);
  EXPECT_EQ(result.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(result.tool_calls[0].name, "get_weather");
  EXPECT_EQ(result.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(result.tool_calls[1].id, "functions.add:1");
  EXPECT_EQ(result.tool_calls[1].name, "add");
  EXPECT_EQ(result.tool_calls[1].arguments, "{\"a\": 1, \"b\": 2}");
}

TEST(KimiToolCallParser, NoSectionIsAllContent) {
  const auto result = parse_kimi_tool_calls("plain <|tool_call_begin|> text");
  EXPECT_EQ(result.content, "plain <|tool_call_begin|> text");
  EXPECT_TRUE(result.tool_calls.empty());
  EXPECT_EQ(parse_kimi_tool_calls("").content, "");
}

TEST(KimiToolCallParser, UnterminatedCallIsDropped) {
  const auto result = parse_kimi_tool_calls(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
      "{}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"x\"");
  EXPECT_EQ(result.content, "");
  ASSERT_EQ(result.tool_calls.size(), 1u);
  EXPECT_EQ(result.tool_calls[0].name, "f");
  EXPECT_EQ(result.tool_calls[0].arguments, "{}");
}

TEST(KimiToolCallParser, NameFromId) {
  EXPECT_EQ(tool_name_from_call_id("functions.get_weather:0"), "get_weather");
  EXPECT_EQ(tool_name_from_call_id("search:12"), "search");
  EXPECT_EQ(tool_name_from_call_id("a.b.c:3"), "c");
}

TEST(KimiToolCallStream, WholeTextInOneDelta) {
  expect_same(stream({kTwoCalls}), parse_kimi_tool_calls(kTwoCalls), "one delta");
}

TEST(KimiToolCallStream, EverySplitPoint) {
  const auto want = parse_kimi_tool_calls(kTwoCalls);
  for (size_t i = 0; i <= kTwoCalls.size(); ++i) {
    expect_same(stream({kTwoCalls.substr(0, i), kTwoCalls.substr(i)}), want,
                "split at " + std::to_string(i));
  }
}

TEST(KimiToolCallStream, ByteByByteAndTwoSplits) {
  const auto want = parse_kimi_tool_calls(kTwoCalls);
  std::vector<std::string> bytes;
  for (char c : kTwoCalls) bytes.emplace_back(1, c);
  expect_same(stream(bytes), want, "byte by byte");
  for (size_t i = 0; i < kTwoCalls.size(); i += 3) {
    for (size_t j = i; j <= kTwoCalls.size(); j += 5) {
      expect_same(stream({kTwoCalls.substr(0, i), kTwoCalls.substr(i, j - i), kTwoCalls.substr(j)}),
                  want, "splits at " + std::to_string(i) + "," + std::to_string(j));
    }
  }
}

TEST(KimiToolCallStream, PartialMarkerIsHeldNotEmitted) {
  KimiToolCallStreamParser parser;
  auto d = parser.feed("Hi <|tool_calls_sec");
  EXPECT_EQ(d.content, "Hi ");
  d = parser.feed("tion_begin|><|tool_call_begin|>functions.f:0<|tool_call_arg");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(d.tool_calls.empty());
  d = parser.feed("ument_begin|>{\"k\"");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(*d.tool_calls[0].id, "functions.f:0");
  EXPECT_EQ(*d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[1].arguments, "{\"k\"");
  d = parser.feed(": 1}<|tool_ca");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, ": 1}");
  d = parser.feed("ll_end|><|tool_calls_section_end|>");
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(parser.num_tool_calls(), 1);
}

TEST(KimiToolCallStream, LookalikeTextIsContentAtFinish) {
  const std::string text = "a <|tool_calls_section_b";
  expect_same(stream({text}), parse_kimi_tool_calls(text), "lookalike at end");
  const std::string text2 = "a <|tool_calls_X|> b <";
  expect_same(stream({text2.substr(0, 5), text2.substr(5)}), parse_kimi_tool_calls(text2),
              "lookalike in middle");
}

TEST(KimiToolCallStream, TruncatedArgumentsFlushAtFinish) {
  KimiToolCallStreamParser parser;
  std::vector<ToolParserDelta> deltas;
  deltas.push_back(parser.feed(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
      "{\"x\": 1 <|tool_call"));
  deltas.push_back(parser.finish());
  const auto got = collect(deltas);
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].arguments, "{\"x\": 1 <|tool_call");
}

// The server's chain: reasoning parser first, its content fed to the tool-call parser.
TEST(KimiToolCallStream, AfterReasoningParserEverySplitPoint) {
  const std::string text =
      "I should call f." + kTwoCalls.substr(std::string("Let me check. ").size());
  const auto split = split_reasoning(text);
  const auto want = parse_kimi_tool_calls(split.content);
  EXPECT_EQ(split.reasoning, "I should call f.");
  ASSERT_EQ(want.tool_calls.size(), 2u);
  for (size_t i = 0; i <= text.size(); ++i) {
    ReasoningStreamParser reasoning;
    KimiToolCallStreamParser tools;
    std::string got_reasoning;
    std::vector<ToolParserDelta> deltas;
    for (const std::string& piece : {text.substr(0, i), text.substr(i)}) {
      const auto r = reasoning.feed(piece);
      got_reasoning += r.reasoning;
      deltas.push_back(tools.feed(r.content));
    }
    const auto r = reasoning.finish();
    got_reasoning += r.reasoning;
    deltas.push_back(tools.feed(r.content));
    deltas.push_back(tools.finish());
    EXPECT_EQ(got_reasoning, split.reasoning) << "split at " << i;
    expect_same(collect(deltas), want, "split at " + std::to_string(i));
  }
}

// ---- Forced tool calls (tool_choice "required" / named: server/forced_tool_calls.h) -------

struct ForcedArgs {
  ForcedToolMode mode;
  std::string name;
  int32_t first_index;
};

// Feeds `text` in pieces of `piece` bytes; returns the calls the deltas rebuild, checking
// that a call's first delta names it and the later ones carry argument text only.
std::vector<ToolCall> stream_forced(ForcedArgs args, std::string_view text, size_t piece,
                                    std::vector<ToolCall>* final_calls = nullptr) {
  ForcedToolCallParser parser(args.mode, args.name, args.first_index);
  std::vector<ToolCall> calls;
  for (size_t at = 0; at < text.size(); at += piece) {
    for (const ToolCallDelta& d : parser.feed(text.substr(at, piece))) {
      if (d.id) {
        EXPECT_EQ(d.index, static_cast<int32_t>(calls.size()));
        EXPECT_TRUE(d.name.has_value());
        calls.push_back({*d.id, *d.name, d.arguments});
      } else {
        EXPECT_FALSE(d.name.has_value());
        EXPECT_FALSE(d.arguments.empty());
        EXPECT_EQ(d.index, static_cast<int32_t>(calls.size()) - 1);
        if (!calls.empty()) calls.back().arguments += d.arguments;
      }
    }
  }
  if (final_calls) *final_calls = parser.calls();
  return calls;
}

bool same_calls(const std::vector<ToolCall>& a, const std::vector<ToolCall>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].name != b[i].name || a[i].arguments != b[i].arguments)
      return false;
  }
  return true;
}

TEST(ForcedToolCallParser, NamedCallIsTheWholeTextStreamedOrNot) {
  const std::string text = "  \n{\"city\": \"Paris\", \"days\": [1, 2]}";
  for (size_t piece : {1, 3, 100}) {
    std::vector<ToolCall> final_calls;
    const auto calls =
        stream_forced({ForcedToolMode::kNamed, "get_weather", 2}, text, piece, &final_calls);
    ASSERT_EQ(calls.size(), 1u) << piece;
    EXPECT_EQ(calls[0].id, "functions.get_weather:2");
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, 2]}");  // leading ws dropped
    EXPECT_TRUE(same_calls(calls, final_calls)) << piece;
  }
  // Nothing generated (all reasoning, or max_tokens): no call.
  ForcedToolCallParser empty(ForcedToolMode::kNamed, "f", 0);
  EXPECT_TRUE(empty.feed(" \n").empty());
  EXPECT_TRUE(empty.calls().empty());
}

TEST(ForcedToolCallParser, RequiredArrayBecomesCallsInEitherKeyOrder) {
  const std::string text =
      "[ {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa\\\"ris\", \"n\": [1, {}]}},\n"
      "  {\"parameters\" : {\"metric\": true}, \"name\":\"set_\\u0075nits\"},"
      "{\"name\": \"ping\", \"parameters\": {}}, {\"name\": \"count\", \"parameters\": 42 },"
      "{\"parameters\":\"s}]\", \"name\": \"echo\"}]";
  const std::vector<ToolCall> expected = {
      {"functions.get_weather:0", "get_weather", "{\"city\": \"Pa\\\"ris\", \"n\": [1, {}]}"},
      {"functions.set_units:1", "set_units", "{\"metric\": true}"},
      {"functions.ping:2", "ping", "{}"},
      {"functions.count:3", "count", "42"},
      {"functions.echo:4", "echo", "\"s}]\""},
  };
  for (size_t piece : {1, 2, 7, 1000}) {
    std::vector<ToolCall> final_calls;
    const auto calls = stream_forced({ForcedToolMode::kRequired, "", 0}, text, piece, &final_calls);
    EXPECT_TRUE(same_calls(calls, expected)) << piece;
    EXPECT_TRUE(same_calls(final_calls, expected)) << piece;
  }
}

TEST(ForcedToolCallParser, RequiredNameIsSentOnceCompleteAndACutObjectIsNoCall) {
  ForcedToolCallParser parser(ForcedToolMode::kRequired, "", 0);
  EXPECT_TRUE(parser.feed("[{\"name\": \"get_wea").empty());
  auto d = parser.feed("ther\", \"parameters\": {\"ci");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, "functions.get_weather:0");
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[0].arguments, "{\"ci");
  d = parser.feed("ty\": \"Rome\"}");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].id.has_value());
  EXPECT_EQ(d[0].arguments, "ty\": \"Rome\"}");
  EXPECT_TRUE(parser.calls().empty());  // the object is not closed yet
  EXPECT_FALSE(parser.feed(" }, {\"name\": \"x\", \"parame").empty());  // x's header
  ASSERT_EQ(parser.calls().size(), 1u);
  EXPECT_EQ(parser.calls()[0].arguments, "{\"city\": \"Rome\"}");
}

}  // namespace
}  // namespace hyserve
