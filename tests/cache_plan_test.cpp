// CachePlan: row layout, block size, KDA state rows, weight estimate and memory plan, against
// hand computations (K3.1 Pro at TP8) and a small config with awkward widths.
#include "kv/cache_plan.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "kv/memory_plan.h"
#include "model/config.h"
#include "model/weight_bytes.h"
#include "shared_config.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::shared_config;

// Layers K K M K M; fp8 latent 30 + 8 = 38 B, fp8 index keys 32 + 4 = 36 B per token;
// KDA 2 heads x 4, conv 4.
ModelConfig awkward_config() {
  ModelConfig c;
  c.num_hidden_layers = 5;
  c.layer_kinds = {LayerKind::kKda, LayerKind::kKda, LayerKind::kMla, LayerKind::kKda,
                   LayerKind::kMla};
  c.mlp_kinds.assign(5, MlpKind::kDense);
  c.kv_lora_rank = 30;
  c.qk_rope_head_dim = 8;
  c.index_n_heads = 1;
  c.index_head_dim = 32;
  c.linear_num_heads = 2;
  c.linear_head_dim = 4;
  c.linear_conv_kernel = 4;
  return c;
}

TEST(CachePlanTest, AwkwardWidthsArePaddedTo256AndCounted) {
  // TP2: 1 KDA head per GPU. Per KDA layer: conv 3*4*3*4 = 144 B -> 256, recurrent
  // 4*4*4 = 64 B -> 256: 512 B; 3 layers: 1536 B.
  // bs 1, 2, 4: each of the 4 pages rounds up to 256 -> 1024 B < 1536.
  // bs 8: latent 304 -> 512, index 288 -> 512: row 2048 >= 1536.
  const CachePlan p = plan_cache(awkward_config().cache_spec(), {.tp = 2, .min_block_size = 1});
  EXPECT_EQ(p.block_size, 8);
  EXPECT_EQ(p.row_bytes, 2048);
  EXPECT_EQ(p.token_bytes_per_slot, 2 * (38 + 36));
  EXPECT_EQ(p.padding_bytes, 2 * ((512 - 304) + (512 - 288)));
  EXPECT_EQ(p.token_bytes_per_slot * p.block_size + p.padding_bytes, p.row_bytes);
  ASSERT_EQ(p.pages.size(), 2u);
  EXPECT_EQ(p.pages[0].layer, 2);
  EXPECT_EQ(p.pages[0].latent_offset, 0);
  EXPECT_EQ(p.pages[0].latent_bytes, 304);
  EXPECT_EQ(p.pages[0].index_offset, 512);
  EXPECT_EQ(p.pages[0].index_bytes, 288);
  EXPECT_EQ(p.pages[1].layer, 4);
  EXPECT_EQ(p.pages[1].latent_offset, 1024);
  EXPECT_EQ(p.pages[1].index_offset, 1536);
  EXPECT_EQ(p.kda_heads_per_gpu, 1);
  EXPECT_EQ(p.kda_state_bytes, 1536);
  EXPECT_EQ(p.kda_state_rows, 1);
  ASSERT_EQ(p.kda_pages.size(), 3u);
  const int64_t layers[] = {0, 1, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.kda_pages[i].layer, layers[i]);
    EXPECT_EQ(p.kda_pages[i].conv_offset, 512 * i);
    EXPECT_EQ(p.kda_pages[i].conv_bytes, 144);
    EXPECT_EQ(p.kda_pages[i].recurrent_offset, 512 * i + 256);
    EXPECT_EQ(p.kda_pages[i].recurrent_bytes, 64);
  }
  EXPECT_EQ(&p.page(4), &p.pages[1]);
  EXPECT_EQ(&p.kda_page(3), &p.kda_pages[2]);
  EXPECT_THROW(p.page(3), InvalidArgument);
  EXPECT_THROW(p.kda_page(2), InvalidArgument);
  EXPECT_THROW(p.page(5), InvalidArgument);
}

TEST(CachePlanTest, DefaultMinimumBlockIs64AndDcpScalesPositions) {
  // bs 64: latent 2432 -> 2560 (pad 128), index 2304 (no pad); row 2 * 4864 = 9728.
  const CachePlan p = plan_cache(awkward_config().cache_spec(), {.tp = 2, .dcp = 2});
  EXPECT_EQ(p.block_size, 64);
  EXPECT_EQ(p.row_bytes, 9728);
  EXPECT_EQ(p.padding_bytes, 256);
  EXPECT_EQ(p.tokens_per_block(), 128);
  EXPECT_EQ(p.blocks_for_tokens(0), 0);
  EXPECT_EQ(p.blocks_for_tokens(128), 1);
  EXPECT_EQ(p.blocks_for_tokens(129), 2);
}

TEST(CachePlanTest, NoKdaLayersUsesTheMinimumBlock) {
  ModelConfig c = awkward_config();
  c.layer_kinds.assign(5, LayerKind::kMla);
  const CachePlan p =
      plan_cache(c.cache_spec(), {.index = IndexCacheDtype::kMxfp4, .min_block_size = 16});
  // latent 38*16 = 608 -> 768; mxfp4 keys (16 + 1)*16 = 272 -> 512; 5 layers.
  EXPECT_EQ(p.block_size, 16);
  EXPECT_EQ(p.row_bytes, 5 * (768 + 512));
  EXPECT_EQ(p.kda_state_rows, 0);
  EXPECT_EQ(p.kda_state_bytes, 0);
  const MemoryPlan m = plan_memory(p, {.gpu_memory_bytes = 64000,
                                       .gpu_memory_utilization = 1.0,
                                       .context_tokens = 100,
                                       .snapshots = {.every_blocks = 1}});
  EXPECT_EQ(m.num_blocks, 64000 / 6400);
  EXPECT_EQ(m.blocks_per_context, 7);  // ceil(100 / 16), no state or snapshots without KDA
  EXPECT_EQ(m.num_full_contexts, 1);
}

TEST(CachePlanTest, RefusesBadParallelLayouts) {
  EXPECT_THROW(plan_cache(awkward_config().cache_spec(), {.tp = 2, .dcp = 4}), InvalidArgument);
  EXPECT_THROW(plan_cache(awkward_config().cache_spec(), {.tp = 4}),
               InvalidArgument);  // 2 KDA heads
  EXPECT_THROW(plan_cache(awkward_config().cache_spec(), {.min_block_size = 48}), InvalidArgument);
}

TEST(CachePlanTest, SnapshotCountMatchesThePolicy) {
  for (int64_t every : {0, 1, 3, 8}) {
    for (bool at_end : {false, true}) {
      const SnapshotPolicy policy{.every_blocks = every, .at_prompt_end = at_end};
      for (int64_t n = 0; n <= 40; ++n) {
        int64_t count = 0;
        for (int64_t k = 0; k <= n; ++k) count += policy.should_snapshot(k, n);
        EXPECT_EQ(policy.num_snapshots(n), count)
            << "every " << every << " end " << at_end << " blocks " << n;
      }
    }
  }
}

TEST(CachePlanTest, KimiK31ProAtTp8MatchesHandComputation) {
  const auto path = shared_config("kimi-k3.1-pro-published.json");
  if (path.empty()) GTEST_SKIP() << "kimi-k3.1-pro-published.json not found";
  const ModelConfig c = ModelConfig::load(path);
  const CachePlan p = plan_cache(
      c.cache_spec(),
      {.latent = LatentCacheDtype::kFp8, .index = IndexCacheDtype::kFp8, .tp = 8, .dcp = 1});

  // KDA state per request at TP8: 96 / 8 = 12 heads of 128, 69 layers;
  // conv 3 x (3*12*128) fp32 = 55,296 B, recurrent 12*128*128 fp32 = 786,432 B.
  const int64_t kda_state = 69 * (3 * 3 * 12 * 128 * 4 + 12 * 128 * 128 * 4);
  EXPECT_EQ(kda_state, 58'079'232);
  EXPECT_EQ(p.kda_state_bytes, kda_state);
  EXPECT_EQ(p.kda_state_bytes, kda_state_bytes_per_request(c.cache_spec(), 8));
  EXPECT_EQ(p.kda_state_rows, 1);
  EXPECT_EQ(p.kda_heads_per_gpu, 12);
  // Per token slot: 24 layers x (576 + 132) = 16,992 B. 2048 slots = 34,799,616 B < the
  // state; 4096 slots = 69,599,232 B >= it. Pages of 576*4096 and 132*4096 B are multiples
  // of 256: no padding.
  EXPECT_EQ(p.token_bytes_per_slot, 16'992);
  EXPECT_LT(16'992 * 2048, kda_state);
  EXPECT_EQ(p.block_size, 4096);
  EXPECT_EQ(p.row_bytes, 69'599'232);
  EXPECT_EQ(p.padding_bytes, 0);
  ASSERT_EQ(p.pages.size(), 24u);
  for (int64_t j = 0; j < 24; ++j) {
    const CachePage& page = p.pages[j];
    EXPECT_EQ(page.layer, j < 23 ? 4 * j + 3 : 92) << j;
    EXPECT_EQ(page.latent_offset, j * (576 + 132) * 4096) << j;
    EXPECT_EQ(page.latent_bytes, 576 * 4096) << j;
    EXPECT_EQ(page.index_offset, j * (576 + 132) * 4096 + 576 * 4096) << j;
    EXPECT_EQ(page.index_bytes, 132 * 4096) << j;
  }
  ASSERT_EQ(p.kda_pages.size(), 69u);
  EXPECT_EQ(p.kda_pages[68].layer, 90);
  EXPECT_EQ(p.kda_pages[68].recurrent_offset, 68 * 841'728 + 55'296);

  // Weights per GPU at TP8 (bf16; fp32 small KDA tensors and biases; MXFP4 routed experts:
  // 17/32 B per value):
  //   embed + lm_head 2 * (163840/8) * 7168 * 2 + model.norm 7168 * 2   =     587,216,896
  //   AttnRes 2 * 7168 * 2 B per norm and per proj, 2 * 93 + 1 pairs       =       5,361,664
  //   norms 93 * 2 * 7168 * 2                                              =       2,666,496
  //   MLA replicated: q_a 1536*7168 + 1536, kv_a 576*7168 + 512, indexer wq_b 4096*1536,
  //     wk 128*7168, k_norm 256, weights_proj 32*7168: 22,579,456 values = 45,158,912 B
  //   MLA sharded: (q_b 18432*1536 + kv_b 24576*512 + o 7168*12288 + g 12288*7168) / 8
  //     = 27,131,904 values = 54,263,808 B; x24 layers with the replicated part
  //   KDA sharded (12 heads, 1536 wide): bf16 q, k, v 3*1536*7168, f_b 1536*128,
  //     b 12*7168, o 7168*1536, g_proj 1536*7168 = 55,332,864 values = 110,665,728 B;
  //     fp32 conv 3*1536*4, A_log 12, dt_bias 1536 = 19,980 values = 79,920 B
  //   KDA replicated: f_a 128*7168 * 2 + o_norm 128 * 4                   =       1,835,520
  //   dense MLP (layer 0): 3*7168*(33792/8) * 2                            =     181,665,792
  //   MoE x92: router 896*7168*2 + bias 896*4 = 12,848,640; shared 2*3*7168*384*2 =
  //     33,030,144; routed 896*3*3584*384 * 17/32 = 1,965,293,568; latent down + up
  //     2*3584*7168*2 + norm 3584*2 = 102,767,616
  const int64_t mla = 45'158'912 + 54'263'808, kda = 110'745'648 + 1'835'520;
  const int64_t moe = 12'848'640 + 33'030'144 + 1'965'293'568 + 102'767'616;
  const int64_t weights =
      587'216'896 + 5'361'664 + 2'666'496 + 24 * mla + 69 * kda + 181'665'792 + 92 * moe;
  const WeightBytes w = estimate_weight_bytes_per_gpu(c, 8);
  EXPECT_EQ(w.total(), weights);
  EXPECT_EQ(w.routed_experts, int64_t{92} * 1'965'293'568);
  EXPECT_EQ(weights, 205'413'633'776);  // > 141 GB: K3.1 Pro does not fit on 8 H200s

  const int64_t gpu = 141'000'000'000;
  const MemoryPlan too_big =
      plan_memory(p, {.gpu_memory_bytes = gpu, .weight_bytes = weights, .snapshots = {}});
  EXPECT_FALSE(too_big.fits);
  EXPECT_EQ(too_big.num_blocks, 0);
  EXPECT_EQ(too_big.num_full_contexts, 0);

  // A given weights estimate of 100 GB per GPU and an 8 GB reserve:
  // 141e9 * 0.9 = 126.9e9 usable; 18.9e9 for the cache; floor(18.9e9 / 69,599,232) = 271
  // (271 rows = 18,861,391,872 B; 272 rows = 18,930,991,104 B).
  const MemoryBudget budget{.gpu_memory_bytes = gpu,
                            .gpu_memory_utilization = 0.9,
                            .weight_bytes = 100'000'000'000,
                            .reserve_bytes = 8'000'000'000,
                            .context_tokens = 1 << 20,
                            .snapshots = {.every_blocks = 0, .at_prompt_end = true}};
  const MemoryPlan m = plan_memory(p, budget);
  EXPECT_TRUE(m.fits);
  EXPECT_EQ(m.usable_bytes, 126'900'000'000);
  EXPECT_EQ(m.cache_bytes, 18'900'000'000);
  EXPECT_EQ(m.num_blocks, 271);
  EXPECT_EQ(m.tokens_per_gpu, 271 * 4096);
  EXPECT_EQ(m.tokens_per_dcp_group, 271 * 4096);
  // 1M = 2^20 tokens: 256 token blocks + 1 live KDA state + 1 snapshot at the prompt end.
  EXPECT_EQ(m.context_token_blocks, 256);
  EXPECT_EQ(m.context_snapshot_blocks, 1);
  EXPECT_EQ(m.blocks_per_context, 258);
  EXPECT_EQ(m.num_full_contexts, 1);

  // DCP 8 (same row layout): a block id covers 32,768 positions; 32 + 1 + 1 = 34 blocks per
  // context, 271 / 34 = 7 contexts. A snapshot every 4th boundary adds 32/4 = 8 (the prompt
  // end, boundary 32, is one of them): 41 blocks, 6 contexts.
  const CachePlan p8 = plan_cache(c.cache_spec(), {.tp = 8, .dcp = 8});
  EXPECT_EQ(p8.row_bytes, p.row_bytes);
  const MemoryPlan m8 = plan_memory(p8, budget);
  EXPECT_EQ(m8.tokens_per_dcp_group, int64_t{271} * 4096 * 8);
  EXPECT_EQ(m8.blocks_per_context, 34);
  EXPECT_EQ(m8.num_full_contexts, 7);
  MemoryBudget periodic = budget;
  periodic.snapshots.every_blocks = 4;
  const MemoryPlan m8p = plan_memory(p8, periodic);
  EXPECT_EQ(m8p.context_snapshot_blocks, 8);
  EXPECT_EQ(m8p.blocks_per_context, 41);
  EXPECT_EQ(m8p.num_full_contexts, 6);

  const std::string text = format_cache_plan(p, m);
  EXPECT_NE(text.find("69,599,232"), std::string::npos) << text;
  EXPECT_NE(text.find("2,359,296"), std::string::npos) << text;
  EXPECT_NE(text.find("271 blocks"), std::string::npos) << text;
}

}  // namespace
}  // namespace hyserve
