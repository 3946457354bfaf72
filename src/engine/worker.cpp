// The Worker (worker.h): a rank's shard loaded, warmed up, its KV pool planned and agreed.
#include "engine/worker.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "engine/model_runner.h"
#include "engine/tensor_parallel_group.h"
#include "model/config.h"
#include "model/random_weights.h"
#include "parallel/make_communicator.h"
#include "parallel/step_channel.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {
namespace {

// --load-format dummy: every rank makes the same tensors (their shards of them).
constexpr uint64_t kDummyWeightsSeed = 0;

// Sets key/rank to `value` and returns every rank's value once all have set theirs,
// calling `poll` (when given; it may throw) about every second while it waits.
std::vector<int64_t> exchange(const WorkerGroup& g, const std::string& key, int64_t value,
                              std::chrono::milliseconds timeout) {
  parallel::Store& store = *g.store;
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
        if (g.poll) g.poll();
      }
    }
  }
  return values;
}

// What the device holds now and what the engine takes before its first step (the runner's
// workspace and buffers, the LoRA slots' rooms), on CUDA: the budget's gpu_memory_bytes and
// reserve_bytes.
void measure_device_memory(const Model& model, const EngineConfig& ec, MemoryBudget& budget) {
  if (const std::optional<DeviceMemoryInfo> m = model.backend().memory_info()) {
    budget.gpu_memory_bytes = static_cast<int64_t>(m->total_bytes);
    // In use now (weights, op workspaces, the decode scratch), plus what the engine takes
    // before its first step: the runner's workspace and buffers.
    budget.reserve_bytes = static_cast<int64_t>(m->total_bytes - m->free_bytes) +
                           static_cast<int64_t>(ec.workspace_bytes) +
                           ModelRunner::device_bytes(model, runner_config(ec)) +
                           model.lora_device_bytes(ec.scheduler.max_loras, ec.max_lora_rank);
  }
}

}  // namespace

Worker::Worker(const WorkerConfig& config, const WorkerGroup& group)
    : config_(config), group_(group), engine_(config.engine) {
  CHECK(group_.size == 1 || group_.store != nullptr, "worker: a group of ", group_.size,
        " ranks needs a store");
  load_model();
  wait_for_group_load();
  plan_kv_pool();
  agree_on_pool();
  complete_config();
}

Worker::~Worker() = default;

const Model& Worker::model() const {
  CHECK(model_ != nullptr, "worker: the model was released");
  return *model_;
}

std::unique_ptr<Model> Worker::release_model() {
  CHECK(model_ != nullptr, "worker: the model was released");
  return std::move(model_);
}

// The rank's backend, the group's communicators on it, its shard of the weights.
void Worker::load_model() {
  const ModelConfig config = ModelConfig::load(config_.model_dir);
  std::unique_ptr<Backend> backend =
      config_.device == "cuda" ? make_cuda_backend(0) : make_cpu_backend();
  ModelOptions mo = config_.model;
  mo.latent_cache = resolve_latent_cache_dtype(config_.kv_cache_dtype, config.cache_spec());
  const WorkerGroup& g = group_;
  if (g.size > 1) {
    tp_comm_ =
        parallel::make_backend_communicator(*backend, *g.store, g.rank, g.size, g.timeout, "tp");
    mo.parallel.tp = {g.rank, g.size, tp_comm_.get()};
  }
  // DCP groups: consecutive ranks of the TP group, each caching every W-th position.
  const int dcp = g.dcp_size;
  if (dcp > 1) {
    dcp_comm_ = parallel::make_backend_communicator(*backend, *g.store, g.rank % dcp, dcp,
                                                    g.timeout, str_cat("dcp", g.rank / dcp));
    mo.parallel.dcp = {g.rank % dcp, dcp, dcp_comm_.get()};
  }
  if (config_.dummy_weights) {
    log::info("{}: random weights (--load-format dummy)", config_.model_dir.string());
    model_ = Model::create(config, std::make_unique<RandomWeights>(config, kDummyWeightsSeed), mo,
                           std::move(backend));
  } else {
    model_ = Model::load(config_.model_dir, mo, std::move(backend));
  }
}

// Ranks load at their own pace; the first collective waits for the slowest.
void Worker::wait_for_group_load() {
  if (group_.size > 1) exchange(group_, "loaded", 1, group_.load_timeout);
}

// The KV pool, by the memory planner (kv/memory_plan.h; `hyserve info` prints the same
// plan). kv_cache_memory_bytes when given. Otherwise, on the GPU, vLLM's method: a warm-up
// step of max_num_batched_tokens tokens sizes the activations, the workspaces and the
// per-weight device tables; the runner's workspace will be reserved to that step's plus the
// indexer's score chunk grown to a max_model_len context (workspace_bytes), the op scratch
// is grown to a decode step of max_num_seqs sequences (the DSA step over the FP8 latent, the
// MLA kernels' otherwise; with LoRA, a step through kv_b's adapters too), and the pool gets
// what gpu_memory_utilization of the device leaves after those and the runner's buffers.
// On the CPU: what max_num_seqs requests of max_model_len tokens need, at most 4 GiB.
size_t step_workspace_bytes(const Model& model, const SchedulerConfig& sc) {
  SequenceState warm = model.new_sequence();
  const std::vector<int32_t> tokens(
      static_cast<size_t>(std::min(sc.max_num_batched_tokens, sc.max_model_len - 1)), 0);
  std::vector<float> logits;
  model.forward(tokens, warm, logits);
  return warm.workspace->capacity_bytes() +
         static_cast<size_t>(model.context_transient_bytes(sc.max_model_len));
}

void Worker::plan_kv_pool() {
  const Model& model = *model_;
  EngineConfig& ec = engine_;
  cache_plan_ = model.cache_plan(ec.min_block_size);
  const CachePlan& plan = cache_plan_;
  const SchedulerConfig& sc = ec.scheduler;
  MemoryBudget budget;
  budget.gpu_memory_utilization = config_.gpu_memory_utilization;
  budget.context_tokens = sc.max_model_len;
  budget.snapshots = ec.snapshot_policy;
  budget.kv_cache_memory_bytes = config_.kv_cache_memory_bytes;
  budget.max_num_seqs = sc.max_num_seqs;
  ec.workspace_bytes = step_workspace_bytes(model, sc);
  // The DSA decode step's scratch (FP8 latent): scores [max_num_seqs, max_model_len] etc.;
  // with speculative decoding every verified token is a query row of it.
  const ModelRunnerConfig rc = runner_config(ec);
  model.reserve_decode_scratch(std::max(sc.max_num_seqs, ModelRunner::max_verify_tokens(rc)),
                               sc.max_model_len, sc.max_num_batched_tokens);
  measure_device_memory(model, ec, budget);
  const MemoryPlan mp = plan_memory(plan, budget);
  CHECK(mp.fits && mp.cache_bytes > 0, "--gpu-memory-utilization ", config_.gpu_memory_utilization,
        ": ", mp.usable_bytes >> 20, " MiB usable, the weights and a step's buffers take ",
        budget.reserve_bytes >> 20, " MiB; nothing is left for the KV cache");
  CHECK(mp.num_blocks >= mp.blocks_per_request, "the KV cache gets ", mp.cache_bytes >> 20,
        " MiB = ", mp.num_blocks, " blocks of ", plan.row_bytes,
        " bytes; one request of max_model_len ", sc.max_model_len, " tokens needs ",
        mp.blocks_per_request, ": lower --max-model-len or give the cache more memory");
  CHECK(mp.num_blocks <= std::numeric_limits<int32_t>::max(), mp.num_blocks, " KV blocks");
  memory_ = mp;
}

// Every rank runs the same plans over the same block ids: the smallest rank's pool.
void Worker::agree_on_pool() {
  int64_t blocks = memory_.num_blocks;
  if (group_.size > 1) {
    const std::vector<int64_t> all = exchange(group_, "num_blocks", blocks, group_.timeout);
    blocks = *std::min_element(all.begin(), all.end());
  }
  engine_.num_blocks = static_cast<int32_t>(blocks);
}

void Worker::complete_config() {
  // Decode steps replay CUDA graphs (vLLM's default; enforce_eager turns them off).
  if (config_.device == "cuda" && !config_.enforce_eager) {
    engine_.decode_graph_max_batch = std::min<int64_t>(engine_.scheduler.max_num_seqs, 256);
  }
  engine_ = complete_engine_config(*model_, engine_);
}

void Worker::run_leader_plans(const std::string& leader_host) {
  CHECK(model_ != nullptr && group_.size > 1 && group_.rank > 0,
        "worker: only a rank > 0 of a group runs the leader's plans");
  const WorkerGroup& g = group_;
  const int port = static_cast<int>(
      parallel::decode_counter("step_channel_port", g.store->get("step_channel_port", g.timeout)));
  parallel::WorkerChannel channel(leader_host, port, g.rank, g.timeout);
  log::info("rank {} of {}: ready ({} KV blocks)", g.rank, g.size, engine_.num_blocks);
  run_tensor_parallel_worker(*model_, engine_, channel);
  log::info("rank {} of {}: stopped", g.rank, g.size);
}

}  // namespace hyserve
