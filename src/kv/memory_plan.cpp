#include "kv/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/error.h"
#include "util/format.h"

namespace hyserve {
namespace {

std::string gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

}  // namespace

MemoryPlan plan_memory(const CachePlan& plan, const MemoryBudget& budget) {
  CHECK(budget.gpu_memory_bytes >= 0 && budget.kv_cache_memory_bytes >= 0,
        "gpu_memory_bytes and kv_cache_memory_bytes must be >= 0");
  CHECK(budget.gpu_memory_utilization > 0 && budget.gpu_memory_utilization <= 1,
        "gpu_memory_utilization must be in (0, 1], got ", budget.gpu_memory_utilization);
  CHECK(budget.weight_bytes >= 0 && budget.reserve_bytes >= 0 && budget.context_tokens >= 1,
        "weight_bytes, reserve_bytes must be >= 0 and context_tokens >= 1");
  CHECK(budget.max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", budget.max_num_seqs);
  CHECK(budget.snapshots.every_blocks >= 0, "snapshot interval must be >= 0");
  CHECK(plan.row_bytes > 0, "empty cache plan");
  MemoryPlan m;
  m.budget = budget;
  m.context_token_blocks = plan.blocks_for_tokens(budget.context_tokens);
  const bool has_kda = plan.kda_state_rows > 0;
  m.blocks_per_request = m.context_token_blocks + (has_kda ? plan.kda_state_rows : 0);
  m.context_snapshot_blocks =
      has_kda ? budget.snapshots.num_snapshots(budget.context_tokens / plan.tokens_per_block()) : 0;
  m.blocks_per_context = m.blocks_per_request + m.context_snapshot_blocks;

  m.fits = true;
  if (budget.kv_cache_memory_bytes > 0) {
    m.cache_bytes = budget.kv_cache_memory_bytes;
  } else if (budget.gpu_memory_bytes > 0) {
    m.usable_bytes =
        std::llround(static_cast<double>(budget.gpu_memory_bytes) * budget.gpu_memory_utilization);
    const int64_t left = m.usable_bytes - budget.weight_bytes - budget.reserve_bytes;
    m.fits = left >= 0;
    m.cache_bytes = std::max<int64_t>(left, 0);
  } else {
    m.cache_bytes =
        std::min(kHostKvCacheBytes, budget.max_num_seqs * m.blocks_per_request * plan.row_bytes);
  }
  m.num_blocks = m.cache_bytes / plan.row_bytes;
  m.tokens_per_gpu = m.num_blocks * plan.block_size;
  m.tokens_per_dcp_group = m.num_blocks * plan.tokens_per_block();
  m.num_full_contexts = m.num_blocks / m.blocks_per_context;
  m.concurrency = static_cast<double>(m.num_blocks) / static_cast<double>(m.blocks_per_request);
  return m;
}

std::string format_memory_summary(const CachePlan& plan, const MemoryPlan& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "KV cache %.2f GiB (%lld blocks x %lld bytes, %lld token slots), %.2fx "
                "concurrency at %lld tokens",
                static_cast<double>(m.num_blocks) * static_cast<double>(plan.row_bytes) /
                    (1024.0 * 1024.0 * 1024.0),
                static_cast<long long>(m.num_blocks), static_cast<long long>(plan.row_bytes),
                static_cast<long long>(m.tokens_per_gpu), m.concurrency,
                static_cast<long long>(m.budget.context_tokens));
  return buf;
}

std::string format_cache_plan(const CachePlan& plan, const MemoryPlan& m) {
  const auto& b = m.budget;
  std::string s = format_cache_plan(plan);
  if (b.kv_cache_memory_bytes > 0) {
    s += "memory per GPU: cache " + gb(m.cache_bytes) + " given\n";
  } else if (b.gpu_memory_bytes > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", b.gpu_memory_utilization);
    s += "memory per GPU: " + gb(b.gpu_memory_bytes) + " x " + buf + " = " + gb(m.usable_bytes) +
         " usable; weights " + gb(b.weight_bytes) + ", reserve " + gb(b.reserve_bytes) +
         " -> cache " + gb(m.cache_bytes) + "\n";
  } else {
    s += "host memory: cache " + gb(m.cache_bytes) + " for " + std::to_string(b.max_num_seqs) +
         " requests\n";
  }
  if (!m.fits) {
    s += "  does not fit: weights + reserve exceed usable memory by " +
         gb(b.weight_bytes + b.reserve_bytes - m.usable_bytes) + "\n";
  }
  s += "  " + with_commas(m.num_blocks) + " blocks -> " + with_commas(m.tokens_per_gpu) +
       " token slots per GPU, " + with_commas(m.tokens_per_dcp_group) +
       " positions per DCP group\n";
  s += "  one " + with_commas(b.context_tokens) +
       "-token context: " + with_commas(m.context_token_blocks) + " token blocks + " +
       std::to_string(plan.kda_state_rows) + " KDA state + " +
       with_commas(m.context_snapshot_blocks) +
       " snapshots = " + with_commas(m.blocks_per_context) + " blocks -> " +
       with_commas(m.num_full_contexts) + " full contexts fit\n";
  s += "  " + format_memory_summary(plan, m) + "\n";
  return s;
}

}  // namespace hyserve
