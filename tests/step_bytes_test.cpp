// The decode step's byte bound (model/step_bytes.h): Kimi K3.1 Pro at TP8 by hand (when the
// published config is beside the repository), and the bundled tiny K3's parts by their rules
// (the embedding rows, the expected distinct experts at batch 1 and past saturation, the
// cache and state terms' growth with the batch and the context).
#include "model/step_bytes.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "model/weight_bytes.h"
#include "shared_config.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::shared_config;

TEST(DecodeStepBytes, KimiK31ProAtTp8MatchesHandComputation) {
  const auto path = shared_config("kimi-k3.1-pro-published.json");
  if (path.empty()) GTEST_SKIP() << "kimi-k3.1-pro-published.json not found";
  const ModelConfig c = ModelConfig::load(path);
  // Batch 1, 4,095 cached tokens (4,096 keys with the new one), FP8 latent and index keys.
  const DecodeStepBytes b = estimate_decode_step_bytes(
      c, {.batch = 1, .context = 4095, .tp = 8, .latent = LatentCacheDtype::kFp8});
  // Weights (cache_plan_test: 205,413,633,776 B per GPU, 92 x 1,965,293,568 of them routed
  // experts) less the embedding table's share (163840 / 8 x 7168 bf16 = 293,601,280 B) plus
  // the one row read (7168 x 2).
  EXPECT_EQ(b.weights, 205'413'633'776 - 92 * int64_t{1'965'293'568} - 293'601'280 + 14'336);
  // One token: its 16 experts in each of the 92 MoE layers, each 3 x 3584 x 384 MXFP4
  // values at 17/32 B = 2,193,408 B.
  EXPECT_EQ(b.routed_experts, 92 * 16 * int64_t{2'193'408});
  // 24 full-attention layers: the top-2048 latent rows of 576 B, all 4,096 index keys of 132 B.
  EXPECT_EQ(b.cache, 24 * (2048 * 576 + 4096 * 132));
  // 69 KDA layers' state (58,079,232 B per request at TP8), read and written.
  EXPECT_EQ(b.kda_state, 2 * 58'079'232);
  // A short context attends every key.
  const DecodeStepBytes s = estimate_decode_step_bytes(
      c, {.batch = 1, .context = 99, .tp = 8, .latent = LatentCacheDtype::kFp8});
  EXPECT_EQ(s.cache, 24 * (100 * 576 + 100 * 132));
}

TEST(DecodeStepBytes, TinyK3PartsFollowTheirRules) {
  const ModelConfig c = ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) /
                                          "models/tiny-kimi-k3/config.json");
  const WeightBytes w = estimate_weight_bytes_per_gpu(c, 1);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe(l);
  ASSERT_GT(moe_layers, 0);
  ASSERT_EQ(w.routed_experts % (moe_layers * c.num_experts), 0);
  const int64_t per_expert = w.routed_experts / (moe_layers * c.num_experts);
  const int64_t table = 2 * c.vocab_size * c.hidden_size;
  const DecodeStepBytes one = estimate_decode_step_bytes(c, {.batch = 1, .context = 10});
  const DecodeStepBytes four = estimate_decode_step_bytes(c, {.batch = 4, .context = 10});
  const DecodeStepBytes many = estimate_decode_step_bytes(c, {.batch = 100'000, .context = 10});
  // Embedding rows: the table is read only as lm_head when tied.
  const int64_t rows = c.tie_word_embeddings ? table : 0;
  EXPECT_EQ(one.weights, w.replicated + w.sharded - table + (rows > 0 ? table : 2 * c.hidden_size));
  EXPECT_EQ(four.weights - one.weights, c.tie_word_embeddings ? 0 : 3 * 2 * c.hidden_size);
  // One token touches k experts per layer; a huge batch every expert.
  EXPECT_EQ(one.routed_experts, moe_layers * c.num_experts_per_tok * per_expert);
  EXPECT_GT(four.routed_experts, one.routed_experts);
  EXPECT_LE(four.routed_experts, 4 * one.routed_experts);
  EXPECT_EQ(many.routed_experts, w.routed_experts);
  // Cache and state per sequence.
  EXPECT_EQ(four.cache, 4 * one.cache);
  EXPECT_EQ(four.kda_state, 4 * one.kda_state);
  EXPECT_GT(one.cache, 0);
  EXPECT_GT(one.kda_state, 0);
  EXPECT_EQ(one.total(), one.weights + one.routed_experts + one.cache + one.kda_state);
  EXPECT_THROW(estimate_decode_step_bytes(c, {.batch = 0}), Error);
}

}  // namespace
}  // namespace hyserve
