// The real OpenAI server in the test process: the bundled model (models/tiny-kimi-k3) on
// the CPU, its tokenizer and chat template, an engine thread and the HTTP server on an
// ephemeral loopback port, for tests that talk to it over sockets (http_test_client.h).
// Used by utf8_responses_test.cpp and http_half_close_test.cpp.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "server/openai_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace hyserve::test {

inline const std::filesystem::path& tiny_model_dir() {
  static const std::filesystem::path dir =
      std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
  return dir;
}

// Declared in stop order: the HTTP server goes first (its in-flight generations abort
// into a live engine), then the engine.
class TinyOpenAIServer {
 public:
  static constexpr const char* kModelName = "tiny";

  explicit TinyOpenAIServer(int64_t max_num_seqs = 256) {
    tokenizer_ = Tokenizer::load(tiny_model_dir());
    std::unique_ptr<Model> model = Model::load(tiny_model_dir());
    EngineConfig config;
    config.scheduler.max_model_len = 256;
    config.scheduler.max_num_seqs = max_num_seqs;
    config.scheduler.max_num_batched_tokens = 1024;
    config = complete_engine_config(*model, config);
    engine_ = std::make_unique<Engine>(std::move(model), config);
    engine_->start();
    OpenAIServerOptions options;
    options.port = 0;
    options.served_model_names = {kModelName};
    options.model_root = tiny_model_dir().string();
    server_ = std::make_unique<OpenAIServer>(options, *engine_, *tokenizer_,
                                             load_chat_templates(tiny_model_dir()),
                                             load_special_tokens(tiny_model_dir()));
    server_->start();
  }
  ~TinyOpenAIServer() {
    server_.reset();
    engine_->stop();
  }
  TinyOpenAIServer(const TinyOpenAIServer&) = delete;
  TinyOpenAIServer& operator=(const TinyOpenAIServer&) = delete;

  int port() const { return server_->port(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const Engine& engine() const { return *engine_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<OpenAIServer> server_;
};

// A POST of a JSON body, as an SDK sends it.
inline std::string json_post(std::string_view path, std::string_view body) {
  return str_cat("POST ", path, " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n",
                 "Content-Length: ", body.size(), "\r\n\r\n", body);
}

}  // namespace hyserve::test
