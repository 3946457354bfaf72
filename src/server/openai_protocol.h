// The OpenAI-compatible wire protocol, as vLLM speaks it: request bodies of
// POST /v1/chat/completions and /v1/completions parsed and checked into structs (with the
// SamplingParams they imply), and the JSON of every response the server sends: full
// responses, streaming chunks, SSE framing, errors and /v1/models. No sockets and no
// engine here, so every field rule and response shape is tested on strings. Parsing lives in
// openai_request.cpp, the response JSON in openai_response.cpp.
//
// JSON is nlohmann::ordered_json: messages, tools and chat_template_kwargs go to the chat
// template in the key order the client sent (templates print tool schemas with tojson).
// A JSON null is treated as an absent field, as vLLM's pydantic models do.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "engine/sampling_params.h"
#include "server/http_message.h"
#include "tokenizer/tool_call_parser.h"

namespace hyserve {

// A request the server must refuse: HTTP status (400 unless told) and the OpenAI `param`
// naming the offending field ("temperature", "messages[0].role"; empty when none).
class RequestError : public HttpError {
 public:
  RequestError(std::string param, const std::string& message, int status = 400)
      : HttpError(status, message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// ---- Requests -------------------------------------------------------------------------

struct ChatMessage {
  std::string role;                    // system (developer too) | user | assistant | tool
  std::optional<std::string> content;  // a string, or the text parts joined with "\n"
  std::optional<std::string> name;
  std::vector<ToolCall> tool_calls;         // assistant turns: {id, function.name, arguments}
  std::optional<std::string> tool_call_id;  // tool turns
  std::optional<std::string> reasoning;     // "reasoning" or its alias "reasoning_content"
};

enum class ToolChoiceMode { kNone, kAuto, kRequired, kNamed };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function_name;  // kNamed only
};

// response_format as sent; json_object / json_schema are enforced through `guided`.
struct ResponseFormat {
  std::string type = "text";           // text | json_object | json_schema
  nlohmann::ordered_json json_schema;  // the "json_schema" object, or null
};

// The guided decoding a request asks for, from whichever field: response_format
// (json_object, json_schema), vLLM's guided_json / guided_choice, or
// structured_outputs.{json, choice, json_object}. Regex and grammar forms are refused (400).
struct GuidedDecoding {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kChoice };
  Kind kind = Kind::kNone;
  nlohmann::ordered_json schema;     // kJsonSchema
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the field it came from, for errors ("guided_json")
};

// Fields both endpoints share.
struct GenerationRequest {
  std::string model;
  SamplingParams sampling;  // filled from the body; check with validate_prompt()
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (with include_usage)
  bool echo = false;
  bool tokens_as_ids = false;     // return_tokens_as_token_ids (vLLM): logprob tokens "token_id:N"
  bool return_token_ids = false;  // vLLM's return_token_ids: prompt and output ids in the response
  std::optional<std::string> request_id;  // vLLM's request_id field (X-Request-Id wins)
  ResponseFormat response_format;
  GuidedDecoding guided;
  std::optional<std::string> user;
  int32_t priority = 0;
  std::optional<std::string> cache_salt;
  // vLLM's truncate_prompt_tokens: k >= 1 keeps the prompt's last k tokens, -1 its last
  // max_model_len (truncate_prompt).
  std::optional<int64_t> truncate_prompt_tokens;
  // vLLM's bad_words (words, whitespace-led ones stripped); their ids are the server's to find
  // (bad_words_token_ids needs the tokenizer).
  std::vector<std::string> bad_words;
  // vLLM's add_special_tokens: the tokenizer's special prefix / suffix around a text prompt
  // (Tokenizer::special_prefix); none when unset: then true for completions, false for chat.
  std::optional<bool> add_special_tokens;
  std::vector<std::string> unknown_fields;  // top-level keys we ignore, for a log line
};

struct ChatCompletionRequest : GenerationRequest {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json messages_json;         // as sent (developer -> system), for the template
  nlohmann::ordered_json tools;                 // array as sent, or null
  ToolChoice tool_choice;                       // default: auto with tools, none without
  nlohmann::ordered_json chat_template_kwargs;  // object as sent, or null
  std::optional<std::string> chat_template;     // vLLM's per-request template (trusted only)
  bool logprobs = false;
  std::optional<int32_t> top_logprobs;
  // The template's generation prompt; off when continue_final_message, which instead ends
  // the prompt inside the last message so the model continues it (transformers' rule).
  bool add_generation_prompt = true;
  bool continue_final_message = false;

  // False only when chat_template_kwargs.thinking is false.
  bool thinking_enabled() const;
};

using CompletionPrompt = std::variant<std::string, std::vector<int32_t>>;

// OpenAI's default max_tokens for /v1/completions (vLLM's too); chat has none.
inline constexpr int64_t kDefaultCompletionMaxTokens = 16;

struct CompletionRequest : GenerationRequest {
  std::vector<CompletionPrompt> prompts;  // one per prompt; a choice set of n for each
  // echo with max_tokens 0: each choice is its prompt (with logprobs when asked) and nothing
  // generated. sampling.max_tokens is then 1: the engine's one token is dropped.
  bool score_prompt = false;
};

// POST /tokenize: a prompt string, or messages rendered as a chat request would be.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  nlohmann::ordered_json messages_json;  // null unless messages were sent (developer -> system)
  nlohmann::ordered_json tools;          // array or null
  nlohmann::ordered_json chat_template_kwargs;
  std::optional<std::string> chat_template;
  std::optional<bool> add_special_tokens;  // unset: true for a prompt, false for messages
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// Parse a request body (JSON text). Throw RequestError (400) for bad JSON (a number out of
// a double's range included, named by its path), wrong types and the cross-field rules;
// ranges that depend on the model are left to validate_prompt().
ChatCompletionRequest parse_chat_completion_request(std::string_view body);
CompletionRequest parse_completion_request(std::string_view body);
TokenizeRequest parse_tokenize_request(std::string_view body);
// POST /detokenize: {"tokens": [ids]}.
std::vector<int32_t> parse_detokenize_request(std::string_view body);

// The text the chat template renders for `messages` ending inside the last message, for
// continue_final_message: `rendered` (rendered without a generation prompt) cut right after
// the last message's content (its last text part). Throws RequestError when the template
// dropped that content.
std::string cut_after_final_message(const std::string& rendered,
                                    const nlohmann::ordered_json& messages);

// The part of an exception's text a client should see: CHECK's condition and the
// [file:line] suffix removed.
std::string client_message(std::string_view what);

// validate_request (engine/request.h: the sampling params and vLLM's context-length checks
// on a tokenized prompt) with its InvalidRequest as a RequestError (400) naming the field.
// vLLM's truncate_prompt_tokens on a tokenized prompt: none leaves it; k >= 1 keeps its last k
// tokens, -1 its last max_model_len; k over max_model_len is a RequestError (vLLM's message).
void truncate_prompt(std::vector<int32_t>& prompt, std::optional<int64_t> k, int64_t max_model_len);

void validate_prompt(std::span<const int32_t> prompt, const SamplingParams& params,
                     const RequestLimits& limits);

// ---- Responses ------------------------------------------------------------------------

// What every response and chunk of one request shares.
struct ResponseMeta {
  std::string id;       // "chatcmpl-<32 hex>" / "cmpl-<32 hex>"
  int64_t created = 0;  // unix seconds
  std::string model;
};

// The id "<prefix>-<request_id>" (a client's X-Request-Id, as vLLM names it) or, when
// request_id is empty, "<prefix>-" + 32 random hex digits; and the current time.
ResponseMeta make_response_meta(std::string_view prefix, std::string model,
                                std::string_view request_id = {});

// `num_digits` random hex digits.
std::string random_hex(int num_digits);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

struct TopLogprob {
  std::string token;
  float logprob = 0.0f;
};

// One generated (or echoed prompt) token. logprob is nullopt only for the first prompt
// token of an echoed completion, which has no logprob. -inf is sent as -9999.0, as vLLM does.
struct TokenLogprob {
  std::string token;
  std::optional<float> logprob;
  std::vector<TopLogprob> top_logprobs;
};

struct ChatChoice {
  int32_t index = 0;
  std::string role = "assistant";
  std::optional<std::string> content;                 // null when absent
  std::optional<std::string> reasoning;               // null when absent
  std::vector<ToolCall> tool_calls;                   // key omitted when empty
  std::optional<std::vector<TokenLogprob>> logprobs;  // null when not requested
  std::string finish_reason;                          // stop | length | tool_calls | abort
  nlohmann::ordered_json stop_reason;                 // null, the stop string, or the stop token id
};

struct CompletionChoice {
  int32_t index = 0;
  std::string text;
  std::optional<std::vector<TokenLogprob>> logprobs;
  int64_t text_offset = 0;  // offset (code points) of the first logprob token in `text`
  std::string finish_reason;
  nlohmann::ordered_json stop_reason;
};

// Unicode code points of UTF-8 text: the unit of completion logprobs' text_offset.
int64_t num_code_points(const std::string& text);

nlohmann::ordered_json usage_json(const Usage& usage);
nlohmann::ordered_json chat_completion_json(const ResponseMeta& meta,
                                            const std::vector<ChatChoice>& choices,
                                            const Usage& usage);
nlohmann::ordered_json completion_json(const ResponseMeta& meta,
                                       const std::vector<CompletionChoice>& choices,
                                       const Usage& usage);

// Streaming. A delta's keys appear only when set.
struct ChatDelta {
  std::optional<std::string> role;  // "assistant", on a choice's first chunk
  std::optional<std::string> content;
  std::optional<std::string> reasoning;
  std::vector<ToolCallDelta> tool_calls;
};

struct ChatChunkChoice {
  int32_t index = 0;
  ChatDelta delta;
  std::optional<std::vector<TokenLogprob>> logprobs;
  std::optional<std::string> finish_reason;  // set on a choice's last chunk only
  nlohmann::ordered_json stop_reason;        // sent with finish_reason
};

struct CompletionChunkChoice {
  int32_t index = 0;
  std::string text;
  std::optional<std::vector<TokenLogprob>> logprobs;
  int64_t text_offset = 0;
  std::optional<std::string> finish_reason;
  nlohmann::ordered_json stop_reason;
};

nlohmann::ordered_json chat_chunk_json(const ResponseMeta& meta,
                                       const std::vector<ChatChunkChoice>& choices);
// The first chunk of a choice: delta {"role": role, "content": ""}.
nlohmann::ordered_json chat_role_chunk_json(const ResponseMeta& meta, int32_t index,
                                            std::string_view role = "assistant");
nlohmann::ordered_json completion_chunk_json(const ResponseMeta& meta,
                                             const std::vector<CompletionChunkChoice>& choices);
// The closing usage chunk (stream_options.include_usage): "choices": [].
nlohmann::ordered_json chat_usage_chunk_json(const ResponseMeta& meta, const Usage& usage);
nlohmann::ordered_json completion_usage_chunk_json(const ResponseMeta& meta, const Usage& usage);

// The text of a response body or event: every JSON the server sends is written through
// here. Text the server decodes from tokens is made valid UTF-8 where it is decoded
// (replace_invalid_utf8, so that text_offset counts the characters the client gets); a
// string that still holds invalid UTF-8 gets U+FFFD for each maximal invalid subpart, the
// same rule, instead of failing the response.
std::string dump_json(const nlohmann::ordered_json& j);

// SSE framing: "data: <json>\n\n" and the terminator.
std::string sse_event(const nlohmann::ordered_json& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// {"error": {"message", "type", "param", "code"}}: openai_error_body() with the param set.
std::string error_body(int status, std::string_view message, std::string_view param = {});
std::string error_body(const RequestError& error);

struct ModelCard {
  std::string id;    // served model name
  std::string root;  // model directory (a LoRA adapter: its folder)
  int64_t max_model_len = 0;
  int64_t created = 0;
  std::optional<std::string> parent{};  // a LoRA adapter: the base model's id; else null
};

// GET /v1/models: {"object": "list", "data": [{id, object "model", created, owned_by, root,
// parent null, max_model_len}]}.
nlohmann::ordered_json models_json(const std::vector<ModelCard>& models);

}  // namespace hyserve
