#include "tokenizer/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hyserve {
namespace {

ReasoningSplit stream(const std::vector<std::string>& pieces, bool thinking) {
  ReasoningStreamParser parser(thinking);
  ReasoningSplit all;
  auto add = [&](const ReasoningSplit& d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
  };
  for (const auto& piece : pieces) add(parser.feed(piece));
  add(parser.finish());
  return all;
}

TEST(ReasoningParser, SplitsAtThinkEnd) {
  auto r = split_reasoning("<think>step 1</think>The answer is 4.");
  EXPECT_EQ(r.reasoning, "step 1");
  EXPECT_EQ(r.content, "The answer is 4.");
  r = split_reasoning("step 1</think>\n\nThe answer");
  EXPECT_EQ(r.reasoning, "step 1");
  EXPECT_EQ(r.content, "\n\nThe answer");
}

TEST(ReasoningParser, NoEndIsAllReasoning) {
  const auto r = split_reasoning("<think>still thinking");
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(split_reasoning("").reasoning, "");
}

TEST(ReasoningParser, ToolSectionEndsReasoning) {
  const auto r = split_reasoning("plan<|tool_calls_section_begin|><|tool_call_begin|>x</think>");
  EXPECT_EQ(r.reasoning, "plan");
  EXPECT_EQ(r.content, "<|tool_calls_section_begin|><|tool_call_begin|>x</think>");
}

TEST(ReasoningParser, ThinkingDisabledIsAllContent) {
  const auto r = split_reasoning("a</think>b", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "a</think>b");
}

TEST(ReasoningStream, EverySplitPointMatchesNonStreaming) {
  const std::vector<std::string> texts = {
      "<think>Let me think.</think>Answer: 42",
      "reasoning only </think>content <think> not special",
      "plan it<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0",
      "<thin no think here </thin",
      "<think>",
      "</think>",
      "x<|tool_calls_section_beg"};
  for (const bool thinking : {true, false}) {
    for (const auto& text : texts) {
      const auto want = split_reasoning(text, thinking);
      for (size_t i = 0; i <= text.size(); ++i) {
        const auto got = stream({text.substr(0, i), text.substr(i)}, thinking);
        EXPECT_EQ(got.reasoning, want.reasoning) << text << " split at " << i;
        EXPECT_EQ(got.content, want.content) << text << " split at " << i;
      }
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      const auto got = stream(bytes, thinking);
      EXPECT_EQ(got.reasoning, want.reasoning) << text << " byte by byte";
      EXPECT_EQ(got.content, want.content) << text << " byte by byte";
    }
  }
}

TEST(ReasoningStream, HoldsPartialMarker) {
  ReasoningStreamParser parser;
  auto d = parser.feed("<thi");
  EXPECT_EQ(d.reasoning, "");
  d = parser.feed("nk>abc</th");
  EXPECT_EQ(d.reasoning, "abc");
  d = parser.feed("ink>de");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "de");
  d = parser.feed("<|tool_calls_section_begin|>");
  EXPECT_EQ(d.content, "<|tool_calls_section_begin|>");
}

}  // namespace
}  // namespace hyserve
