// MemoryPlan: how many rows of the packed hybrid block cache (cache_plan.h) one GPU, or the
// host, gives the KV pool, and how many full-length contexts those rows hold. The one
// planner of the pool's size: `hyserve serve` sizes its pool with it and `hyserve info
// --gpu-memory` prints it, so the two agree on the same inputs.
//
// The pool's bytes, the first rule that applies:
//   1. kv_cache_memory_bytes > 0: exactly that (vLLM's --kv-cache-memory-bytes);
//   2. gpu_memory_bytes > 0: round(gpu_memory_bytes * gpu_memory_utilization)
//      - weight_bytes - reserve_bytes, 0 when negative (vLLM's --gpu-memory-utilization);
//   3. otherwise (host memory, the CPU backend): what max_num_seqs requests of
//      context_tokens need, at most kHostKvCacheBytes (vLLM's CPU default).
// num_blocks = pool bytes / row_bytes (whole rows).
//
// A request of context_tokens positions holds blocks_per_request rows while it runs (its
// token blocks + its live KDA state); with prefix caching it also leaves the policy's KDA
// snapshots behind (blocks_per_context), which are cache that can be evicted.
#pragma once

#include <cstdint>
#include <string>

#include "kv/cache_plan.h"

namespace hyserve {

inline constexpr int64_t kHostKvCacheBytes = int64_t{4} << 30;

struct MemoryBudget {
  int64_t gpu_memory_bytes = 0;         // per GPU; 0: no GPU (rule 3)
  double gpu_memory_utilization = 0.9;  // fraction of gpu_memory_bytes hyserve may use
  int64_t weight_bytes = 0;             // per GPU (info: estimate_weight_bytes_per_gpu)
  // Activations, transients, workspaces, CUDA graphs. serve measures it: everything the
  // device holds after loading and the warm-up step (weights included, weight_bytes 0).
  int64_t reserve_bytes = 0;
  int64_t context_tokens = int64_t{1} << 20;  // one full context (serve: max_model_len)
  SnapshotPolicy snapshots = {};
  int64_t kv_cache_memory_bytes = 0;  // > 0: the pool's bytes outright (rule 1)
  int64_t max_num_seqs = 1;           // rule 3: the pool holds this many full requests
};

struct MemoryPlan {
  MemoryBudget budget;
  int64_t usable_bytes = 0;             // rule 2: round(gpu_memory_bytes * utilization)
  int64_t cache_bytes = 0;              // the pool's bytes (the rules above)
  bool fits = false;                    // rule 2: weights + reserve fit in usable memory
  int64_t num_blocks = 0;               // rows of the pool on each GPU
  int64_t tokens_per_gpu = 0;           // num_blocks * block_size token slots
  int64_t tokens_per_dcp_group = 0;     // num_blocks * tokens_per_block positions
  int64_t context_token_blocks = 0;     // ceil(context_tokens / tokens_per_block)
  int64_t blocks_per_request = 0;       // token blocks + 1 live KDA state (KDA models)
  int64_t context_snapshot_blocks = 0;  // policy's snapshots of one full context
  int64_t blocks_per_context = 0;       // blocks_per_request + snapshots
  int64_t num_full_contexts = 0;        // num_blocks / blocks_per_context
  double concurrency = 0;               // num_blocks / blocks_per_request (vLLM's log line)
};

MemoryPlan plan_memory(const CachePlan& plan, const MemoryBudget& budget);

// One line, as `serve` logs it: "KV cache 17.57 GiB (271 blocks x 69599232 bytes, 1110016
// token slots), 1.05x concurrency at 1048576 tokens".
std::string format_memory_summary(const CachePlan& plan, const MemoryPlan& memory);
// The layout (format_cache_plan) followed by the memory plan, for `hyserve info`.
std::string format_cache_plan(const CachePlan& plan, const MemoryPlan& memory);

}  // namespace hyserve
