// The LoRA side of the OpenAI server (issue 48; vLLM's shapes): which adapter a request's
// `model` names, the adapters' /v1/models entries, and POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter, which exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (as in
// vLLM). Loading a name that is taken is a 400 unless the body says `load_inplace: true`:
// then the new adapter replaces the old under that name, and requests in flight finish on
// the old one (engine/lora_registry.h).
#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "server/json_body.h"
#include "server/openai_server.h"
#include "util/error.h"

namespace hyserve {

namespace {

// 200 with handler()'s text, or the RequestError it throws as OpenAI error JSON.
template <typename Handler>
void respond(HttpResponseWriter& w, Handler handler) {
  std::string text;
  try {
    text = handler();
  } catch (const RequestError& e) {
    w.send(e.status(), "application/json",
           error_body(e.status(), client_message(e.what()), e.param()));
    return;
  }
  w.send(200, "text/plain; charset=utf-8", text);
}

std::string string_field(const nlohmann::ordered_json& body, const char* key) {
  const auto it = body.find(key);
  return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string OpenAIServer::adapter_name(const std::string& model) const {
  const auto& names = options_.served_model_names;
  if (model.empty() || engine_.loras() == nullptr ||
      std::find(names.begin(), names.end(), model) != names.end()) {
    return {};
  }
  return engine_.loras()->find(model) ? model : std::string();
}

void OpenAIServer::add_lora_cards(std::vector<ModelCard>& cards) const {
  if (engine_.loras() == nullptr) return;
  for (const LoraEntry& e : engine_.loras()->list()) {
    ModelCard card;
    card.id = e.name;
    card.root = e.path.string();
    card.parent = model_name();
    card.max_model_len = engine_.config().scheduler.max_model_len;
    card.created = created_;
    cards.push_back(std::move(card));
  }
}

void OpenAIServer::load_lora_adapter(const HttpRequest& req, HttpResponseWriter& w) {
  respond(w, [&] {
    const nlohmann::ordered_json body = parse_json_body(req.body);
    const std::string name = string_field(body, "lora_name");
    const std::string path = string_field(body, "lora_path");
    if (name.empty() || path.empty()) {
      throw RequestError("", "Both 'lora_name' and 'lora_path' must be provided.");
    }
    if (engine_.loras() == nullptr) {
      throw RequestError("", "LoRA is not enabled: start the server with --enable-lora");
    }
    const auto inplace = body.find("load_inplace");
    const bool replace = inplace != body.end() && inplace->is_boolean() && inplace->get<bool>();
    try {
      engine_.loras()->load(name, path, replace);
    } catch (const Error& e) {
      throw RequestError("lora_path", e.what());
    }
    return "Success: LoRA adapter '" + name + "' added successfully.";
  });
}

void OpenAIServer::unload_lora_adapter(const HttpRequest& req, HttpResponseWriter& w) {
  respond(w, [&] {
    const std::string name = string_field(parse_json_body(req.body), "lora_name");
    if (name.empty()) {
      throw RequestError("", "'lora_name' needs to be provided to unload a LoRA adapter.");
    }
    if (engine_.loras() == nullptr || !engine_.loras()->unload(name)) {
      throw RequestError("lora_name", "The lora adapter '" + name + "' cannot be found.", 404);
    }
    return "Success: LoRA adapter '" + name + "' removed successfully.";
  });
}

}  // namespace hyserve
