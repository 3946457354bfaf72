// `hyserve serve`'s flags: their values (ServeArgs, vLLM's names, SERVING.md), their
// registration on the CLI11 subcommand, and the checks that run before any weight loads (a
// flag given twice is refused, where argparse would take the last). What the flags start is
// serve_command.cpp's wiring; the rank's model and its KV pool are engine/worker.h's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/config.h"
#include "server/cors.h"
#include "util/error.h"

namespace hyserve::cli {

struct ServeArgs {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  // One group per --served-model-name given (several names each); more than one is refused.
  std::vector<std::vector<std::string>> served_model_names;
  int64_t tensor_parallel_size = 1;
  int64_t decode_context_parallel_size = 1;
  bool enable_expert_parallel = false;   // whole routed experts per rank instead of slices
  int64_t token_sharded_prefill = 0;     // forwards of >= this many tokens shard tokens (0: off)
  std::optional<int64_t> max_model_len;  // none: the config's max_position_embeddings
  int64_t max_num_seqs = 256;
  int64_t max_sequences_per_request = 1024;  // prompts x n of one request
  int64_t max_connections = 65536;           // open HTTP connections; one more gets 503
  int64_t max_num_batched_tokens = 8192;
  // A step's prefill work in token x context units (SchedulerConfig::max_step_prefill_cost).
  // none: default_max_step_prefill_cost (a first chunk of max_num_batched_tokens); 0: off.
  std::optional<int64_t> max_step_prefill_cost;
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "auto";
  std::string index_cache_dtype = "fp8";
  std::string attention_backend = "auto";  // model/attention_backend.h
  int64_t kv_cache_memory_bytes = 0;
  bool enable_prefix_caching = false;
  bool no_enable_prefix_caching = false;
  bool enable_auto_tool_choice = false;
  std::string chat_template;  // --chat-template: a file, or the template itself
  bool trust_request_chat_template = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  std::string speculative_config;
  std::string api_key;  // or $VLLM_API_KEY
  // CORS, as vLLM takes them: JSON lists.
  std::string allowed_origins = R"(["*"])";
  std::string allowed_methods = R"(["*"])";
  std::string allowed_headers = R"(["*"])";
  bool allow_credentials = false;
  bool skip_tokenizer_init = false;
  std::string device = "auto";
  bool batch_invariant = false;
  std::string cpu_gemm = "blas";
  bool enforce_eager = false;
  // vLLM's --load-format: auto / safetensors (the checkpoint's files), or dummy (random
  // weights of the config's shapes and formats: benchmarks of models whose checkpoint is not
  // at hand; the folder needs only config.json and the tokenizer).
  std::string load_format = "auto";
  bool async_scheduling = false;  // the default; --no-async-scheduling turns it off
  bool no_async_scheduling = false;
  // Several nodes (vLLM's flags): node_rank's processes are ranks [node_rank x L,
  // (node_rank + 1) x L) of L = world / nnodes; rank 0 (node 0) serves the API and its
  // TcpStore at master_addr:master_port is the rendezvous.
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // single node: a free port when not given
  bool headless = false;           // a node > 0: its workers only, no API server
  // LoRA adapters (issue 48; vLLM's flags): --lora-modules entries are `name=path` or
  // vLLM's JSON form {"name", "path", "base_model_name"}.
  bool enable_lora = false;
  int64_t max_lora_rank = 16;
  int64_t max_loras = 1;
  std::vector<std::string> lora_modules;
  // RL (issue 48 item 4): --enable-sleep-mode lets /sleep free memory; --weight-transfer-config
  // '{"backend": "gloo"|"nccl"}' lets a trainer join (the routes need VLLM_SERVER_DEV_MODE=1).
  bool enable_sleep_mode = false;
  std::string weight_transfer_config;
};

// The backend of a --weight-transfer-config JSON object ("" when the flag is empty); throws
// Error naming the flag.
std::string parse_weight_transfer_backend(const std::string& config);

// One --lora-modules entry.
struct LoraModuleSpec {
  std::string name;
  std::string path;
};
// Parses `name=path` or {"name": ..., "path": ..., "base_model_name": ...}; throws Error
// naming the flag and the entry.
LoraModuleSpec parse_lora_module(const std::string& spec);

// Registers every serve flag on `cmd`, writing into `a` (which must outlive the parse).
void add_serve_flags(CLI::App& cmd, ServeArgs& a);

// The flags' values checked together, in the order their messages are reported: limits,
// CORS lists, the parallel layout, the engine's options, the parsers, the device. Returns
// what the checks parse on the way.
struct CheckedServeFlags {
  CorsOptions cors;
  int keep_alive_s = 5;  // $VLLM_HTTP_TIMEOUT_KEEP_ALIVE
};
CheckedServeFlags check_serve_flags(const ServeArgs& a);

// "cuda" or "cpu": --device, auto taking CUDA when a GPU is visible.
std::string resolve_device(const ServeArgs& a);
// GPUs this process sees (0 without the CUDA backend).
int device_count_or_zero();

// The context length: --max-model-len, at most the config's max_position_embeddings unless
// VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's override); the config's when not given.
int64_t resolve_max_model_len(const ServeArgs& a, const ModelConfig& config);

// The bound on every wait of the group on another rank (a collective, the rendezvous, a
// send): $HYSERVE_DISTRIBUTED_TIMEOUT_S, default 120 s.
std::chrono::milliseconds distributed_timeout();
// Loading the weights is bounded separately: $HYSERVE_LOAD_TIMEOUT_S, default 1800 s.
std::chrono::milliseconds load_timeout();

// A refused flag: the message alone (it names the flag), no check text or source line.
template <typename... Args>
void require(bool ok, Args&&... message) {
  if (!ok) throw Error(str_cat(std::forward<Args>(message)...));
}

}  // namespace hyserve::cli
