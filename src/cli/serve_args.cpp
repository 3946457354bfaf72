// serve's flags: registration, checks and the environment they read (serve_args.h).
#include "cli/serve_args.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "kv/cache_format.h"
#include "model/attention_backend.h"
#include "parallel/parallel_layout.h"
#include "server/speculative_config.h"
#include "tokenizer/parser_registry.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

// A CORS flag's JSON list of strings (vLLM parses them with json.loads).
std::vector<std::string> parse_json_list(const std::string& flag, const std::string& text) {
  const nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool ok = list.is_array() && std::all_of(list.begin(), list.end(),
                                                 [](const auto& item) { return item.is_string(); });
  require(ok, flag, " must be a JSON list of strings, e.g. '[\"https://example.com\"]' (default ",
          "'[\"*\"]'), got '", text, "'");
  return list.get<std::vector<std::string>>();
}

// The idle keep-alive timeout in seconds: $VLLM_HTTP_TIMEOUT_KEEP_ALIVE, as vLLM reads it
// (uvicorn's timeout_keep_alive; vLLM has no flag for it), default 5.
int resolve_keep_alive_s() {
  const char* env = std::getenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE");
  if (env == nullptr || *env == '\0') return 5;
  const std::string text = env;
  const bool digits = text.size() <= 5 && std::all_of(text.begin(), text.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
  const int seconds = digits ? std::stoi(text) : 0;
  require(seconds >= 1 && seconds <= 86400,
          "VLLM_HTTP_TIMEOUT_KEEP_ALIVE must be a whole number of seconds from 1 to 86400, got '",
          text, "'");
  return seconds;
}

// A whole number of seconds >= 1 from $name; `fallback` when it is unset or empty.
std::chrono::milliseconds seconds_from_env(const char* name, int64_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return std::chrono::seconds(fallback);
  const std::string text = env;
  const bool digits = text.size() <= 6 && std::all_of(text.begin(), text.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
  const int64_t seconds = digits ? std::stoll(text) : 0;
  require(seconds >= 1, name, " must be a whole number of seconds >= 1, got '", text, "'");
  return std::chrono::seconds(seconds);
}

// Counts and limits, then $VLLM_HTTP_TIMEOUT_KEEP_ALIVE.
int check_limit_flags(const ServeArgs& a) {
  require(a.served_model_names.size() <= 1,
          "--served-model-name given more than once; give every name after one flag: ",
          "--served-model-name NAME [NAME ...]");
  require(a.max_num_seqs >= 1, "--max-num-seqs must be at least 1, got ", a.max_num_seqs);
  require(a.max_sequences_per_request >= 1, "--max-sequences-per-request must be at least 1, got ",
          a.max_sequences_per_request);
  require(a.max_connections >= 1 && a.max_connections <= std::numeric_limits<int>::max(),
          "--max-connections must be at least 1, got ", a.max_connections);
  const int keep_alive_s = resolve_keep_alive_s();
  require(a.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1, got ",
          a.max_num_batched_tokens);
  require(a.max_step_prefill_cost.value_or(0) >= 0,
          "--max-step-prefill-cost must be at least 0 (0: off), got ",
          a.max_step_prefill_cost.value_or(0));
  return keep_alive_s;
}

CorsOptions parse_cors_flags(const ServeArgs& a) {
  CorsOptions cors;
  cors.allowed_origins = parse_json_list("--allowed-origins", a.allowed_origins);
  cors.allowed_methods = parse_json_list("--allowed-methods", a.allowed_methods);
  cors.allowed_headers = parse_json_list("--allowed-headers", a.allowed_headers);
  cors.allow_credentials = a.allow_credentials;
  return cors;
}

// The group's sizes and the nodes it spans.
void check_parallel_flags(const ServeArgs& a) {
  require(a.tensor_parallel_size >= 1 && a.tensor_parallel_size <= 1024,
          "--tensor-parallel-size must be from 1 to 1024, got ", a.tensor_parallel_size);
  parallel::ParallelLayout::check_sizes(a.tensor_parallel_size, a.decode_context_parallel_size,
                                        "--tensor-parallel-size", "--decode-context-parallel-size");
  require(a.token_sharded_prefill >= 0, "--token-sharded-prefill must be >= 0, got ",
          a.token_sharded_prefill);
  require(a.nnodes >= 1 && a.tensor_parallel_size % a.nnodes == 0, "--nnodes ", a.nnodes,
          " must divide --tensor-parallel-size ", a.tensor_parallel_size,
          " (the same number of ranks on every node)");
  require(a.node_rank >= 0 && a.node_rank < a.nnodes, "--node-rank ", a.node_rank,
          " must be in [0, --nnodes ", a.nnodes, ")");
  require(a.nnodes == 1 || a.master_port.has_value(), "--nnodes ", a.nnodes,
          " needs --master-port (and --master-addr: node 0's address)");
  require(!a.headless || a.node_rank > 0,
          "--headless is for nodes > 0 (node 0 runs rank 0, which serves the API)");
  require(a.headless || a.node_rank == 0, "--node-rank ", a.node_rank,
          " runs workers only: add --headless (node 0 serves the API)");
  require(!a.master_port || (*a.master_port >= 1 && *a.master_port <= 65535),
          "--master-port must be from 1 to 65535");
}

// Speculative decoding, prefix caching, scheduling, the caches' formats and memory, the
// parsers, the device.
void check_engine_flags(const ServeArgs& a) {
  require(a.load_format == "auto" || a.load_format == "safetensors" || a.load_format == "dummy",
          "--load-format must be auto, safetensors or dummy, got '", a.load_format, "'");
  if (a.enable_lora) {
    require(a.max_lora_rank >= 1 && a.max_lora_rank <= 64, "--max-lora-rank must be from 1 to 64",
            ", got ", a.max_lora_rank);
    require(a.max_loras >= 1, "--max-loras must be >= 1, got ", a.max_loras);
    for (const std::string& m : a.lora_modules) parse_lora_module(m);
  } else {
    require(a.lora_modules.empty(), "--lora-modules needs --enable-lora");
  }
  if (!a.weight_transfer_config.empty()) parse_weight_transfer_backend(a.weight_transfer_config);
  if (!a.speculative_config.empty()) {
    CHECK(!a.async_scheduling, "--async-scheduling and --speculative-config: speculative ",
          "decoding runs without asynchronous scheduling");
    parse_speculative_config(a.speculative_config);  // a bad config fails before loading
  }
  CHECK(!(a.enable_prefix_caching && a.no_enable_prefix_caching),
        "--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  CHECK(!(a.async_scheduling && a.no_async_scheduling),
        "--async-scheduling and --no-async-scheduling contradict each other");
  parse_latent_cache_dtype(a.kv_cache_dtype);  // a bad value fails before anything loads
  parse_attention_backend(a.attention_backend);
  cpu::parse_cpu_gemm(a.cpu_gemm);
  CHECK(parse_index_cache_dtype(a.index_cache_dtype) != IndexCacheDtype::kMxfp4,
        "--index-cache-dtype mxfp4: not built yet (fp8 or fp32)");
  CHECK(a.kv_cache_memory_bytes >= 0, "--kv-cache-memory-bytes must be >= 0");
  CHECK(a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0,
        "--gpu-memory-utilization must be in (0, 1], got ", a.gpu_memory_utilization);
  CHECK(a.tool_call_parser.empty() || is_tool_call_parser_name(a.tool_call_parser),
        "--tool-call-parser must be kimi_k3 or deepseek_v32");
  CHECK(a.reasoning_parser.empty() || is_reasoning_parser_name(a.reasoning_parser),
        "--reasoning-parser must be kimi_k3 or deepseek_v3");
  CHECK(!a.enable_auto_tool_choice || !a.tool_call_parser.empty(),
        "--enable-auto-tool-choice needs --tool-call-parser");
  CHECK(a.device == "auto" || a.device == "cpu" || a.device == "cuda",
        "--device must be cpu, cuda or auto");
}

}  // namespace

CheckedServeFlags check_serve_flags(const ServeArgs& a) {
  CheckedServeFlags checked;
  checked.keep_alive_s = check_limit_flags(a);
  checked.cors = parse_cors_flags(a);
  check_parallel_flags(a);
  check_engine_flags(a);
  return checked;
}

std::string resolve_device(const ServeArgs& a) {
  return a.device == "auto" ? (device_count_or_zero() > 0 ? "cuda" : "cpu") : a.device;
}

int device_count_or_zero() {
  return cuda_device_count();
}

// The context length: --max-model-len, at most the config's max_position_embeddings unless
// VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's override); the config's when not given.
int64_t resolve_max_model_len(const ServeArgs& a, const ModelConfig& config) {
  const int64_t derived = config.max_position_embeddings;
  if (!a.max_model_len) {
    require(derived > 0, "--max-model-len is needed: the config has no max_position_embeddings");
    return derived;
  }
  const int64_t len = *a.max_model_len;
  // A request needs a prompt token and room for one more.
  require(len >= 2, "--max-model-len must be at least 2 (a prompt token and an output), got ", len,
          " (leave it out for the config's max_position_embeddings",
          derived > 0 ? str_cat(", ", derived) : "", ")");
  if (derived > 0 && len > derived) {
    const char* env = std::getenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN");
    const std::string allow = env ? env : "";
    require(allow == "1" || allow == "true" || allow == "True", "--max-model-len ", len,
            " is greater than the model's max_position_embeddings (", derived,
            " in config.json); positions beyond it were never trained. To allow it anyway, ",
            "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1");
    log::warn(
        "--max-model-len {} exceeds max_position_embeddings {} (VLLM_ALLOW_LONG_MAX_MODEL_LEN)",
        len, derived);
  }
  return len;
}

std::chrono::milliseconds distributed_timeout() {
  return seconds_from_env("HYSERVE_DISTRIBUTED_TIMEOUT_S", 120);
}

std::chrono::milliseconds load_timeout() {
  return seconds_from_env("HYSERVE_LOAD_TIMEOUT_S", 1800);
}

namespace {

void add_server_and_parallel_flags(CLI::App& cmd, ServeArgs& a) {
  cmd.add_option("model", a.model_dir, "checkpoint folder (default: the bundled tiny kimi_k3)");
  cmd.add_option("--host", a.host)->capture_default_str();
  cmd.add_option("--port", a.port)->capture_default_str();
  cmd.add_option("--served-model-name", a.served_model_names,
                 "names clients may pass as model (the first is the one reported)")
      ->expected(1, -1)
      ->inject_separator();
  cmd.add_option("--tensor-parallel-size", a.tensor_parallel_size)->capture_default_str();
  cmd.add_option("--decode-context-parallel-size", a.decode_context_parallel_size)
      ->capture_default_str();
  cmd.add_flag("--enable-expert-parallel", a.enable_expert_parallel,
               "routed experts whole on their ranks (E / tensor-parallel size each) instead of "
               "a slice of every expert on every rank");
  cmd.add_option("--token-sharded-prefill", a.token_sharded_prefill,
                 "tensor parallel: prefill steps of at least this many tokens run each MLA "
                 "layer's indexer and attention on 1/N of the tokens with every head (0: off)")
      ->capture_default_str();
  cmd.add_option("--nnodes", a.nnodes, "nodes the tensor-parallel group spans")
      ->capture_default_str();
  cmd.add_option("--node-rank", a.node_rank, "this node's index (0: rank 0, the API server)")
      ->capture_default_str();
  cmd.add_option("--master-addr", a.master_addr, "node 0's address (the rendezvous)")
      ->capture_default_str();
  cmd.add_option("--master-port", a.master_port,
                 "the rendezvous port on node 0 (default on one node: a free one)");
  cmd.add_flag("--headless", a.headless, "a node > 0: run its workers, no API server");
}

void add_engine_flags(CLI::App& cmd, ServeArgs& a) {
  cmd.add_option("--max-model-len", a.max_model_len, "context length (default: the config's)");
  cmd.add_option("--max-num-seqs", a.max_num_seqs)->capture_default_str();
  cmd.add_option("--max-sequences-per-request", a.max_sequences_per_request,
                 "most sequences (prompts x n) one request may ask for; more is a 400")
      ->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", a.max_num_batched_tokens)->capture_default_str();
  cmd.add_option("--max-step-prefill-cost", a.max_step_prefill_cost,
                 "cap on a step's work in token x context units (n tokens from position p cost "
                 "n x (p + 1024) + n^2 / 2), so that a long prompt's late chunks shrink and "
                 "decoding streams keep their pace; 0: off (default: the cost of a first chunk "
                 "of --max-num-batched-tokens)");
  cmd.add_option("--max-connections", a.max_connections,
                 "most open HTTP connections (streams and idle keep-alives); one more gets 503")
      ->capture_default_str();
  cmd.add_option("--gpu-memory-utilization", a.gpu_memory_utilization)->capture_default_str();
  cmd.add_option("--kv-cache-dtype", a.kv_cache_dtype,
                 "MLA latent cache: auto (fp8 for DSA models with a 576-wide latent, else bf16), "
                 "bf16, fp32 or fp8 (DSA models)")
      ->capture_default_str();
  cmd.add_option("--index-cache-dtype", a.index_cache_dtype)->capture_default_str();
  cmd.add_option("--attention-backend", a.attention_backend,
                 "how MLA layers attend: auto, mla, mla_sparse, dsa_fp8 or dsa_fp8_fused (auto: "
                 "from the config and the cache dtypes; see hyserve info)")
      ->capture_default_str();
  cmd.add_option("--kv-cache-memory-bytes", a.kv_cache_memory_bytes,
                 "KV pool size (default: from --gpu-memory-utilization; CPU: 4 GiB at most)");
  cmd.add_flag("--enable-prefix-caching", a.enable_prefix_caching);
  cmd.add_flag("--no-enable-prefix-caching", a.no_enable_prefix_caching);
  cmd.add_flag("--enable-auto-tool-choice", a.enable_auto_tool_choice);
  cmd.add_option("--chat-template", a.chat_template,
                 "the chat template (a Jinja file, or the template itself) in place of the "
                 "model's");
  cmd.add_flag("--trust-request-chat-template", a.trust_request_chat_template,
               "render a request's own chat_template (else such a request is refused)");
  cmd.add_option("--tool-call-parser", a.tool_call_parser, "kimi_k3 or deepseek_v32");
  cmd.add_option("--reasoning-parser", a.reasoning_parser, "kimi_k3 or deepseek_v3");
  cmd.add_option("--speculative-config", a.speculative_config, "JSON");
}

void add_http_and_runtime_flags(CLI::App& cmd, ServeArgs& a) {
  cmd.add_option("--api-key", a.api_key, "require 'Authorization: Bearer KEY' on /v1/*")
      ->envname("VLLM_API_KEY");
  cmd.add_option("--allowed-origins", a.allowed_origins, "CORS origins, a JSON list")
      ->capture_default_str();
  cmd.add_option("--allowed-methods", a.allowed_methods, "CORS methods, a JSON list")
      ->capture_default_str();
  cmd.add_option("--allowed-headers", a.allowed_headers, "CORS headers, a JSON list")
      ->capture_default_str();
  cmd.add_flag("--allow-credentials", a.allow_credentials, "CORS: allow credentials");
  cmd.add_flag("--skip-tokenizer-init", a.skip_tokenizer_init,
               "serve without a tokenizer: token-id prompts only, outputs as token ids");
  cmd.add_option("--device", a.device, "cpu, cuda or auto")->capture_default_str();
  cmd.add_flag("--batch-invariant", a.batch_invariant,
               "logits bitwise independent of the batch, the chunking and prefix hits");
  cmd.add_option("--cpu-gemm", a.cpu_gemm,
                 "CPU matrix products outside --batch-invariant: blas (OpenBLAS for calls of "
                 "many tokens) or reference (the fp32 reference's fixed order)")
      ->capture_default_str()
      ->envname("HYSERVE_CPU_GEMM");
  cmd.add_flag("--enforce-eager", a.enforce_eager, "decode without CUDA graphs");
  cmd.add_option("--load-format", a.load_format,
                 "auto or safetensors: the checkpoint's weights; dummy: random weights of the "
                 "config's shapes (benchmarks; the folder needs only config.json and a tokenizer)")
      ->capture_default_str();
  cmd.add_flag("--async-scheduling", a.async_scheduling,
               "schedule and launch the next step while this one runs (the default)");
  cmd.add_flag("--no-async-scheduling", a.no_async_scheduling,
               "wait for each step's results before scheduling the next");
}

void add_lora_flags(CLI::App& cmd, ServeArgs& a) {
  cmd.add_flag("--enable-lora", a.enable_lora, "serve LoRA adapters (model = the adapter's name)");
  cmd.add_option("--max-lora-rank", a.max_lora_rank, "the largest adapter rank (up to 64)")
      ->capture_default_str();
  cmd.add_option("--max-loras", a.max_loras, "adapters resident at once (slots)")
      ->capture_default_str();
  cmd.add_flag("--enable-sleep-mode", a.enable_sleep_mode,
               "let POST /sleep free the KV cache and the weights (dev mode routes)");
  cmd.add_option("--weight-transfer-config", a.weight_transfer_config,
                 "weight updates from a trainer: {\"backend\": \"gloo\"} (CPU) or nccl (GPUs)");
  cmd.add_option("--lora-modules", a.lora_modules,
                 "adapters loaded at start: name=path or a JSON object {name, path, "
                 "base_model_name}")
      ->expected(1, -1);
}

}  // namespace

LoraModuleSpec parse_lora_module(const std::string& spec) {
  LoraModuleSpec m;
  if (!spec.empty() && spec.front() == '{') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(spec);
    } catch (const nlohmann::json::exception&) {
      require(false, "--lora-modules: '", spec, "' is not valid JSON");
    }
    require(j.is_object() && j.contains("name") && j["name"].is_string() && j.contains("path") &&
                j["path"].is_string(),
            "--lora-modules: '", spec, "' needs string fields \"name\" and \"path\"");
    m.name = j["name"].get<std::string>();
    m.path = j["path"].get<std::string>();
  } else {
    const size_t eq = spec.find('=');
    require(eq != std::string::npos, "--lora-modules: '", spec,
            "' is neither name=path nor a JSON object");
    m.name = spec.substr(0, eq);
    m.path = spec.substr(eq + 1);
  }
  require(!m.name.empty() && !m.path.empty(), "--lora-modules: '", spec,
          "' needs a name and a path");
  return m;
}

void add_serve_flags(CLI::App& cmd, ServeArgs& a) {
  add_server_and_parallel_flags(cmd, a);
  add_lora_flags(cmd, a);
  add_engine_flags(cmd, a);
  add_http_and_runtime_flags(cmd, a);
  // Options refuse a second value already; flags too.
  for (CLI::Option* option : cmd.get_options()) {
    if (option->get_expected_max() == 0) option->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  }
}

std::string parse_weight_transfer_backend(const std::string& config) {
  if (config.empty()) return "";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(config);
  } catch (const nlohmann::json::exception& e) {
    HYSERVE_THROW(Error, "--weight-transfer-config: not JSON: ", e.what());
  }
  CHECK_AS(Error, j.is_object() && j.contains("backend") && j["backend"].is_string(),
           "--weight-transfer-config: expected {\"backend\": \"gloo\" or \"nccl\"}, got ", config);
  const std::string backend = j["backend"].get<std::string>();
  CHECK_AS(Error, backend == "gloo" || backend == "nccl",
           "--weight-transfer-config: backend must be 'gloo' (CPU) or 'nccl' (GPUs), got '",
           backend, "'");
  return backend;
}

}  // namespace hyserve::cli
