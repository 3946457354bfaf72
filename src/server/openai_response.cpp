// OpenAI response building: the JSON of full responses, streaming chunks, SSE framing,
// errors and /v1/models; see openai_protocol.h.
#include "server/openai_protocol.h"

#include <chrono>
#include <cmath>
#include <random>

namespace hyserve {

using nlohmann::ordered_json;

int64_t num_code_points(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

ordered_json logprob_value(float logprob) {
  return std::isfinite(logprob) ? logprob : -9999.0f;
}

ordered_json utf8_bytes(const std::string& token) {
  ordered_json bytes = ordered_json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

ordered_json chat_logprobs_json(const std::optional<std::vector<TokenLogprob>>& logprobs) {
  if (!logprobs) return nullptr;
  ordered_json content = ordered_json::array();
  for (const auto& t : *logprobs) {
    ordered_json top = ordered_json::array();
    for (const auto& alt : t.top_logprobs) {
      top.push_back({{"token", alt.token},
                     {"logprob", logprob_value(alt.logprob)},
                     {"bytes", utf8_bytes(alt.token)}});
    }
    content.push_back({{"token", t.token},
                       {"logprob", logprob_value(t.logprob.value_or(0.0f))},
                       {"bytes", utf8_bytes(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

ordered_json completion_logprobs_json(const std::optional<std::vector<TokenLogprob>>& logprobs,
                                      int64_t text_offset) {
  if (!logprobs) return nullptr;
  ordered_json offsets = ordered_json::array();
  ordered_json token_logprobs = ordered_json::array();
  ordered_json tokens = ordered_json::array();
  ordered_json top_logprobs = ordered_json::array();
  for (const auto& t : *logprobs) {
    offsets.push_back(text_offset);
    text_offset += num_code_points(t.token);
    tokens.push_back(t.token);
    if (!t.logprob) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(logprob_value(*t.logprob));
    ordered_json top = ordered_json::object();
    for (const auto& alt : t.top_logprobs) top[alt.token] = logprob_value(alt.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(token_logprobs)},
          {"tokens", std::move(tokens)},
          {"top_logprobs", std::move(top_logprobs)}};
}

ordered_json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

ordered_json tool_call_delta_json(const ToolCallDelta& delta) {
  ordered_json out = {{"index", delta.index}};
  if (delta.id) {
    out["id"] = *delta.id;
    out["type"] = "function";
    out["function"] = {{"name", delta.name.value_or("")}, {"arguments", delta.arguments}};
  } else {
    out["function"] = {{"arguments", delta.arguments}};
  }
  return out;
}

ordered_json optional_string(const std::optional<std::string>& s) {
  return s ? ordered_json(*s) : ordered_json(nullptr);
}

ordered_json response_head(const ResponseMeta& meta, std::string_view object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

std::string random_hex(int num_digits) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < num_digits; ++i) out += kHex[rng() & 15];
  return out;
}

ResponseMeta make_response_meta(std::string_view prefix, std::string model,
                                std::string_view request_id) {
  ResponseMeta meta;
  meta.id = str_cat(prefix, "-", request_id.empty() ? random_hex(32) : std::string(request_id));
  meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  meta.model = std::move(model);
  return meta;
}

ordered_json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

ordered_json chat_completion_json(const ResponseMeta& meta, const std::vector<ChatChoice>& choices,
                                  const Usage& usage) {
  ordered_json out = response_head(meta, "chat.completion");
  ordered_json list = ordered_json::array();
  for (const auto& choice : choices) {
    ordered_json message = {{"role", choice.role},
                            {"content", optional_string(choice.content)},
                            {"reasoning", optional_string(choice.reasoning)}};
    if (!choice.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& call : choice.tool_calls) calls.push_back(tool_call_json(call));
      message["tool_calls"] = std::move(calls);
    }
    list.push_back({{"index", choice.index},
                    {"message", std::move(message)},
                    {"logprobs", chat_logprobs_json(choice.logprobs)},
                    {"finish_reason", choice.finish_reason},
                    {"stop_reason", choice.stop_reason}});
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

ordered_json completion_json(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices,
                             const Usage& usage) {
  ordered_json out = response_head(meta, "text_completion");
  ordered_json list = ordered_json::array();
  for (const auto& choice : choices) {
    list.push_back({{"index", choice.index},
                    {"text", choice.text},
                    {"logprobs", completion_logprobs_json(choice.logprobs, choice.text_offset)},
                    {"finish_reason", choice.finish_reason},
                    {"stop_reason", choice.stop_reason}});
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

ordered_json chat_chunk_json(const ResponseMeta& meta,
                             const std::vector<ChatChunkChoice>& choices) {
  ordered_json out = response_head(meta, "chat.completion.chunk");
  ordered_json list = ordered_json::array();
  for (const auto& choice : choices) {
    ordered_json delta = ordered_json::object();
    if (choice.delta.role) delta["role"] = *choice.delta.role;
    if (choice.delta.content) delta["content"] = *choice.delta.content;
    if (choice.delta.reasoning) delta["reasoning"] = *choice.delta.reasoning;
    if (!choice.delta.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& call : choice.delta.tool_calls) calls.push_back(tool_call_delta_json(call));
      delta["tool_calls"] = std::move(calls);
    }
    ordered_json item = {{"index", choice.index},
                         {"delta", std::move(delta)},
                         {"logprobs", chat_logprobs_json(choice.logprobs)},
                         {"finish_reason", optional_string(choice.finish_reason)}};
    if (choice.finish_reason) item["stop_reason"] = choice.stop_reason;
    list.push_back(std::move(item));
  }
  out["choices"] = std::move(list);
  return out;
}

ordered_json chat_role_chunk_json(const ResponseMeta& meta, int32_t index, std::string_view role) {
  ChatChunkChoice choice;
  choice.index = index;
  choice.delta.role = std::string(role);
  choice.delta.content = "";
  return chat_chunk_json(meta, {choice});
}

ordered_json completion_chunk_json(const ResponseMeta& meta,
                                   const std::vector<CompletionChunkChoice>& choices) {
  ordered_json out = response_head(meta, "text_completion");
  ordered_json list = ordered_json::array();
  for (const auto& choice : choices) {
    ordered_json item = {
        {"index", choice.index},
        {"text", choice.text},
        {"logprobs", completion_logprobs_json(choice.logprobs, choice.text_offset)},
        {"finish_reason", optional_string(choice.finish_reason)}};
    if (choice.finish_reason) item["stop_reason"] = choice.stop_reason;
    list.push_back(std::move(item));
  }
  out["choices"] = std::move(list);
  return out;
}

ordered_json chat_usage_chunk_json(const ResponseMeta& meta, const Usage& usage) {
  ordered_json out = response_head(meta, "chat.completion.chunk");
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return out;
}

ordered_json completion_usage_chunk_json(const ResponseMeta& meta, const Usage& usage) {
  ordered_json out = response_head(meta, "text_completion");
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string dump_json(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string sse_event(const ordered_json& payload) {
  return str_cat("data: ", dump_json(payload), "\n\n");
}

std::string error_body(int status, std::string_view message, std::string_view param) {
  // openai_error_body() sorts keys; clients print them in OpenAI's order.
  const ordered_json error = ordered_json::parse(openai_error_body(status, message))["error"];
  const ordered_json body = {
      {"error",
       {{"message", error["message"]},
        {"type", error["type"]},
        {"param", param.empty() ? ordered_json(nullptr) : ordered_json(param)},
        {"code", error["code"]}}}};
  return dump_json(body);
}

std::string error_body(const RequestError& error) {
  return error_body(error.status(), error.what(), error.param());
}

ordered_json models_json(const std::vector<ModelCard>& models) {
  ordered_json data = ordered_json::array();
  for (const auto& model : models) {
    data.push_back({{"id", model.id},
                    {"object", "model"},
                    {"created", model.created},
                    {"owned_by", "hyserve"},
                    {"root", model.root},
                    {"parent", model.parent ? ordered_json(*model.parent) : ordered_json()},
                    {"max_model_len", model.max_model_len}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace hyserve
