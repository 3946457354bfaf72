// `hyserve serve [MODEL_DIR] [flags]`: the OpenAI-compatible server, with vLLM's flag
// names (SERVING.md). The flags are checked before any weight loads (a flag given twice is
// refused, where argparse would take the last); runs until SIGINT / SIGTERM, then drains
// in-flight requests.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/worker_processes.h"
#include "core/cuda/device_buffer.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/tensor_parallel_group.h"
#include "kv/cache_format.h"
#include "kv/memory_plan.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/make_communicator.h"
#include "parallel/step_channel.h"
#include "parallel/store.h"
#include "server/no_tokenizer.h"
#include "server/openai_server.h"
#include "server/speculative_config.h"
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
  bool enable_expert_parallel = false;   // whole routed experts per rank instead of slices
  int64_t token_sharded_prefill = 0;     // forwards of >= this many tokens shard tokens (0: off)
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
  // Several nodes (vLLM's flags): node_rank's processes are ranks [node_rank x L,
  // (node_rank + 1) x L) of L = world / nnodes; rank 0 (node 0) serves the API and its
  // TcpStore at master_addr:master_port is the rendezvous.
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // single node: a free port when not given
  bool headless = false;           // a node > 0: its workers only, no API server
};

// Where this process sits in a tensor-parallel group.
struct GroupPlace {
  int size = 1;
  int rank = 0;
  int local_size = 1;  // ranks per node
  int local_rank = 0;
};

std::chrono::milliseconds distributed_timeout();

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
  // The DSA decode step's scratch (FP8 latent): scores [max_num_seqs, max_model_len] etc.;
  // with speculative decoding every verified token is a query row of it.
  const ModelRunnerConfig rc = runner_config(ec);
  model.reserve_decode_scratch(std::max(sc.max_num_seqs, ModelRunner::max_verify_tokens(rc)),
                               sc.max_model_len);
#ifdef HYSERVE_WITH_CUDA
  if (device == "cuda") {
    const cuda::MemoryInfo m = cuda::memory_info();
    budget.gpu_memory_bytes = static_cast<int64_t>(m.total_bytes);
    // In use now (weights, op workspaces, the decode scratch), plus what the engine takes
    // before its first step: the runner's workspace and buffers.
    budget.reserve_bytes = static_cast<int64_t>(m.total_bytes - m.free_bytes) +
                           static_cast<int64_t>(ec.workspace_bytes) +
                           ModelRunner::device_bytes(model, rc);
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

// The bound on every wait of the group on another rank (a collective, the rendezvous, a
// send): $HYSERVE_DISTRIBUTED_TIMEOUT_S, default 120 s. Loading the weights is bounded
// separately ($HYSERVE_LOAD_TIMEOUT_S, default 1800 s).
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

std::chrono::milliseconds distributed_timeout() {
  return seconds_from_env("HYSERVE_DISTRIBUTED_TIMEOUT_S", 120);
}

sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The signal that came within `timeout`, or 0.
int wait_signal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1000000L;
  const int sig = sigtimedwait(&signals, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// Sets key/rank to `value` and returns every rank's value once all have set theirs,
// calling `poll` (which may throw) about every second while it waits.
std::vector<int64_t> exchange(parallel::Store& store, const std::string& key, const GroupPlace& g,
                              int64_t value, std::chrono::milliseconds timeout,
                              const std::function<void()>& poll) {
  store.set(str_cat(key, "/", g.rank), parallel::encode_counter(value));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int64_t> values;
  for (int r = 0; r < g.size; ++r) {
    const std::string k = str_cat(key, "/", r);
    for (;;) {
      try {
        values.push_back(parallel::decode_counter(k, store.get(k, std::chrono::seconds(1))));
        break;
      } catch (const parallel::CommError&) {
        if (std::chrono::steady_clock::now() >= deadline) {
          throw parallel::CommError(str_cat("tensor parallel: rank ", r, " did not reach '", key,
                                            "' within ", timeout.count() / 1000, " s"));
        }
        poll();
      }
    }
  }
  return values;
}

// A rank's model and engine config: its backend, the group's communicator, its shard of the
// weights, the KV pool the whole group agrees on (the smallest rank's).
struct RankModel {
  std::unique_ptr<parallel::Communicator> comm;  // outlive the model, which uses them
  std::unique_ptr<parallel::Communicator> dcp_comm;
  std::unique_ptr<Model> model;
  EngineConfig engine;
  MemoryPlan memory;
};

RankModel load_rank(const ServeArgs& a, const std::filesystem::path& dir, const std::string& device,
                    int64_t max_model_len, const GroupPlace& g, parallel::Store* store,
                    const std::function<void()>& poll) {
  const std::optional<LatentCacheDtype> latent_flag = parse_latent_cache_dtype(a.kv_cache_dtype);
  const IndexCacheDtype index_cache = parse_index_cache_dtype(a.index_cache_dtype);
  const ModelConfig config = ModelConfig::load(dir);
  RankModel rm;
  std::unique_ptr<Backend> backend = device == "cuda" ? make_cuda_backend(0) : make_cpu_backend();
  ModelOptions mo;
  mo.indexer_fp8 = index_cache == IndexCacheDtype::kFp8;
  mo.latent_cache = resolve_latent_cache_dtype(latent_flag, config.cache_spec());
  mo.batch_invariant = a.batch_invariant;
  mo.parallel.expert_parallel = a.enable_expert_parallel;
  mo.token_sharded_prefill = a.token_sharded_prefill;
  if (g.size > 1) {
    rm.comm = parallel::make_backend_communicator(*backend, *store, g.rank, g.size,
                                                  distributed_timeout(), "tp");
    mo.parallel.tp = {g.rank, g.size, rm.comm.get()};
  }
  // DCP groups: consecutive ranks of the TP group, each caching every W-th position.
  const int dcp = static_cast<int>(a.decode_context_parallel_size);
  if (dcp > 1) {
    rm.dcp_comm = parallel::make_backend_communicator(
        *backend, *store, g.rank % dcp, dcp, distributed_timeout(), str_cat("dcp", g.rank / dcp));
    mo.parallel.dcp = {g.rank % dcp, dcp, rm.dcp_comm.get()};
  }
  rm.model = Model::load(dir, mo, std::move(backend));
  // Ranks load at their own pace; the first collective waits for the slowest.
  if (g.size > 1) {
    exchange(*store, "loaded", g, 1, seconds_from_env("HYSERVE_LOAD_TIMEOUT_S", 1800), poll);
  }

  EngineConfig& ec = rm.engine;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len;
  // Prefix caching is on unless --no-enable-prefix-caching (vLLM's default).
  ec.enable_prefix_caching = !a.no_enable_prefix_caching;
  if (!a.speculative_config.empty())
    ec.speculative = parse_speculative_config(a.speculative_config);
  rm.memory = plan_kv_pool(*rm.model, a, ec, device);
  int64_t blocks = rm.memory.num_blocks;
  if (g.size > 1) {
    const std::vector<int64_t> all =
        exchange(*store, "num_blocks", g, blocks, distributed_timeout(), poll);
    blocks = *std::min_element(all.begin(), all.end());
  }
  ec.num_blocks = static_cast<int32_t>(blocks);
  // The next step is scheduled while this one runs unless --no-async-scheduling.
  ec.async_scheduling = !a.no_async_scheduling;
  // Decode steps replay CUDA graphs (vLLM's default; --enforce-eager turns them off).
  if (device == "cuda" && !a.enforce_eager) {
    ec.decode_graph_max_batch = std::min<int64_t>(ec.scheduler.max_num_seqs, 256);
  }
  ec = complete_engine_config(*rm.model, ec);
  return rm;
}

// A rank > 0 (a process `serve` started, or a --headless node's): its shard, then the
// plans of rank 0 until it says stop.
int run_worker_rank(const ServeArgs& a, const std::filesystem::path& dir, const std::string& device,
                    int64_t max_model_len, const GroupPlace& g, const WorkerPlace& place) {
  const size_t colon = place.master.rfind(':');
  const std::string host = place.master.substr(0, colon);
  parallel::TcpStoreOptions so;
  so.host = host;
  so.port = std::stoi(place.master.substr(colon + 1));
  so.connect_timeout = distributed_timeout();
  so.timeout = distributed_timeout();
  parallel::TcpStore store(so);
  log::info("rank {} of {}: loading {} ({})", g.rank, g.size, dir.string(), device);
  RankModel rm = load_rank(a, dir, device, max_model_len, g, &store, [] {});
  const int port = static_cast<int>(parallel::decode_counter(
      "step_channel_port", store.get("step_channel_port", distributed_timeout())));
  parallel::WorkerChannel channel(host, port, g.rank, distributed_timeout());
  log::info("rank {} of {}: ready ({} KV blocks)", g.rank, g.size, rm.engine.num_blocks);
  run_tensor_parallel_worker(*rm.model, rm.engine, channel);
  log::info("rank {} of {}: stopped", g.rank, g.size);
  return 0;
}

// A --headless node: its ranks as worker processes, until they stop (or one fails, or a
// signal comes).
int run_headless_node(const ServeArgs& a, const GroupPlace& g, const std::string& device) {
  const std::string master = str_cat(a.master_addr, ":", *a.master_port);
  const sigset_t signals = block_stop_signals();
  WorkerProcesses workers;
  for (int i = 0; i < g.local_size; ++i) workers.spawn(g.rank + i, i, master, device == "cuda");
  log::info("node {} of {} (headless): ranks {} .. {}, rendezvous at {}", a.node_rank, a.nnodes,
            g.rank, g.rank + g.local_size - 1, master);
  for (;;) {
    if (const int sig = wait_signal(signals, std::chrono::milliseconds(200))) {
      log::info("signal {}, stopping the workers", sig);
      workers.terminate(std::chrono::seconds(10));
      return 0;
    }
    while (const auto e = workers.poll_exit()) {
      if (!e->ok) {
        log::error("tensor parallel: {}; stopping this node's workers", e->what);
        workers.terminate(std::chrono::seconds(5));
        return 1;
      }
    }
    if (workers.all_exited()) return 0;
  }
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
  const std::string device =
      a.device == "auto" ? (device_count_or_zero() > 0 ? "cuda" : "cpu") : a.device;

  const std::filesystem::path dir =
      a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  // The config and the tokenizer before the weights: a bad flag or a missing tokenizer
  // fails in a moment.
  const ModelConfig config = ModelConfig::load(dir);
  const int64_t max_model_len = resolve_max_model_len(a, config);

  GroupPlace g;
  g.size = static_cast<int>(a.tensor_parallel_size);
  g.local_size = static_cast<int>(a.tensor_parallel_size / a.nnodes);
  const std::optional<WorkerPlace> worker = worker_place_from_env();
  if (worker) {
    CHECK(worker->rank < g.size, "HYSERVE_TP_RANK ", worker->rank, " outside the group of ",
          g.size);
    g.rank = worker->rank;
  } else {
    g.rank = static_cast<int>(a.node_rank) * g.local_size;
  }
  g.local_rank = g.rank % g.local_size;
  if (g.size > 1) {
    // Heads, widths or experts that do not divide fail here, by name.
    shard_config(config, g.size, a.enable_expert_parallel);
    if (device == "cuda" && !worker) {
      require(device_count_or_zero() >= g.local_size, "--tensor-parallel-size ", g.size, " over ",
              a.nnodes, " node(s) needs ", g.local_size, " GPUs on this node, ",
              device_count_or_zero(), " visible");
    }
  }
  if (worker) return run_worker_rank(a, dir, device, max_model_len, g, *worker);
  if (a.headless) return run_headless_node(a, g, device);

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

  // Tensor parallelism: the rendezvous, then a worker process per local GPU slot (the other
  // nodes start theirs with --headless).
  std::unique_ptr<parallel::TcpStore> store;
  WorkerProcesses workers;
  if (g.size > 1) {
    parallel::TcpStoreOptions so;
    so.host = a.nnodes > 1 ? "0.0.0.0" : a.master_addr;
    so.port = a.master_port.value_or(0);
    so.is_server = true;
    so.timeout = distributed_timeout();
    store = std::make_unique<parallel::TcpStore>(so);
    const std::string master = str_cat(a.master_addr, ":", store->port());
    for (int r = 1; r < g.local_size; ++r) workers.spawn(r, r, master, device == "cuda");
    log::info("tensor parallel: {} ranks on {} node(s), rendezvous at {}", g.size, a.nnodes,
              master);
  }
  const auto check_workers = [&] {
    if (const auto e = workers.poll_exit()) {
      throw Error(str_cat("tensor parallel: ", e->what, " while the group was starting"));
    }
  };
  RankModel rm = load_rank(a, dir, device, max_model_len, g, store.get(), check_workers);
  std::unique_ptr<Model> model = std::move(rm.model);
  EngineConfig ec = rm.engine;
  // Generation stops at the config's EOS ids and at the tokenizer's eos_token (for Kimi
  // chat, <|im_end|>), as vLLM does.
  for (int64_t id : model->config().eos_token_ids)
    ec.scheduler.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (special.eos_token) {
    const int32_t id = tokenizer->token_id(*special.eos_token);
    if (id >= 0 && id < model->config().vocab_size) ec.scheduler.eos_token_ids.push_back(id);
  }
  const int64_t num_blocks = ec.num_blocks;
  const CachePlan kv_plan = model->cache_plan(ec.min_block_size);
  const int64_t block_size = kv_plan.tokens_per_block();
  // The budget, as vLLM logs it: what the pool holds and how many full-length requests fit;
  // then which kernels each layer runs.
  log::info(
      "{} (max_model_len); workspace {:.2f} GiB reserved (score chunk sized for "
      "max_model_len)",
      format_memory_summary(kv_plan, rm.memory),
      static_cast<double>(ec.workspace_bytes) / (1024.0 * 1024.0 * 1024.0));
  for (const std::string& line : model->kernel_plan()) log::info("kernel plan: {}", line);

  // The workers' step channel: its port through the store.
  std::unique_ptr<parallel::LeaderChannel> channel;
  std::unique_ptr<LeaderLink> link;
  if (g.size > 1) {
    channel = std::make_unique<parallel::LeaderChannel>(a.nnodes > 1 ? "0.0.0.0" : a.master_addr, 0,
                                                        distributed_timeout());
    store->set("step_channel_port", parallel::encode_counter(channel->port()));
    channel->accept_workers(g.size);
    link = std::make_unique<LeaderLink>(*channel);
  }
  Engine engine(std::move(model), ec);
  if (link) engine.set_plan_sink(link.get());
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
  const sigset_t signals = block_stop_signals();
  server.start();
  log::info(
      "serving {} as '{}' on http://{}:{} (device {}, tensor parallel {}, max_model_len {}, KV "
      "cache {} blocks of {} tokens, prefix caching {})",
      dir.string(), so.served_model_names[0], a.host, server.port(), device, g.size, max_model_len,
      num_blocks, block_size, ec.enable_prefix_caching ? "on" : "off");
  // Until a signal; with workers, also until one of them fails: a worker that exits or
  // reports an error, or a step that failed (a hung worker: the collective's timeout).
  std::optional<std::string> failure;
  for (;;) {
    const int sig = wait_signal(signals, std::chrono::milliseconds(200));
    if (sig > 0) {
      log::info("signal {}, draining", sig);
      break;
    }
    if (g.size == 1) continue;
    // A worker's own report first (its error message), then how its process ended.
    failure = channel->failure();
    if (const auto e = workers.poll_exit()) {
      failure = failure ? str_cat(*failure, "; ", e->what) : e->what;
    }
    if (!failure && !engine.alive()) {
      failure = link->diagnose(std::chrono::seconds(2))
                    .value_or("a step failed (the error above); the workers answered every step");
    }
    if (failure) break;
  }
  if (failure) log::error("tensor parallel: {}; the server stops", *failure);
  server.stop();
  engine.stop();
  if (link) link->stop();
  workers.terminate(std::chrono::seconds(failure ? 5 : 60));
  if (channel) channel->close(std::chrono::seconds(failure ? 1 : 30));
  return failure ? 1 : 0;
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
  cmd->add_flag("--enable-expert-parallel", a->enable_expert_parallel,
                "routed experts whole on their ranks (E / tensor-parallel size each) instead of "
                "a slice of every expert on every rank");
  cmd->add_option("--token-sharded-prefill", a->token_sharded_prefill,
                  "tensor parallel: prefill steps of at least this many tokens run each MLA "
                  "layer's indexer and attention on 1/N of the tokens with every head (0: off)")
      ->capture_default_str();
  cmd->add_option("--nnodes", a->nnodes, "nodes the tensor-parallel group spans")
      ->capture_default_str();
  cmd->add_option("--node-rank", a->node_rank, "this node's index (0: rank 0, the API server)")
      ->capture_default_str();
  cmd->add_option("--master-addr", a->master_addr, "node 0's address (the rendezvous)")
      ->capture_default_str();
  cmd->add_option("--master-port", a->master_port,
                  "the rendezvous port on node 0 (default on one node: a free one)");
  cmd->add_flag("--headless", a->headless, "a node > 0: run its workers, no API server");
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
