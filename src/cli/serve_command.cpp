// `hyserve serve [MODEL_DIR] [flags]`: the OpenAI-compatible server, with vLLM's flag
// names (SERVING.md). Runs until SIGINT / SIGTERM, then drains in-flight requests.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/cuda/device_buffer.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/openai_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace hyserve::cli {
namespace {

struct ServeArgs {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int64_t tensor_parallel_size = 1;
  int64_t decode_context_parallel_size = 1;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "auto";
  std::string index_cache_dtype = "fp8";
  bool enable_prefix_caching = false;
  bool no_enable_prefix_caching = false;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  std::string speculative_config;
  std::string api_key;
  std::string device = "auto";
  bool batch_invariant = false;
};

int device_count_or_zero() {
  if (!cuda_backend_built()) return 0;
#ifdef HYSERVE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

int run_serve(const ServeArgs& a) {
  CHECK(a.tensor_parallel_size == 1, "--tensor-parallel-size ", a.tensor_parallel_size,
        ": this hyserve runs on one device (tensor parallelism is not built yet)");
  CHECK(a.decode_context_parallel_size == 1, "--decode-context-parallel-size ",
        a.decode_context_parallel_size, ": decode context parallelism is not built yet");
  CHECK(a.speculative_config.empty(),
        "--speculative-config: speculative decoding is not built yet");
  CHECK(!a.batch_invariant, "--batch-invariant: the batch-invariant mode is not built yet");
  CHECK(!a.enable_prefix_caching,
        "--enable-prefix-caching: prefix caching needs the packed block cache, not built yet");
  CHECK(a.kv_cache_dtype == "auto", "--kv-cache-dtype ", a.kv_cache_dtype,
        ": only auto (fp32 per-request caches) is built yet");
  CHECK(a.tool_call_parser.empty() || a.tool_call_parser == "kimi_k3",
        "--tool-call-parser must be kimi_k3");
  CHECK(a.reasoning_parser.empty() || a.reasoning_parser == "kimi_k3",
        "--reasoning-parser must be kimi_k3");
  CHECK(!a.enable_auto_tool_choice || !a.tool_call_parser.empty(),
        "--enable-auto-tool-choice needs --tool-call-parser");
  CHECK(a.device == "auto" || a.device == "cpu" || a.device == "cuda",
        "--device must be cpu, cuda or auto");
  const std::string device =
      a.device == "auto" ? (device_count_or_zero() > 0 ? "cuda" : "cpu") : a.device;

  const std::filesystem::path dir =
      a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  auto model = Model::load(dir, {}, device == "cuda" ? make_cuda_backend(0) : make_cpu_backend());
  const auto tokenizer = Tokenizer::load(dir);
  ChatTemplates templates = load_chat_templates(dir);
  SpecialTokens special = load_special_tokens(dir);

  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len =
      a.max_model_len > 0 ? a.max_model_len : model->config().max_position_embeddings;
  CHECK(ec.scheduler.max_model_len > 0,
        "--max-model-len is needed: the config has no max_position_embeddings");
  const int64_t max_model_len = ec.scheduler.max_model_len;
  // Generation stops at the config's EOS ids and at the tokenizer's eos_token (for Kimi
  // chat, <|im_end|>), as vLLM does.
  for (int64_t id : model->config().eos_token_ids)
    ec.scheduler.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (special.eos_token) {
    const int32_t id = tokenizer->token_id(*special.eos_token);
    if (id >= 0 && id < model->config().vocab_size) ec.scheduler.eos_token_ids.push_back(id);
  }
  Engine engine(std::move(model), ec);
  engine.start();

  OpenAIServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.served_model_name =
      a.served_model_name.empty() ? dir.filename().string() : a.served_model_name;
  so.model_root = dir.string();
  so.api_key = a.api_key;
  so.enable_auto_tool_choice = a.enable_auto_tool_choice;
  so.tool_call_parser = a.tool_call_parser;
  so.reasoning_parser = a.reasoning_parser;
  OpenAIServer server(so, engine, *tokenizer, std::move(templates), std::move(special));

  // SIGINT / SIGTERM end the server; they are handled on this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  server.start();
  std::printf("hyserve: serving %s as '%s' on http://%s:%d (device %s, max_model_len %lld)\n",
              dir.string().c_str(), so.served_model_name.c_str(), a.host.c_str(), server.port(),
              device.c_str(), static_cast<long long>(max_model_len));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  std::printf("hyserve: signal %d, draining\n", sig);
  std::fflush(stdout);
  server.stop();
  engine.stop();
  return 0;
}

}  // namespace

std::function<int()> add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (vLLM's routes and flags)");
  cmd->add_option("model", a->model_dir, "checkpoint folder (default: the bundled tiny kimi_k3)");
  cmd->add_option("--host", a->host)->capture_default_str();
  cmd->add_option("--port", a->port)->capture_default_str();
  cmd->add_option("--served-model-name", a->served_model_name, "model name clients use");
  cmd->add_option("--tensor-parallel-size", a->tensor_parallel_size)->capture_default_str();
  cmd->add_option("--decode-context-parallel-size", a->decode_context_parallel_size)
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len, "context length (default: the config's)");
  cmd->add_option("--max-num-seqs", a->max_num_seqs)->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a->max_num_batched_tokens)->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", a->gpu_memory_utilization)->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype)->capture_default_str();
  cmd->add_option("--index-cache-dtype", a->index_cache_dtype)->capture_default_str();
  cmd->add_flag("--enable-prefix-caching", a->enable_prefix_caching);
  cmd->add_flag("--no-enable-prefix-caching", a->no_enable_prefix_caching);
  cmd->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice);
  cmd->add_option("--tool-call-parser", a->tool_call_parser, "kimi_k3");
  cmd->add_option("--reasoning-parser", a->reasoning_parser, "kimi_k3");
  cmd->add_option("--speculative-config", a->speculative_config, "JSON");
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY'");
  cmd->add_option("--device", a->device, "cpu, cuda or auto")->capture_default_str();
  cmd->add_flag("--batch-invariant", a->batch_invariant);
  return [a] { return run_serve(*a); };
}

}  // namespace hyserve::cli
