// `hyserve serve [MODEL_DIR] [flags]`: the OpenAI-compatible server, with vLLM's flag
// names (SERVING.md). The flags are checked before any weight loads (a flag given twice is
// refused, where argparse would take the last); runs until SIGINT / SIGTERM, then drains
// in-flight requests.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/cuda/device_buffer.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "kv/cache_format.h"
#include "kv/memory_plan.h"
#include "model/config.h"
#include "model/model.h"
#include "server/no_tokenizer.h"
#include "server/openai_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/parser_registry.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

struct ServeArgs {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  // One group per --served-model-name given (several names each); more than one is refused.
  std::vector<std::vector<std::string>> served_model_names;
  int64_t tensor_parallel_size = 1;
  int64_t decode_context_parallel_size = 1;
  std::optional<int64_t> max_model_len;  // none: the config's max_position_embeddings
  int64_t max_num_seqs = 256;
  int64_t max_sequences_per_request = 1024;  // prompts x n of one request
  int64_t max_connections = 65536;           // open HTTP connections; one more gets 503
  int64_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "auto";
  std::string index_cache_dtype = "fp8";
  int64_t kv_cache_memory_bytes = 0;
  bool enable_prefix_caching = false;
  bool no_enable_prefix_caching = false;
  bool enable_auto_tool_choice = false;
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
  bool enforce_eager = false;
  bool async_scheduling = false;  // the default; --no-async-scheduling turns it off
  bool no_async_scheduling = false;
};

// A refused flag: the message alone (it names the flag), no check text or source line.
template <typename... Args>
void require(bool ok, Args&&... message) {
  if (!ok) throw Error(str_cat(std::forward<Args>(message)...));
}

// A CORS flag's JSON list of strings (vLLM parses them with json.loads).
std::vector<std::string> parse_json_list(const std::string& flag, const std::string& text) {
  const nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool ok = list.is_array() && std::all_of(list.begin(), list.end(),
                                                 [](const auto& item) { return item.is_string(); });
  require(ok, flag, " must be a JSON list of strings, e.g. '[\"https://example.com\"]' (default ",
          "'[\"*\"]'), got '", text, "'");
  return list.get<std::vector<std::string>>();
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

int device_count_or_zero() {
  if (!cuda_backend_built()) return 0;
#ifdef HYSERVE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

// The KV pool, by the memory planner (kv/memory_plan.h; `hyserve info` prints the same
// plan). --kv-cache-memory-bytes when given. Otherwise, on the GPU, vLLM's method: a warm-up
// step of max_num_batched_tokens tokens sizes the activations, the workspaces and the
// per-weight device tables; the runner's workspace will be reserved to that step's plus the
// indexer's score chunk grown to a max_model_len context (ec.workspace_bytes), the op
// scratch is grown to a DSA decode step of max_num_seqs sequences (FP8 latent), and the
// pool gets what --gpu-memory-utilization of the device leaves after those and the runner's
// buffers. On the CPU: what max_num_seqs requests of max_model_len tokens need,
// at most 4 GiB.
MemoryPlan plan_kv_pool(const Model& model, const ServeArgs& a, EngineConfig& ec,
                        const std::string& device) {
  const CachePlan plan = model.cache_plan(ec.min_block_size);
  const SchedulerConfig& sc = ec.scheduler;
  MemoryBudget budget;
  budget.gpu_memory_utilization = a.gpu_memory_utilization;
  budget.context_tokens = sc.max_model_len;
  budget.snapshots = ec.snapshot_policy;
  budget.kv_cache_memory_bytes = a.kv_cache_memory_bytes;
  budget.max_num_seqs = sc.max_num_seqs;
  // Scratch of a step: what a step of max_num_batched_tokens tokens takes, plus the score
  // chunk's growth up to max_model_len keys, reserved at once so steps never grow it.
  {
    SequenceState warm = model.new_sequence();
    const std::vector<int32_t> tokens(
        static_cast<size_t>(std::min(sc.max_num_batched_tokens, sc.max_model_len - 1)), 0);
    std::vector<float> logits;
    model.forward(tokens, warm, logits);
    // The engine's runner reserves its workspace to this, once, before its first step.
    ec.workspace_bytes = warm.workspace->capacity_bytes() +
                         static_cast<size_t>(model.context_transient_bytes(sc.max_model_len));
  }
  // The DSA decode step's scratch (FP8 latent): scores [max_num_seqs, max_model_len] etc.
  model.reserve_decode_scratch(sc.max_num_seqs, sc.max_model_len);
#ifdef HYSERVE_WITH_CUDA
  if (device == "cuda") {
    const cuda::MemoryInfo m = cuda::memory_info();
    budget.gpu_memory_bytes = static_cast<int64_t>(m.total_bytes);
    // In use now (weights, op workspaces, the decode scratch), plus what the engine takes
    // before its first step: the runner's workspace and buffers.
    budget.reserve_bytes = static_cast<int64_t>(m.total_bytes - m.free_bytes) +
                           static_cast<int64_t>(ec.workspace_bytes) +
                           ModelRunner::device_bytes(model.config().vocab_size, sc.max_num_seqs,
                                                     sc.max_num_batched_tokens,
                                                     plan.blocks_for_tokens(sc.max_model_len));
  }
#endif
  const MemoryPlan mp = plan_memory(plan, budget);
  CHECK(mp.fits && mp.cache_bytes > 0, "--gpu-memory-utilization ", a.gpu_memory_utilization, ": ",
        mp.usable_bytes >> 20, " MiB usable, the weights and a step's buffers take ",
        budget.reserve_bytes >> 20, " MiB; nothing is left for the KV cache");
  CHECK(mp.num_blocks >= mp.blocks_per_request, "the KV cache gets ", mp.cache_bytes >> 20,
        " MiB = ", mp.num_blocks, " blocks of ", plan.row_bytes,
        " bytes; one request of max_model_len ", sc.max_model_len, " tokens needs ",
        mp.blocks_per_request, ": lower --max-model-len or give the cache more memory");
  CHECK(mp.num_blocks <= std::numeric_limits<int32_t>::max(), mp.num_blocks, " KV blocks");
  return mp;
}

int run_serve(const ServeArgs& a) {
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
  CorsOptions cors;
  cors.allowed_origins = parse_json_list("--allowed-origins", a.allowed_origins);
  cors.allowed_methods = parse_json_list("--allowed-methods", a.allowed_methods);
  cors.allowed_headers = parse_json_list("--allowed-headers", a.allowed_headers);
  cors.allow_credentials = a.allow_credentials;
  CHECK(a.tensor_parallel_size == 1, "--tensor-parallel-size ", a.tensor_parallel_size,
        ": this hyserve runs on one device (tensor parallelism is not built yet)");
  CHECK(a.decode_context_parallel_size == 1, "--decode-context-parallel-size ",
        a.decode_context_parallel_size, ": decode context parallelism is not built yet");
  CHECK(a.speculative_config.empty(),
        "--speculative-config: speculative decoding is not built yet");
  CHECK(!(a.enable_prefix_caching && a.no_enable_prefix_caching),
        "--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  CHECK(!(a.async_scheduling && a.no_async_scheduling),
        "--async-scheduling and --no-async-scheduling contradict each other");
  const std::optional<LatentCacheDtype> latent_flag = parse_latent_cache_dtype(a.kv_cache_dtype);
  const IndexCacheDtype index_cache = parse_index_cache_dtype(a.index_cache_dtype);
  CHECK(index_cache != IndexCacheDtype::kMxfp4,
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
  const std::string device =
      a.device == "auto" ? (device_count_or_zero() > 0 ? "cuda" : "cpu") : a.device;

  const std::filesystem::path dir =
      a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  // The config and the tokenizer before the weights: a bad flag or a missing tokenizer
  // fails in a moment.
  const ModelConfig config = ModelConfig::load(dir);
  const int64_t max_model_len = resolve_max_model_len(a, config);
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplates templates;
  SpecialTokens special;
  if (a.skip_tokenizer_init) {
    tokenizer = std::make_unique<NoTokenizer>(config.vocab_size);
  } else {
    try {
      tokenizer = Tokenizer::load(dir);
    } catch (const TokenizerError& e) {
      throw Error(str_cat(e.what(), "; --skip-tokenizer-init serves token-id prompts without one"));
    }
    templates = load_chat_templates(dir);
    // DeepSeek-V3.2 ships its chat format as Python, not as a template: use the built-in
    // encoding (vLLM's deepseek_v32 tokenizer mode).
    if (templates.by_name.empty() && config.model_type == ModelType::kDeepseekV32)
      templates.builtin = "deepseek_v32";
    special = load_special_tokens(dir);
  }
  ModelOptions mo;
  mo.indexer_fp8 = index_cache == IndexCacheDtype::kFp8;
  mo.latent_cache = resolve_latent_cache_dtype(latent_flag, config.cache_spec());
  mo.batch_invariant = a.batch_invariant;
  auto model = Model::load(dir, mo, device == "cuda" ? make_cuda_backend(0) : make_cpu_backend());

  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len;
  // Generation stops at the config's EOS ids and at the tokenizer's eos_token (for Kimi
  // chat, <|im_end|>), as vLLM does.
  for (int64_t id : model->config().eos_token_ids)
    ec.scheduler.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (special.eos_token) {
    const int32_t id = tokenizer->token_id(*special.eos_token);
    if (id >= 0 && id < model->config().vocab_size) ec.scheduler.eos_token_ids.push_back(id);
  }
  // Prefix caching is on unless --no-enable-prefix-caching (vLLM's default).
  ec.enable_prefix_caching = !a.no_enable_prefix_caching;
  const MemoryPlan memory = plan_kv_pool(*model, a, ec, device);
  ec.num_blocks = static_cast<int32_t>(memory.num_blocks);
  // The next step is scheduled while this one runs unless --no-async-scheduling.
  ec.async_scheduling = !a.no_async_scheduling;
  // Decode steps replay CUDA graphs (vLLM's default; --enforce-eager turns them off).
  if (device == "cuda" && !a.enforce_eager) {
    ec.decode_graph_max_batch = std::min<int64_t>(ec.scheduler.max_num_seqs, 256);
  }
  const int64_t num_blocks = ec.num_blocks;
  const CachePlan kv_plan = model->cache_plan(ec.min_block_size);
  const int64_t block_size = kv_plan.block_size;
  // The budget, as vLLM logs it: what the pool holds and how many full-length requests fit;
  // then which kernels each layer runs.
  log::info(
      "{} (max_model_len); workspace {:.2f} GiB reserved (score chunk sized for "
      "max_model_len)",
      format_memory_summary(kv_plan, memory),
      static_cast<double>(ec.workspace_bytes) / (1024.0 * 1024.0 * 1024.0));
  for (const std::string& line : model->kernel_plan()) log::info("kernel plan: {}", line);
  Engine engine(std::move(model), ec);
  engine.start();

  OpenAIServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.served_model_names = a.served_model_names.empty()
                              ? std::vector<std::string>{dir.filename().string()}
                              : a.served_model_names[0];
  so.model_root = dir.string();
  so.api_key = a.api_key;
  so.enable_auto_tool_choice = a.enable_auto_tool_choice;
  so.tool_call_parser = a.tool_call_parser;
  so.reasoning_parser = a.reasoning_parser;
  so.cors = cors;
  so.skip_tokenizer_init = a.skip_tokenizer_init;
  so.max_sequences_per_request = a.max_sequences_per_request;
  so.max_connections = static_cast<int>(a.max_connections);
  so.idle_timeout_ms = keep_alive_s * 1000;
  OpenAIServer server(so, engine, *tokenizer, std::move(templates), std::move(special));

  // SIGINT / SIGTERM end the server; they are handled on this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  server.start();
  log::info(
      "serving {} as '{}' on http://{}:{} (device {}, max_model_len {}, KV cache {} blocks of {} "
      "tokens, prefix caching {})",
      dir.string(), so.served_model_names[0], a.host, server.port(), device, max_model_len,
      num_blocks, block_size, ec.enable_prefix_caching ? "on" : "off");
  int sig = 0;
  sigwait(&signals, &sig);
  log::info("signal {}, draining", sig);
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
  cmd->add_option("--served-model-name", a->served_model_names,
                  "names clients may pass as model (the first is the one reported)")
      ->expected(1, -1)
      ->inject_separator();
  cmd->add_option("--tensor-parallel-size", a->tensor_parallel_size)->capture_default_str();
  cmd->add_option("--decode-context-parallel-size", a->decode_context_parallel_size)
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len, "context length (default: the config's)");
  cmd->add_option("--max-num-seqs", a->max_num_seqs)->capture_default_str();
  cmd->add_option("--max-sequences-per-request", a->max_sequences_per_request,
                  "most sequences (prompts x n) one request may ask for; more is a 400")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a->max_num_batched_tokens)->capture_default_str();
  cmd->add_option("--max-connections", a->max_connections,
                  "most open HTTP connections (streams and idle keep-alives); one more gets 503")
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", a->gpu_memory_utilization)->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "MLA latent cache: auto (fp8 for DSA models with a 576-wide latent, else bf16), "
                  "bf16, fp32 or fp8 (DSA models)")
      ->capture_default_str();
  cmd->add_option("--index-cache-dtype", a->index_cache_dtype)->capture_default_str();
  cmd->add_option("--kv-cache-memory-bytes", a->kv_cache_memory_bytes,
                  "KV pool size (default: from --gpu-memory-utilization; CPU: 4 GiB at most)");
  cmd->add_flag("--enable-prefix-caching", a->enable_prefix_caching);
  cmd->add_flag("--no-enable-prefix-caching", a->no_enable_prefix_caching);
  cmd->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice);
  cmd->add_option("--tool-call-parser", a->tool_call_parser, "kimi_k3 or deepseek_v32");
  cmd->add_option("--reasoning-parser", a->reasoning_parser, "kimi_k3 or deepseek_v3");
  cmd->add_option("--speculative-config", a->speculative_config, "JSON");
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' on /v1/*")
      ->envname("VLLM_API_KEY");
  cmd->add_option("--allowed-origins", a->allowed_origins, "CORS origins, a JSON list")
      ->capture_default_str();
  cmd->add_option("--allowed-methods", a->allowed_methods, "CORS methods, a JSON list")
      ->capture_default_str();
  cmd->add_option("--allowed-headers", a->allowed_headers, "CORS headers, a JSON list")
      ->capture_default_str();
  cmd->add_flag("--allow-credentials", a->allow_credentials, "CORS: allow credentials");
  cmd->add_flag("--skip-tokenizer-init", a->skip_tokenizer_init,
                "serve without a tokenizer: token-id prompts only, outputs as token ids");
  cmd->add_option("--device", a->device, "cpu, cuda or auto")->capture_default_str();
  cmd->add_flag("--batch-invariant", a->batch_invariant,
                "logits bitwise independent of the batch, the chunking and prefix hits");
  cmd->add_flag("--enforce-eager", a->enforce_eager, "decode without CUDA graphs");
  cmd->add_flag("--async-scheduling", a->async_scheduling,
                "schedule and launch the next step while this one runs (the default)");
  cmd->add_flag("--no-async-scheduling", a->no_async_scheduling,
                "wait for each step's results before scheduling the next");
  // Options refuse a second value already; flags too.
  for (CLI::Option* option : cmd->get_options()) {
    if (option->get_expected_max() == 0) option->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  }
  return [a] { return run_serve(*a); };
}

}  // namespace hyserve::cli
