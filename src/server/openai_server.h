// OpenAIServer: vLLM's OpenAI-compatible routes (SERVING.md) over the HTTP server core:
// /v1/chat/completions, /v1/completions (streaming or not), /v1/models, /health,
// /metrics, /tokenize, /detokenize. Handlers parse and validate, render the chat
// template, tokenize, submit to the engine, and stream or collect the outputs; a client
// that disconnects has its engine requests aborted. A middleware in front of every route
// does what vLLM's middlewares do: CORS (preflights answered on any path), the API key
// for /v1/* only (/health, /metrics, /tokenize, /detokenize stay open), and X-Request-Id
// echoed on the response (a generation also takes it as its id: "chatcmpl-<X-Request-Id>").
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "guided/vocab_trie.h"
#include "server/cors.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace hyserve {

struct Generation;  // server/generation_run.h

struct OpenAIServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  // What clients may pass as "model" (each is listed by /v1/models); the first is the one
  // responses and metrics report, as in vLLM. At least one.
  std::vector<std::string> served_model_names;
  std::string model_root;  // the model folder, for /v1/models' "root"
  std::string api_key;     // empty: no authentication
  bool enable_auto_tool_choice = false;
  // --trust-request-chat-template: a request's "chat_template" is rendered (else a 400).
  bool trust_request_chat_template = false;
  std::string tool_call_parser;  // "kimi_k3", "deepseek_v32" or empty
  std::string reasoning_parser;  // "kimi_k3", "deepseek_v3" or empty
  CorsOptions cors;
  // --skip-tokenizer-init: the tokenizer is a NoTokenizer; token-id prompts only, outputs
  // carry no text (logprob tokens as "token_id:N", ids by return_token_ids).
  bool skip_tokenizer_init = false;
  // The most sequences (prompts x n) one request may ask for: a larger batch is a 400
  // before any prompt is tokenized.
  int64_t max_sequences_per_request = 1024;
  int max_connections = 65536;  // open HTTP connections; one more gets 503 (HttpServerOptions)
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter exist
  // ($VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM registers them).
  bool allow_runtime_lora_updating = false;
  int idle_timeout_ms =
      5000;  // keep-alive wait for the next request ($VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
  // The development routes (server/control_routes.cpp; $VLLM_SERVER_DEV_MODE=1, as vLLM
  // registers them): /pause /resume /is_paused /reset_prefix_cache /sleep /wake_up
  // /is_sleeping and the weight-transfer routes.
  bool dev_mode = false;
  bool enable_sleep_mode = false;       // --enable-sleep-mode: /sleep may free memory
  std::string weight_transfer_backend;  // --weight-transfer-config's backend ("": folders only)
};

class ControlQueue;
class WeightTransfer;

class OpenAIServer {
 public:
  OpenAIServer(OpenAIServerOptions options, Engine& engine, const Tokenizer& tokenizer,
               ChatTemplates templates, SpecialTokens special_tokens);
  ~OpenAIServer();

  void start();
  void stop();  // stops accepting, lets in-flight requests finish (drain timeout)
  void wait();
  int port() const { return http_.port(); }

 private:
  // The engine's limits on a request (validate_prompt).
  RequestLimits limits() const {
    return {engine_.model().config().vocab_size, engine_.config().scheduler.max_model_len};
  }
  const std::string& model_name() const { return options_.served_model_names.front(); }
  // Throws RequestError when prompts x n is over max_sequences_per_request.
  void check_num_sequences(int64_t num_prompts, int64_t n) const;
  // CORS, X-Request-Id and the API key, before routing (HttpMiddleware).
  void middleware(const HttpRequest& req, HttpResponseWriter& w) const;
  // The prompt the chat template renders; throws RequestError.
  // vLLM's bad_words of the request as id sequences in g.sampling (RequestError when the
  // tokenizer is off or an id is outside the model's vocabulary).
  void set_bad_words(const GenerationRequest& r, Generation& g) const;
  std::string render_chat(const nlohmann::ordered_json& messages,
                          const nlohmann::ordered_json& tools, bool add_generation_prompt,
                          bool continue_final_message,
                          const nlohmann::ordered_json& chat_template_kwargs,
                          const std::optional<std::string>& request_template) const;
  // The model name, engine health and unsupported options of a generation request;
  // answers and returns false (404, 503) or throws RequestError.
  bool admit(const GenerationRequest& r, HttpResponseWriter& w) const;
  // The request's guided decoding as a constraint over this tokenizer (null when none);
  // throws RequestError (400) for a schema outside the supported subset. after_reasoning:
  // constrain only what follows the reasoning end marker.
  std::shared_ptr<const TokenConstraint> make_constraint(const GuidedDecoding& guided,
                                                         bool after_reasoning) const;
  // `grammar` over this tokenizer's vocabulary (after the reasoning end marker when asked).
  std::shared_ptr<const TokenConstraint> constrain(Grammar grammar, bool after_reasoning) const;
  void chat_completions(const HttpRequest& req, HttpResponseWriter& w);
  void completions(const HttpRequest& req, HttpResponseWriter& w);
  void models(const HttpRequest& req, HttpResponseWriter& w);
  void tokenize(const HttpRequest& req, HttpResponseWriter& w);
  void detokenize(const HttpRequest& req, HttpResponseWriter& w);
  // LoRA (server/lora_routes.cpp): the adapter a request's `model` names (empty: the base
  // model or an unknown name), the adapters' /v1/models cards, the run-time routes.
  std::string adapter_name(const std::string& model) const;
  void add_lora_cards(std::vector<ModelCard>& cards) const;
  void load_lora_adapter(const HttpRequest& req, HttpResponseWriter& w);
  void unload_lora_adapter(const HttpRequest& req, HttpResponseWriter& w);
  // Generation control and weight transfer (server/control_routes.cpp): each request's
  // engine call runs on the control thread (they block), its answer sent from there.
  void add_control_routes();

  OpenAIServerOptions options_;
  Engine& engine_;
  const Tokenizer& tokenizer_;
  ChatTemplates templates_;
  SpecialTokens special_tokens_;
  // The tokenizer's vocabulary, for guided decoding; null under --skip-tokenizer-init.
  std::shared_ptr<const VocabTrie> vocab_;
  CorsPolicy cors_;
  ServerMetrics metrics_;
  HttpServer http_;
  int64_t created_;
  std::unique_ptr<WeightTransfer> transfer_;  // dev mode
  std::unique_ptr<ControlQueue> control_;     // dev mode; stopped first (it uses the rest)
};

}  // namespace hyserve
