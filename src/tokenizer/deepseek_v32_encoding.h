// DeepSeek-V3.2's chat encoding, built in: the checkpoint ships no Jinja chat template, only
// Python (encoding/encoding_dsv32.py), which vLLM runs in its deepseek_v32 tokenizer. This
// renders the same prompt text:
//
//   <｜begin▁of▁sentence｜>{system}[\n\n## Tools ... <functions>{schemas}</functions>\n]
//   <｜User｜>{user}<｜Assistant｜></think>                 (not the last user turn, or chat mode)
//   <｜User｜>{user}<｜Assistant｜><think>                  (the last user turn in thinking mode)
//   {reasoning</think>}{content}[\n\n<｜DSML｜function_calls>...]<｜end▁of▁sentence｜>
//   \n\n<function_results>\n<result>{tool}</result>...\n</function_results>\n\n<think> or </think>
//
// Reasoning is rendered only for assistant turns after the last user turn, in thinking mode.
// Tools become a system turn of their own placed first (vLLM's rule), JSON printed as Python's
// json.dumps(ensure_ascii=False) prints it. A call's arguments are written as DSML
// parameters: strings as is (string="true"), other values as JSON (string="false").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace hyserve {

inline constexpr std::string_view kDeepSeekBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kDeepSeekEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kDeepSeekUser = "<｜User｜>";
inline constexpr std::string_view kDeepSeekAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kDsmlFunctionCallsBegin = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlFunctionCallsEnd = "</｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvokeBegin = "<｜DSML｜invoke";
inline constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameterBegin = "<｜DSML｜parameter";
inline constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";

// Thinking mode as vLLM decides it for DeepSeek-V3.2, for both the prompt and the
// deepseek_v3 reasoning parser: chat_template_kwargs "thinking" or "enable_thinking" truthy;
// off by default.
bool deepseek_v32_thinking(const nlohmann::ordered_json& chat_template_kwargs);

// messages: OpenAI messages (content a string, null or text parts; developer already mapped
// to system); tools: array or null. Throws InvalidArgument for what the reference rejects:
// an unknown role, a tool result without a matching assistant tool call, a call whose
// arguments are not a JSON object, an assistant turn after the last user turn with neither
// reasoning nor tool calls in thinking mode.
std::string encode_deepseek_v32_chat(const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& chat_template_kwargs);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in order.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace hyserve
