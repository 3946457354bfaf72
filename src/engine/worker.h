// Worker: one rank's model made ready for an engine (vLLM's Worker). In order, it
//
//   1. loads the rank's shard of the checkpoint on its backend, with the group's
//      communicators (TP over the whole group, DCP over groups of consecutive ranks);
//   2. waits for every rank to have loaded (ranks load at their own pace);
//   3. warms up: a step of max_num_batched_tokens tokens sizes the workspace, which the
//      runner reserves once (plus the indexer's score chunk grown to max_model_len), and the
//      op scratch is grown to a DSA decode step of max_num_seqs sequences;
//   4. measures the device's memory (CUDA: total and in use after the warm-up) and plans the
//      KV pool with the one planner (kv/memory_plan.h), refusing a pool that cannot hold one
//      request of max_model_len tokens;
//   5. agrees on the pool with the other ranks: every rank takes the smallest rank's blocks;
//   6. completes the engine config: the pool's blocks, the workspace, which decode batches
//      replay CUDA graphs (captured by the decode step on a bucket's first use).
//
// Rank 0 hands its model to the Engine (release_model); a rank > 0 runs the leader's step
// plans on it (run_leader_plans). The worker owns the communicators the model uses: it must
// outlive the model, wherever the model went.
//
// The flags themselves (their parsing, their names' checks, the tokenizer, the server) are
// the CLI's: messages name serve's flags because that is where the values come from.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "kv/cache_format.h"
#include "kv/cache_plan.h"
#include "kv/memory_plan.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/store.h"

namespace hyserve {

// The step scratch as serve sizes it (step 3 above): what a warm-up step of
// max_num_batched_tokens tokens (at most max_model_len - 1) on a fresh sequence takes, plus
// the indexer's score chunk grown to max_model_len keys. The runner reserves its workspace to
// this once (EngineConfig::workspace_bytes), so no step grows it.
size_t step_workspace_bytes(const Model& model, const SchedulerConfig& sc);

struct WorkerConfig {
  std::filesystem::path model_dir;
  std::string device = "cpu";  // "cpu" or "cuda" (this process's device 0)
  // How the model runs (batch invariance, expert parallelism, token-sharded prefill, the
  // index keys' format). The worker sets latent_cache (from kv_cache_dtype) and the
  // communicators of parallel.tp / parallel.dcp (from the group).
  ModelOptions model;
  std::optional<LatentCacheDtype> kv_cache_dtype;  // none: auto, the model's default
  // The engine's limits and policies as given (scheduler limits, min_block_size, prefix
  // caching, speculative decoding, asynchronous scheduling). The worker fills num_blocks,
  // workspace_bytes and decode_graph_max_batch, then completes it (complete_engine_config).
  EngineConfig engine;
  // The KV pool's memory: this fraction of the device, or exactly kv_cache_memory_bytes
  // when > 0; on the CPU, max_num_seqs full-length requests' worth, 4 GiB at most.
  double gpu_memory_utilization = 0.9;
  int64_t kv_cache_memory_bytes = 0;
  bool enforce_eager = false;  // decode without CUDA graphs
  // Random weights of the config's shapes and storage formats (model/random_weights.h, a
  // fixed seed) instead of the folder's safetensors: --load-format dummy.
  bool dummy_weights = false;
};

// Where the rank sits in its tensor-parallel group and how it reaches the others. One rank:
// the defaults (no store, no waits).
struct WorkerGroup {
  int rank = 0;
  int size = 1;      // tensor-parallel ranks
  int dcp_size = 1;  // decode context parallelism: groups of this many consecutive ranks
  parallel::Store* store = nullptr;  // the rendezvous (size > 1); not owned
  std::chrono::milliseconds timeout = std::chrono::seconds(120);  // every wait on another rank
  std::chrono::milliseconds load_timeout = std::chrono::seconds(1800);  // the slowest load
  // Called about every second while the rank waits on the others (it may throw: e.g. when a
  // worker process died); none: nothing to check.
  std::function<void()> poll;
};

class Worker {
 public:
  // Steps 1-6 above. Throws Error when the pool does not fit, CommError when a rank does
  // not come within the group's timeouts.
  Worker(const WorkerConfig& config, const WorkerGroup& group = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The rank's model (until release_model).
  const Model& model() const;
  // The model, for the Engine; the worker must outlive it (its communicators).
  std::unique_ptr<Model> release_model();
  // The engine's config: the group's num_blocks, completed for this model.
  const EngineConfig& engine_config() const { return engine_; }
  // This rank's own plan (before the group took the smallest pool) and its row layout.
  const MemoryPlan& memory_plan() const { return memory_; }
  const CachePlan& cache_plan() const { return cache_plan_; }

  // A rank > 0: connects to the leader's step channel at `leader_host` (its port from the
  // store) and runs the leader's plans on its shard until the leader says stop.
  void run_leader_plans(const std::string& leader_host);

 private:
  void load_model();
  void wait_for_group_load();
  void plan_kv_pool();
  void agree_on_pool();
  void complete_config();

  WorkerConfig config_;
  WorkerGroup group_;
  // Declared before the model: it is destroyed first.
  std::unique_ptr<parallel::Communicator> tp_comm_;
  std::unique_ptr<parallel::Communicator> dcp_comm_;
  std::unique_ptr<Model> model_;
  EngineConfig engine_;
  CachePlan cache_plan_;
  MemoryPlan memory_;
};

}  // namespace hyserve
