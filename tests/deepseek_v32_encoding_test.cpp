// DeepSeek-V3.2's chat encoding: exact prompt strings, written out from the rules of
// DeepSeek's encoding_dsv32.py (and vLLM's use of it: tools as a system turn first, thinking
// from chat_template_kwargs).
#include "tokenizer/deepseek_v32_encoding.h"

#include <gtest/gtest.h>

#include <string>

#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kUser = "<｜User｜>";
const std::string kAssistant = "<｜Assistant｜>";

std::string encode(const char* messages, const char* kwargs = "null", const char* tools = "null") {
  return encode_deepseek_v32_chat(ordered_json::parse(messages), ordered_json::parse(tools),
                                  ordered_json::parse(kwargs));
}

TEST(DeepSeekV32Encoding, PlainChat) {
  EXPECT_EQ(encode(R"([{"role": "user", "content": "Hi"}])"),
            kBos + kUser + "Hi" + kAssistant + "</think>");
}

TEST(DeepSeekV32Encoding, SystemAndMultiTurn) {
  const char* messages = R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "A?"},
    {"role": "assistant", "content": "B.", "reasoning_content": "dropped"},
    {"role": "user", "content": [{"type": "text", "text": "C"}, {"type": "text", "text": "D"}]}
  ])";
  const std::string turns =
      kUser + "A?" + kAssistant + "</think>" + "B." + kEos + kUser + "C\nD" + kAssistant;
  EXPECT_EQ(encode(messages), kBos + "You are terse." + turns + "</think>");
  // Thinking: only the last user turn opens <think>; earlier reasoning is not rendered.
  const std::string thinking = kBos + "You are terse." + turns + "<think>";
  EXPECT_EQ(encode(messages, R"({"thinking": true})"), thinking);
  EXPECT_EQ(encode(messages, R"({"enable_thinking": true})"), thinking);
  EXPECT_EQ(encode(messages, R"({"thinking": false})"), encode(messages));
}

TEST(DeepSeekV32Encoding, ThinkingModeRendersReasoningAfterTheLastUserTurn) {
  const char* messages = R"([
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": "A", "reasoning": "R"}
  ])";
  EXPECT_EQ(encode(messages, R"({"thinking": true})"),
            kBos + kUser + "Q" + kAssistant + "<think>" + "R</think>A" + kEos);
  // Chat mode never writes reasoning.
  EXPECT_EQ(encode(messages), kBos + kUser + "Q" + kAssistant + "</think>" + "A" + kEos);
  // The reference refuses an answer without reasoning (or tool calls) there.
  EXPECT_THROW(
      encode(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}])",
             R"({"thinking": true})"),
      InvalidArgument);
}

// The tool section of the system turn, written out as the model was trained on it
// (encoding_dsv32.py: no blank lines between its parts).
std::string tools_section(const std::string& schemas) {
  return "## Tools\n"
         "You have access to a set of tools you can use to answer the user's question.\n"
         "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the "
         "following as part of your reply to the user:\n"
         "<｜DSML｜function_calls>\n"
         "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
         "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
         "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n"
         "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n...\n</｜DSML｜invoke>\n"
         "</｜DSML｜function_calls>\n"
         "String and scalar parameters should be specified as is without any escaping or "
         "quotes, while lists and objects should use JSON format. The \"string\" attribute "
         "should be set to \"true\" for string type parameters and \"false\" for other types "
         "(numbers, booleans, arrays, objects).\n"
         "If the thinking_mode is enabled, then after function results you should strongly "
         "consider outputting a thinking block. Here is an example:\n"
         "<｜DSML｜function_calls>\n...\n</｜DSML｜function_calls>\n"
         "<function_results>\n...\n</function_results>\n"
         "<think>...thinking about results</think>\n"
         "Here are the functions available in JSONSchema format:\n<functions>\n" +
         schemas + "\n</functions>\n";
}

constexpr const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather, °C",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "now", "parameters": {}}}
])";

constexpr const char* kToolConversation = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Weather in Paris and Lyon?"},
  {"role": "assistant", "content": "Checking.", "tool_calls": [
    {"id": "a", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
    {"id": "b", "type": "function",
     "function": {"name": "get_weather",
                  "arguments": {"city": "Lyon", "opts": {"unit": "C", "hours": [1, 2.5]}, "x": true}}}
  ]},
  {"role": "tool", "tool_call_id": "a", "content": "Sunny"},
  {"role": "tool", "tool_call_id": "b", "content": "Rain"}
])";

TEST(DeepSeekV32Encoding, ToolsToolCallsAndResults) {
  const std::string schemas =
      R"({"name": "get_weather", "description": "Weather, °C", "parameters": {"type": "object", )"
      R"("properties": {"city": {"type": "string"}}}})"
      "\n"
      R"({"name": "now", "parameters": {}})";
  const std::string calls =
      "\n\n<｜DSML｜function_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Lyon</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">"
      R"({"unit": "C", "hours": [1, 2.5]})"
      "</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"x\" string=\"false\">true</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜function_calls>";
  const std::string results =
      "\n\n<function_results>\n<result>Sunny</result>\n<result>Rain</result>\n"
      "</function_results>\n\n";
  // The tools are a system turn of their own, before the client's system turn.
  const std::string head = kBos + "\n\n" + tools_section(schemas) + "Be brief." + kUser +
                           "Weather in Paris and Lyon?" + kAssistant;
  EXPECT_EQ(encode(kToolConversation, "null", kTools),
            head + "</think>" + "Checking." + calls + kEos + results + "</think>");
  // Thinking: the calling turn after the last user turn gets an (empty) closed thought, and
  // the results reopen one.
  EXPECT_EQ(encode(kToolConversation, R"({"thinking": true})", kTools),
            head + "<think>" + "</think>Checking." + calls + kEos + results + "<think>");
}

TEST(DeepSeekV32Encoding, RefusesWhatTheReferenceRefuses) {
  EXPECT_THROW(encode(R"([{"role": "tool", "content": "x"}])"), InvalidArgument);
  EXPECT_THROW(encode(R"([{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a"},
                          {"role": "tool", "content": "x"}])"),
               InvalidArgument);
  EXPECT_THROW(encode(R"([{"role": "wizard", "content": "x"}])"), InvalidArgument);
  EXPECT_THROW(encode(R"([{"role": "assistant", "tool_calls": [
                            {"function": {"name": "f", "arguments": "[1]"}}]}])"),
               InvalidArgument);
}

TEST(DeepSeekV32Encoding, ThinkingFlagFollowsVllm) {
  EXPECT_FALSE(deepseek_v32_thinking(nullptr));
  EXPECT_FALSE(deepseek_v32_thinking(ordered_json::parse(R"({"thinking": false})")));
  EXPECT_TRUE(deepseek_v32_thinking(ordered_json::parse(R"({"thinking": true})")));
  EXPECT_TRUE(deepseek_v32_thinking(ordered_json::parse(R"({"enable_thinking": 1})")));
}

}  // namespace
}  // namespace hyserve
