#include "client/openai_stream.h"

#include <nlohmann/json.hpp>

namespace hyserve::client {
namespace {

using nlohmann::json;

bool non_empty_string(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

// True when a choice of a chunk carries output: completion text, or a chat delta's content,
// reasoning or tool calls.
bool carries_output(const json& choice) {
  if (!choice.is_object()) return false;
  if (non_empty_string(choice, "text")) return true;
  const auto ids = choice.find("token_ids");
  if (ids != choice.end() && ids->is_array() && !ids->empty()) return true;
  const auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return false;
  if (non_empty_string(*delta, "content") || non_empty_string(*delta, "reasoning") ||
      non_empty_string(*delta, "reasoning_content"))
    return true;
  const auto tools = delta->find("tool_calls");
  return tools != delta->end() && tools->is_array() && !tools->empty();
}

std::optional<int64_t> int_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

}  // namespace

std::string openai_request_body(const BenchRequest& request, const OpenAIRequestOptions& options) {
  json body;
  body["model"] = options.model;
  if (options.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", request.prompt_text}}});
    body["max_completion_tokens"] = request.output_len;
  } else {
    if (request.prompt_ids.empty()) {
      body["prompt"] = request.prompt_text;
    } else {
      body["prompt"] = request.prompt_ids;
    }
    body["max_tokens"] = request.output_len;
  }
  body["temperature"] = 0.0;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.return_token_ids) body["return_token_ids"] = true;
  return body.dump();
}

std::string error_message_of(std::string_view body) {
  constexpr size_t kMaxChars = 300;
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    const auto error = j.find("error");
    if (error != j.end() && error->is_object() && non_empty_string(*error, "message"))
      return (*error)["message"].get<std::string>();
    if (error != j.end() && error->is_string()) return error->get<std::string>();
  }
  return std::string(body.substr(0, kMaxChars));
}

void StreamAccumulator::on_event(std::string_view data, double t_s) {
  if (ended()) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    error_ = "malformed SSE event (not a JSON object): " + std::string(data.substr(0, 200));
    return;
  }
  if (const auto error = j.find("error"); error != j.end() && !error->is_null()) {
    error_ = "error event: " + error_message_of(data);
    return;
  }
  if (const auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    usage_prompt_tokens_ = int_field(*usage, "prompt_tokens");
    usage_completion_tokens_ = int_field(*usage, "completion_tokens");
  }
  const auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() ||
      !carries_output((*choices)[0]))
    return;
  const json& choice = (*choices)[0];
  if (const auto ids = choice.find("token_ids"); ids != choice.end() && ids->is_array()) {
    for (const json& id : *ids)
      if (id.is_number_integer()) token_ids_.push_back(id.get<int32_t>());
  }
  if (num_output_chunks_ == 0) {
    first_s_ = t_s;
  } else {
    itl_s_.push_back(t_s - last_s_);
  }
  last_s_ = t_s;
  ++num_output_chunks_;
}

RequestOutcome StreamAccumulator::finish(double end_s, const std::string& transport_error) const {
  RequestOutcome o;
  o.prompt_len = usage_prompt_tokens_.value_or(prompt_len_);
  if (!error_.empty()) {
    o.error = error_;
  } else if (!transport_error.empty()) {
    o.error = transport_error;
  } else if (!done_) {
    o.error = "the stream ended without data: [DONE]";
  } else if (num_output_chunks_ == 0) {
    o.error = "no chunk carrying output was received (no TTFT)";
  }
  if (!o.error.empty()) return o;
  o.success = true;
  o.ttft_s = first_s_;
  o.latency_s = end_s;
  o.itl_s = itl_s_;
  o.output_token_ids = token_ids_;
  o.output_tokens = usage_completion_tokens_.value_or(num_output_chunks_);
  return o;
}

}  // namespace hyserve::client
