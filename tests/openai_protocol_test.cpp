#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hyserve {
namespace {

using nlohmann::ordered_json;

std::vector<std::string> keys(const ordered_json& object) {
  std::vector<std::string> out;
  for (const auto& [key, value] : object.items()) out.push_back(key);
  return out;
}

using Keys = std::vector<std::string>;

// Parses `body` expecting a RequestError; returns it for checks on status and param.
template <typename Parse>
RequestError expect_error(Parse parse, const std::string& body) {
  try {
    parse(body);
  } catch (const RequestError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return RequestError("", "");
}

RequestError chat_error(const std::string& body) {
  return expect_error(parse_chat_completion_request, body);
}

RequestError completion_error(const std::string& body) {
  return expect_error(parse_completion_request, body);
}

const std::string kUser = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(OpenAIProtocolChat, ParsesEveryField) {
  const auto r = parse_chat_completion_request(R"({
    "model": "kimi", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
       "name": "bob"},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "functions.f:0", "type": "function",
                       "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
      {"role": "assistant", "content": "ok", "reasoning": "r2"}],
    "max_tokens": 10, "max_completion_tokens": 12, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "seed": 7, "n": 2, "stop": ["x", "yy"],
    "stop_token_ids": [1, 2], "ignore_eos": true, "min_tokens": 3, "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 5,
    "prompt_logprobs": 2, "echo": true, "presence_penalty": 0.1, "frequency_penalty": -0.2,
    "repetition_penalty": 1.1, "logit_bias": {"5": 1.5, "7": -100},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
    "chat_template_kwargs": {"thinking": false}, "skip_special_tokens": false,
    "include_stop_str_in_output": true, "user": "u1", "priority": -1, "cache_salt": "salt",
    "frobnicate": 1})");
  EXPECT_EQ(r.model, "kimi");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(*r.messages[0].content, "be brief");
  EXPECT_EQ(*r.messages[1].content, "a\nb");
  EXPECT_EQ(*r.messages[1].name, "bob");
  EXPECT_FALSE(r.messages[2].content.has_value());
  EXPECT_EQ(*r.messages[2].reasoning, "hmm");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "functions.f:0");
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "f");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(*r.messages[3].tool_call_id, "functions.f:0");
  EXPECT_EQ(*r.messages[4].reasoning, "r2");
  EXPECT_EQ(r.messages_json.size(), 5u);
  const SamplingParams& s = r.sampling;
  EXPECT_EQ(*s.max_tokens, 12);
  EXPECT_EQ(s.temperature, 0.5f);
  EXPECT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(*s.seed, 7u);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.top_logprobs, 5);
  EXPECT_EQ(*s.logprobs, 5);
  EXPECT_EQ(*s.prompt_logprobs, 2);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(s.presence_penalty, 0.1f);
  EXPECT_EQ(s.frequency_penalty, -0.2f);
  EXPECT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_EQ(s.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, 1.5f}, {7, -100.0f}}));
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["parameters"].dump(), R"({"z":1,"a":2})");  // order kept
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::kNamed);
  EXPECT_EQ(r.tool_choice.function_name, "f");
  EXPECT_EQ(r.response_format.type, "json_schema");
  EXPECT_EQ(r.response_format.json_schema["name"], "s");
  EXPECT_FALSE(r.thinking_enabled());
  EXPECT_FALSE(s.skip_special_tokens);
  EXPECT_TRUE(s.include_stop_str_in_output);
  EXPECT_EQ(*r.user, "u1");
  EXPECT_EQ(r.priority, -1);
  EXPECT_EQ(*r.cache_salt, "salt");
  EXPECT_EQ(r.guided.kind, GuidedDecoding::Kind::kJsonSchema);
  EXPECT_EQ(r.guided.param, "response_format.json_schema.schema");
  EXPECT_EQ(r.unknown_fields, (std::vector<std::string>{"frobnicate"}));
}

TEST(OpenAIProtocolChat, DefaultsAndNulls) {
  const auto r = parse_chat_completion_request(
      "{" + kUser + R"(, "temperature": null, "stop": "end", "max_tokens": 5, "top_k": 3.0})");
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"end"}));
  EXPECT_EQ(*r.sampling.max_tokens, 5);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.sampling.logprobs.has_value());
  EXPECT_TRUE(r.thinking_enabled());
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::kNone);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.unknown_fields.empty());
  const auto with_tools = parse_chat_completion_request(
      "{" + kUser +
      R"(, "logprobs": true, "tools": [{"type": "function", "function": {"name": "g"}}]})");
  EXPECT_EQ(with_tools.tool_choice.mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(*with_tools.sampling.logprobs, 0);
  for (const auto& [text, mode] : std::vector<std::pair<std::string, ToolChoiceMode>>{
           {"none", ToolChoiceMode::kNone},
           {"auto", ToolChoiceMode::kAuto},
           {"required", ToolChoiceMode::kRequired}}) {
    const auto req = parse_chat_completion_request(
        "{" + kUser +
        R"(, "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": ")" + text +
        "\"}");
    EXPECT_EQ(req.tool_choice.mode, mode) << text;
  }
}

TEST(OpenAIProtocolChat, Errors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", ""},
      {"[1]", ""},
      {R"({"model": "m"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {}}]}]})",
       "messages[1].tool_calls[0].function.name"},
      {"{" + kUser + R"(, "temperature": "hot"})", "temperature"},
      {"{" + kUser + R"(, "max_tokens": 1.5})", "max_tokens"},
      {"{" + kUser + R"(, "stream": 1})", "stream"},
      {"{" + kUser + R"(, "stop": [1]})", "stop[0]"},
      {"{" + kUser + R"(, "n": 0})", "n"},
      {"{" + kUser + R"(, "top_logprobs": 2})", "top_logprobs"},
      {"{" + kUser + R"(, "logprobs": false, "top_logprobs": 0})", "top_logprobs"},
      {"{" + kUser + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {"{" + kUser + R"(, "logprobs": true, "top_logprobs": -2})", "top_logprobs"},
      {"{" + kUser + R"(, "logprobs": 3})", "logprobs"},
      {"{" + kUser + R"(, "stream_options": {"include_usage": true}})", "stream_options"},
      {"{" + kUser + R"(, "stream": false, "stream_options": {}})", "stream_options"},
      {"{" + kUser + R"(, "logit_bias": {"abc": 1}})", "logit_bias"},
      {"{" + kUser + R"(, "logit_bias": {"-3": 1}})", "logit_bias"},
      {"{" + kUser + R"(, "logit_bias": {"12x": 1}})", "logit_bias"},
      {"{" + kUser + R"(, "logit_bias": {"3": "a"}})", "logit_bias.3"},
      {"{" + kUser + R"(, "tool_choice": "required"})", "tool_choice"},
      {"{" + kUser + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})",
       "tool_choice"},
      {"{" + kUser +
           R"(, "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": {"type": "function", "function": {"name": "f"}}})",
       "tool_choice"},
      {"{" + kUser +
           R"(, "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": "sometimes"})",
       "tool_choice"},
      {"{" + kUser + R"(, "tools": {"a": 1}})", "tools"},
      {"{" + kUser + R"(, "tools": [{"type": "function", "function": {}}]})",
       "tools[0].function.name"},
      {"{" + kUser + R"(, "response_format": {"type": "xml"}})", "response_format.type"},
      {"{" + kUser + R"(, "response_format": {"type": "json_schema"}})",
       "response_format.json_schema"},
      {"{" + kUser + R"(, "chat_template_kwargs": [1]})", "chat_template_kwargs"},
      {"{" + kUser + R"(, "stop_token_ids": [1, "2"]})", "stop_token_ids[1]"},
      {"{" + kUser + R"(, "seed": 1e30})", "seed"},
  };
  for (const auto& [body, param] : cases) {
    const RequestError e = chat_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
  }
  EXPECT_STREQ(chat_error("{" + kUser + R"(, "top_logprobs": 2})").what(),
               "when using `top_logprobs`, `logprobs` must be set to true.");
  EXPECT_STREQ(chat_error("{" + kUser + R"(, "stream_options": {}})").what(),
               "Stream options can only be defined when `stream=True`.");
  EXPECT_STREQ(chat_error("{" + kUser + R"(, "tool_choice": "required"})").what(),
               "When using `tool_choice`, `tools` must be set.");
}

TEST(OpenAIProtocolCompletion, PromptForms) {
  auto r =
      parse_completion_request(R"({"model": "m", "prompt": "hello", "logprobs": 3, "echo": true})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "hello");
  EXPECT_EQ(*r.sampling.logprobs, 3);
  EXPECT_TRUE(r.echo);
  r = parse_completion_request(R"({"prompt": ["a", "b"]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::string>(r.prompts[1]), "b");
  r = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  r = parse_completion_request(R"({"prompt": [[1], [2, 3]], "unknown": 1})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[1]), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(r.unknown_fields, (std::vector<std::string>{"unknown"}));
  EXPECT_FALSE(r.sampling.logprobs.has_value());
}

TEST(OpenAIProtocolCompletion, Errors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model": "m"})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [[1], []]})", "prompt"},
      {R"({"prompt": ["a", 1]})", "prompt[1]"},
      {R"({"prompt": [1, "a"]})", "prompt[1]"},
      {R"({"prompt": [[1], ["a"]]})", "prompt[1][0]"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "n": -1})", "n"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "a", "echo": "yes"})", "echo"},
  };
  for (const auto& [body, param] : cases) {
    const RequestError e = completion_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
  }
  EXPECT_STREQ(completion_error(R"({"prompt": "a", "logprobs": 21})").what(),
               "Requested sample logprobs of 21, which is greater than max allowed: 20");
}

// Issue 25: what vLLM does with these fields.
TEST(OpenAIProtocol, NumbersBeyondADoubleAreNamedByTheirPath) {
  const std::string big(5000, '9');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "a", "foo": 1e999})", "foo"},
      {R"({"prompt": "a", "foo": -1e999})", "foo"},
      {R"({"prompt": "a", "x": {"y": [1, 2, )" + big + "]}}", "x.y[2]"},
      {R"({"prompt": [1, )" + big + "]}", "prompt[1]"},
      {"[" + big + "]", "[0]"},
  };
  for (const auto& [body, param] : cases) {
    const RequestError e = completion_error(body);
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), param) << e.what();
    EXPECT_EQ(std::string(e.what()).find("999"), std::string::npos) << e.what();
  }
  // Keys quoted in the path are cut short; syntax errors keep nlohmann's position.
  const RequestError long_key = completion_error(R"({")" + std::string(1000, 'k') + R"(": 1e999})");
  EXPECT_LT(std::string(long_key.what()).size(), 200u) << long_key.what();
  const RequestError syntax = completion_error(R"({"prompt": "a", "n": 1x})");
  EXPECT_EQ(std::string(syntax.what()).rfind("Invalid JSON body: parse error at line 1", 0), 0u)
      << syntax.what();
  EXPECT_EQ(parse_completion_request(R"({"prompt": "a", "tiny": 1e-999})").prompts.size(), 1u);
}

TEST(OpenAIProtocolCompletion, EchoWithMaxTokensZeroScoresThePrompt) {
  // vLLM: the engine samples one token, which the response leaves out.
  const CompletionRequest r =
      parse_completion_request(R"({"prompt": "a b", "echo": true, "max_tokens": 0})");
  EXPECT_TRUE(r.score_prompt);
  EXPECT_EQ(*r.sampling.max_tokens, 1);
  EXPECT_NO_THROW(validate_prompt(std::vector<int32_t>{1, 2}, r.sampling, {100, 64}));
  EXPECT_TRUE(
      parse_completion_request(R"({"prompt": "a", "echo": true, "max_completion_tokens": 0})")
          .score_prompt);
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "a", "echo": true})").score_prompt);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "echo": true, "max_tokens": 0, "min_tokens": 1})")
                .param(),
            "min_tokens");
  // Without echo, 0 stays out of range.
  const CompletionRequest plain = parse_completion_request(R"({"prompt": "a", "max_tokens": 0})");
  EXPECT_FALSE(plain.score_prompt);
  try {
    validate_prompt(std::vector<int32_t>{1}, plain.sampling, {100, 64});
    ADD_FAILURE() << "max_tokens 0 without echo accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param(), "max_tokens");
  }
}

TEST(OpenAIProtocolCompletion, VllmFields) {
  // max_tokens: 16 when absent, none (the context's end) when null.
  EXPECT_EQ(*parse_completion_request(R"({"prompt": "a"})").sampling.max_tokens,
            kDefaultCompletionMaxTokens);
  EXPECT_EQ(kDefaultCompletionMaxTokens, 16);
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "a", "max_tokens": null})")
                   .sampling.max_tokens.has_value());
  EXPECT_EQ(*parse_completion_request(R"({"prompt": "a", "max_tokens": 3})").sampling.max_tokens,
            3);
  // Chat has no default.
  EXPECT_FALSE(parse_chat_completion_request("{" + kUser + "}").sampling.max_tokens.has_value());

  EXPECT_EQ(parse_completion_request(R"({"prompt": "a", "n": 2, "best_of": 2})").n, 2);
  for (const char* body :
       {R"({"prompt": "a", "best_of": 2})", R"({"prompt": "a", "n": 3, "best_of": 2})",
        R"({"prompt": "a", "best_of": 0})"}) {
    EXPECT_EQ(completion_error(body).param(), "best_of") << body;
  }
  EXPECT_EQ(completion_error(R"({"prompt": "a", "suffix": ""})").param(), "suffix");
  EXPECT_STREQ(completion_error(R"({"prompt": "a", "suffix": "b"})").what(),
               "suffix is not currently supported");
  for (const char* body : {R"({"prompt": ""})", R"({"prompt": []})", R"({"prompt": [[]]})",
                           R"({"prompt": [""]})", R"({"prompt": ["a", ""]})"}) {
    const RequestError e = completion_error(body);
    EXPECT_EQ(e.param(), "prompt") << body;
    EXPECT_STREQ(e.what(), "The prompt is empty.") << body;
  }
  const auto r = parse_completion_request(
      R"({"prompt": "a", "stream": true, "request_id": "r1", "return_token_ids": true,
          "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  EXPECT_TRUE(r.continuous_usage);
  EXPECT_TRUE(r.return_token_ids);
  EXPECT_EQ(*r.request_id, "r1");
  // continuous_usage_stats only with include_usage, as in vLLM.
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "a", "stream": true,
                   "stream_options": {"continuous_usage_stats": true}})")
                   .continuous_usage);
}

TEST(OpenAIProtocolChat, DeveloperRoleAndContinuation) {
  const auto r = parse_chat_completion_request(
      R"({"messages": [{"role": "developer", "content": "rules"},
                       {"role": "assistant", "content": "Once"}],
          "continue_final_message": true, "echo": true})");
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages_json[0]["role"], "system");
  EXPECT_EQ(r.messages_json[0]["content"], "rules");
  EXPECT_TRUE(r.continue_final_message);
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(parse_chat_completion_request("{" + kUser + "}").add_generation_prompt);
  EXPECT_EQ(chat_error("{" + kUser +
                       R"(, "continue_final_message": true, "add_generation_prompt": true})")
                .param(),
            "continue_final_message");
  const auto t = parse_tokenize_request(
      R"({"messages": [{"role": "developer", "content": "x"}], "add_generation_prompt": false})");
  EXPECT_EQ(t.messages_json[0]["role"], "system");
  EXPECT_FALSE(t.add_generation_prompt);
  EXPECT_EQ(*parse_tokenize_request(R"({"prompt": "hi"})").prompt, "hi");
  EXPECT_EQ(expect_error(parse_tokenize_request, R"({"messages": [{"role": "user",
                 "content": "x"}], "add_generation_prompt": "yes"})")
                .param(),
            "add_generation_prompt");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, 2]})"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(expect_error(parse_detokenize_request, R"({"tokens": [1, 2.5]})").param(), "tokens[1]");
}

TEST(OpenAIProtocolChat, CutAfterFinalMessage) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "user", "content": "Once"}, {"role": "assistant", "content": "Once upon "}])");
  // The prompt ends right after the last occurrence of the content; its trailing space is
  // kept when the template kept it, dropped when the template trimmed it.
  EXPECT_EQ(cut_after_final_message("<u>Once</u><a>Once upon </a>", messages),
            "<u>Once</u><a>Once upon ");
  EXPECT_EQ(cut_after_final_message("<u>Once</u><a>Once upon</a>", messages),
            "<u>Once</u><a>Once upon");
  const ordered_json parts = ordered_json::parse(
      R"([{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                           {"type": "text", "text": "bc"}]}])");
  EXPECT_EQ(cut_after_final_message("<a>a\nbc</a>", parts), "<a>a\nbc");
  EXPECT_EQ(expect_error([&](const std::string& r) { return cut_after_final_message(r, messages); },
                         "<a>dropped</a>")
                .param(),
            "continue_final_message");
}

TEST(OpenAIProtocolResponse, RequestIdsAndRoles) {
  EXPECT_EQ(make_response_meta("chatcmpl", "m", "trace-1").id, "chatcmpl-trace-1");
  EXPECT_EQ(make_response_meta("cmpl", "m").id.size(), 5u + 32u);
  EXPECT_EQ(random_hex(8).size(), 8u);
  const ResponseMeta meta{"chatcmpl-abc", 1700000000, "kimi"};
  EXPECT_EQ(chat_role_chunk_json(meta, 0, "user")["choices"][0]["delta"]["role"], "user");
  ChatChoice choice;
  choice.role = "user";
  choice.content = "x";
  choice.finish_reason = "stop";
  EXPECT_EQ(chat_completion_json(meta, {choice}, {})["choices"][0]["message"]["role"], "user");
}

TEST(OpenAIProtocol, ValidatePromptNamesTheField) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const RequestLimits limits{100, 50};
  SamplingParams s;
  EXPECT_NO_THROW(validate_prompt(prompt, s, limits));
  const auto param_of = [&](const std::vector<int32_t>& p, const SamplingParams& sp) {
    try {
      validate_prompt(p, sp, limits);
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param() + ": " + e.what();
    }
    return std::string("no error");
  };
  s.top_p = 0.0f;
  EXPECT_EQ(param_of(prompt, s), "top_p: top_p must be in (0, 1], got 0");
  s.top_p = 1.0f;
  s.stop_token_ids = {100};
  EXPECT_EQ(param_of(prompt, s),
            "stop_token_ids: stop_token_ids: token id 100 out of range [0, 100)");
  s.stop_token_ids = {};
  s.logit_bias = {{-1, 1.0f}};
  EXPECT_EQ(param_of(prompt, s), "logit_bias: logit_bias token id -1 out of range [0, 100)");
  s.logit_bias = {};
  s.max_tokens = 51;
  EXPECT_EQ(param_of(prompt, s).substr(0, 12), "max_tokens: ");
  s.max_tokens.reset();
  EXPECT_EQ(param_of({1, 100}, s), "prompt: Token id 100 is out of vocabulary [0, 100).");
  EXPECT_EQ(param_of({}, s), "prompt: The prompt is empty.");
}

TEST(OpenAIProtocol, PromptLength) {
  const RequestLimits limits{100, 16};
  SamplingParams s;
  s.max_tokens = 6;
  EXPECT_NO_THROW(validate_prompt(std::vector<int32_t>(10, 1), s, limits));
  s.max_tokens.reset();
  EXPECT_NO_THROW(validate_prompt(std::vector<int32_t>(15, 1), s, limits));
  // A prompt of max_model_len tokens leaves no room for an output.
  try {
    validate_prompt(std::vector<int32_t>(16, 1), s, limits);
    ADD_FAILURE() << "no error";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(std::string(e.what()).rfind("This model's maximum context length is 16 tokens.", 0),
              0u);
  }
  s.max_tokens = 7;
  try {
    validate_prompt(std::vector<int32_t>(10, 1), s, limits);
    ADD_FAILURE() << "no error";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param(), "max_tokens");
  }
}

ResponseMeta meta() {
  return {"chatcmpl-abc", 1700000000, "kimi"};
}

TEST(OpenAIProtocolResponse, MetaIdsAreRandomHex) {
  const auto a = make_response_meta("chatcmpl", "m");
  const auto b = make_response_meta("cmpl", "m");
  EXPECT_EQ(a.id.size(), 9u + 32u);
  EXPECT_EQ(a.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(b.id.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.id.find_first_not_of("0123456789abcdef", 9), std::string::npos);
  EXPECT_NE(a.id.substr(9), b.id.substr(5));
  EXPECT_GT(a.created, 1600000000);
  EXPECT_EQ(a.model, "m");
}

TEST(OpenAIProtocolResponse, ChatCompletionShape) {
  ChatChoice plain;
  plain.content = "hello";
  plain.finish_reason = "stop";
  ChatChoice with_tools;
  with_tools.index = 1;
  with_tools.reasoning = "think";
  with_tools.tool_calls = {{"functions.f:0", "f", "{}"}};
  with_tools.logprobs = std::vector<TokenLogprob>{
      {"é", -0.5f, {{"é", -0.5f}, {"a", -std::numeric_limits<float>::infinity()}}}};
  with_tools.finish_reason = "tool_calls";
  with_tools.stop_reason = 163586;
  const auto j = chat_completion_json(meta(), {plain, with_tools}, {7, 3, 4});
  EXPECT_EQ(keys(j), (Keys{"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(keys(j["choices"][0]),
            (Keys{"index", "message", "logprobs", "finish_reason", "stop_reason"}));
  EXPECT_EQ(j["choices"][0]["message"].dump(),
            R"({"role":"assistant","content":"hello","reasoning":null})");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(j["choices"][0]["stop_reason"].is_null());
  EXPECT_EQ(
      j["choices"][1]["message"].dump(),
      R"({"role":"assistant","content":null,"reasoning":"think","tool_calls":[{"id":"functions.f:0","type":"function","function":{"name":"f","arguments":"{}"}}]})");
  EXPECT_EQ(
      j["choices"][1]["logprobs"].dump(),
      R"({"content":[{"token":"é","logprob":-0.5,"bytes":[195,169],"top_logprobs":[{"token":"é","logprob":-0.5,"bytes":[195,169]},{"token":"a","logprob":-9999.0,"bytes":[97]}]}]})");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][1]["stop_reason"], 163586);
  EXPECT_EQ(
      j["usage"].dump(),
      R"({"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}})");
}

TEST(OpenAIProtocolResponse, CompletionShape) {
  CompletionChoice choice;
  choice.text = "hi there";
  choice.logprobs = std::vector<TokenLogprob>{{"hé", std::nullopt, {}},
                                              {" t", -1.0f, {{" t", -1.0f}, {" x", -2.0f}}}};
  choice.text_offset = 3;
  choice.finish_reason = "length";
  const auto j = completion_json({"cmpl-1", 5, "m"}, {choice}, {2, 2, 0});
  EXPECT_EQ(keys(j), (Keys{"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(keys(j["choices"][0]),
            (Keys{"index", "text", "logprobs", "finish_reason", "stop_reason"}));
  EXPECT_EQ(
      j["choices"][0]["logprobs"].dump(),
      R"({"text_offset":[3,5],"token_logprobs":[null,-1.0],"tokens":["hé"," t"],"top_logprobs":[null,{" t":-1.0," x":-2.0}]})");
}

TEST(OpenAIProtocolResponse, ChatChunks) {
  const auto role = chat_role_chunk_json(meta(), 2);
  EXPECT_EQ(
      role.dump(),
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"kimi","choices":[{"index":2,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})");
  ChatChunkChoice content;
  content.delta.content = "x";
  content.delta.reasoning = "r";
  EXPECT_EQ(
      chat_chunk_json(meta(), {content})["choices"].dump(),
      R"([{"index":0,"delta":{"content":"x","reasoning":"r"},"logprobs":null,"finish_reason":null}])");
  ChatChunkChoice tools;
  tools.delta.tool_calls = {{0, "functions.f:0", "f", ""}, {0, std::nullopt, std::nullopt, "{\"a"}};
  EXPECT_EQ(
      chat_chunk_json(meta(), {tools})["choices"][0]["delta"].dump(),
      R"({"tool_calls":[{"index":0,"id":"functions.f:0","type":"function","function":{"name":"f","arguments":""}},{"index":0,"function":{"arguments":"{\"a"}}]})");
  ChatChunkChoice last;
  last.finish_reason = "stop";
  last.stop_reason = "END";
  EXPECT_EQ(
      chat_chunk_json(meta(), {last})["choices"].dump(),
      R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":"END"}])");
  const auto usage = chat_usage_chunk_json(meta(), {1, 2, 0});
  EXPECT_EQ(keys(usage), (Keys{"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_TRUE(usage["choices"].is_array() && usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 3);
}

TEST(OpenAIProtocolResponse, CompletionChunks) {
  CompletionChunkChoice piece;
  piece.text = "ab";
  EXPECT_EQ(
      completion_chunk_json({"cmpl-1", 5, "m"}, {piece}).dump(),
      R"({"id":"cmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"ab","logprobs":null,"finish_reason":null}]})");
  piece.finish_reason = "length";
  EXPECT_EQ(keys(completion_chunk_json({"cmpl-1", 5, "m"}, {piece})["choices"][0]),
            (Keys{"index", "text", "logprobs", "finish_reason", "stop_reason"}));
  const auto usage = completion_usage_chunk_json({"cmpl-1", 5, "m"}, {1, 1, 1});
  EXPECT_EQ(usage["object"], "text_completion");
  EXPECT_TRUE(usage["choices"].empty());
}

TEST(OpenAIProtocolResponse, SseAndErrors) {
  EXPECT_EQ(sse_event(ordered_json{{"b", 1}, {"a", "é\n"}}), "data: {\"b\":1,\"a\":\"é\\n\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(error_body(RequestError("top_p", "bad")),
            R"({"error":{"message":"bad","type":"BadRequestError","param":"top_p","code":400}})");
  EXPECT_EQ(
      error_body(404, "no such model"),
      R"({"error":{"message":"no such model","type":"NotFoundError","param":null,"code":404}})");
}

TEST(OpenAIProtocolResponse, Models) {
  EXPECT_EQ(
      models_json({{"kimi", "/models/kimi", 4096, 9}}).dump(),
      R"({"object":"list","data":[{"id":"kimi","object":"model","created":9,"owned_by":"hyserve","root":"/models/kimi","parent":null,"max_model_len":4096}]})");
}

}  // namespace
}  // namespace hyserve
