// MemoryPlan: the one planner of the KV pool's size, which `serve` (measured device, host
// memory, --kv-cache-memory-bytes) and `info --gpu-memory` (given size, estimated weights,
// --reserve) both call; every rule against a hand computation on a small plan.
#include "kv/memory_plan.h"

#include <string>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

// Layers K M; fp8 latent 30 + 8 = 38 B, fp8 index keys 32 + 4 = 36 B per token; KDA 2
// heads x 4, conv 4. KDA state: conv 3*8*3*4 = 288 B -> 512, recurrent 8*4*4 = 128 B ->
// 768 in all. Token row at bs 8: latent 304 -> 512, keys 288 -> 512: 1024 B >= 768 (bs 4
// gives 512 < 768).
CachePlan small_plan() {
  CacheSpec spec;
  spec.layers = {CacheLayerKind::kKda, CacheLayerKind::kFullAttention};
  spec.kv_lora_rank = 30;
  spec.qk_rope_head_dim = 8;
  spec.index_head_dim = 32;
  spec.kda_num_heads = 2;
  spec.kda_head_dim = 4;
  spec.kda_conv_kernel = 4;
  return plan_cache(spec, {.min_block_size = 1});
}

TEST(MemoryPlan, SmallPlanIsTheHandComputedOne) {
  const CachePlan p = small_plan();
  EXPECT_EQ(p.kda_state_bytes, 768);
  EXPECT_EQ(p.block_size, 8);
  EXPECT_EQ(p.row_bytes, 1024);
}

// serve on the CPU: max_num_seqs requests of max_model_len, at most 4 GiB.
TEST(MemoryPlan, HostPoolHoldsMaxNumSeqsRequests) {
  const CachePlan p = small_plan();
  // 100 tokens: ceil(100 / 8) = 13 token blocks + 1 KDA state = 14 rows per request;
  // 3 requests: 42 rows = 43,008 B. One snapshot at the prompt end (boundary 12): 15 rows
  // per context, 42 / 15 = 2 full contexts.
  const MemoryPlan m = plan_memory(p, {.context_tokens = 100, .max_num_seqs = 3});
  EXPECT_TRUE(m.fits);
  EXPECT_EQ(m.usable_bytes, 0);
  EXPECT_EQ(m.cache_bytes, 43'008);
  EXPECT_EQ(m.num_blocks, 42);
  EXPECT_EQ(m.tokens_per_gpu, 336);
  EXPECT_EQ(m.context_token_blocks, 13);
  EXPECT_EQ(m.blocks_per_request, 14);
  EXPECT_EQ(m.context_snapshot_blocks, 1);
  EXPECT_EQ(m.blocks_per_context, 15);
  EXPECT_EQ(m.num_full_contexts, 2);
  EXPECT_EQ(m.concurrency, 3.0);
  EXPECT_EQ(format_memory_summary(p, m),
            "KV cache 0.00 GiB (42 blocks x 1024 bytes, 336 token slots), 3.00x concurrency at "
            "100 tokens");

  // 256 requests of 2^20 tokens want 256 * (131,072 + 1) rows of 1 KiB: more than 4 GiB, so
  // the pool is 4 GiB = 4,194,304 rows.
  const MemoryPlan big = plan_memory(p, {.context_tokens = 1 << 20, .max_num_seqs = 256});
  EXPECT_EQ(big.cache_bytes, kHostKvCacheBytes);
  EXPECT_EQ(big.num_blocks, 4'194'304);
}

// --kv-cache-memory-bytes: exactly that, whatever the device.
TEST(MemoryPlan, GivenCacheBytesWinOverTheDevice) {
  const CachePlan p = small_plan();
  const MemoryPlan m = plan_memory(p, {.gpu_memory_bytes = 1'000'000,
                                       .weight_bytes = 999'999,
                                       .context_tokens = 64,
                                       .kv_cache_memory_bytes = 10'000});
  EXPECT_TRUE(m.fits);
  EXPECT_EQ(m.cache_bytes, 10'000);
  EXPECT_EQ(m.num_blocks, 9);  // 9 * 1024 = 9,216 <= 10,000 < 10,240
  EXPECT_EQ(m.tokens_per_gpu, 72);
  // 64 tokens: 8 blocks + 1 state; the snapshot at boundary 8: 10 per context.
  EXPECT_EQ(m.blocks_per_request, 9);
  EXPECT_EQ(m.blocks_per_context, 10);
  EXPECT_EQ(m.num_full_contexts, 0);
  EXPECT_EQ(m.concurrency, 1.0);
}

// The device: what --gpu-memory-utilization leaves after the weights and the reserve.
// info passes the estimated weights and --reserve; serve passes everything the device
// holds after the warm-up step as the reserve. The same numbers give the same plan.
TEST(MemoryPlan, DeviceRuleIsTheSameForInfoAndServe) {
  const CachePlan p = small_plan();
  // 100,000 B x 0.5 = 50,000 usable; - 20,000 weights - 9,000 reserve = 21,000 B for the
  // cache: 20 rows (20,480 B).
  const MemoryBudget info{.gpu_memory_bytes = 100'000,
                          .gpu_memory_utilization = 0.5,
                          .weight_bytes = 20'000,
                          .reserve_bytes = 9'000,
                          .context_tokens = 100};
  const MemoryPlan m = plan_memory(p, info);
  EXPECT_TRUE(m.fits);
  EXPECT_EQ(m.usable_bytes, 50'000);
  EXPECT_EQ(m.cache_bytes, 21'000);
  EXPECT_EQ(m.num_blocks, 20);
  EXPECT_EQ(m.tokens_per_gpu, 160);
  EXPECT_EQ(m.num_full_contexts, 1);  // 20 / 15
  EXPECT_DOUBLE_EQ(m.concurrency, 20.0 / 14.0);

  // serve: the device holds 29,000 B after loading and warming up (weights included).
  const MemoryBudget serve{.gpu_memory_bytes = 100'000,
                           .gpu_memory_utilization = 0.5,
                           .reserve_bytes = 29'000,
                           .context_tokens = 100,
                           .max_num_seqs = 256};
  const MemoryPlan s = plan_memory(p, serve);
  EXPECT_EQ(s.cache_bytes, m.cache_bytes);
  EXPECT_EQ(s.num_blocks, m.num_blocks);
  EXPECT_EQ(s.blocks_per_request, m.blocks_per_request);
  // serve logs the line info prints.
  const std::string text = format_cache_plan(p, m);
  EXPECT_NE(text.find(format_memory_summary(p, s)), std::string::npos) << text;
  EXPECT_NE(text.find("20 blocks -> 160 token slots"), std::string::npos) << text;

  // Weights + reserve over the usable memory: does not fit, no rows.
  MemoryBudget too_big = info;
  too_big.weight_bytes = 45'000;
  const MemoryPlan t = plan_memory(p, too_big);
  EXPECT_FALSE(t.fits);
  EXPECT_EQ(t.cache_bytes, 0);
  EXPECT_EQ(t.num_blocks, 0);
  EXPECT_NE(format_cache_plan(p, t).find("does not fit"), std::string::npos);
}

TEST(MemoryPlan, RefusesBadBudgets) {
  const CachePlan p = small_plan();
  EXPECT_THROW(plan_memory(p, {.gpu_memory_bytes = 1000, .gpu_memory_utilization = 0}),
               InvalidArgument);
  EXPECT_THROW(plan_memory(p, {.gpu_memory_bytes = 1000, .gpu_memory_utilization = 1.5}),
               InvalidArgument);
  EXPECT_THROW(plan_memory(p, {.context_tokens = 0}), InvalidArgument);
  EXPECT_THROW(plan_memory(p, {.max_num_seqs = 0}), InvalidArgument);
  EXPECT_THROW(plan_memory(p, {.kv_cache_memory_bytes = -1}), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
