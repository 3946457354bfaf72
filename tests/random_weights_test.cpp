// RandomWeights: a synthetic model of any config runs, with finite, spread logits,
// and is deterministic for a seed.
#include "model/random_weights.h"

#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "model/model.h"

namespace hyserve {
namespace {

std::vector<float> run(const ModelConfig& c, uint64_t seed) {
  auto model = Model::create(c, std::make_unique<RandomWeights>(c, seed));
  SequenceState s = model->new_sequence();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((i * 37) % static_cast<int32_t>(c.vocab_size));
  std::vector<float> logits;
  model->forward(prompt, s, logits, true);
  return logits;
}

TEST(RandomWeights, SyntheticModelRunsAndIsDeterministic) {
  const ModelConfig c =
      ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3");
  ASSERT_EQ(c.expert_format, ExpertFormat::kMxfp4);
  const std::vector<float> a = run(c, 1), b = run(c, 1), other = run(c, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  double sum = 0, sq = 0;
  for (float v : a) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += v * v;
  }
  const double var = sq / a.size() - (sum / a.size()) * (sum / a.size());
  EXPECT_GT(var, 1e-4);  // not collapsed to a constant
  EXPECT_LT(var, 1e4);   // nor blown up
}

// A config with INT4 experts (Kimi K2 Thinking's) gets INT4 routed experts of a trained
// model's scale, and bf16 everywhere else.
TEST(RandomWeights, Int4ExpertsWhenTheConfigSaysSo) {
  ModelConfig c =
      ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3");
  c.expert_format = ExpertFormat::kInt4;
  const RandomWeights source(c, 3);
  const int64_t rows = 64, cols = 256;
  const Weight w = source.load_weight("model.layers.1.mlp.experts.0.gate_proj", rows, cols);
  ASSERT_EQ(w.format, WeightFormat::kInt4);
  std::vector<float> row(cols);
  double sq = 0;
  for (int64_t r = 0; r < rows; ++r) {
    w.dequantize_row(r, row.data());
    for (float v : row) sq += v * v;
  }
  EXPECT_NEAR(std::sqrt(sq / (rows * cols)) * std::sqrt(cols), 1.0, 0.2);
  EXPECT_EQ(source.load_weight("model.layers.1.mlp.shared_experts.gate_proj", rows, cols).format,
            WeightFormat::kDense);
  EXPECT_EQ(source.load_weight("model.layers.1.self_attn.o_proj", rows, cols).format,
            WeightFormat::kDense);
  const std::vector<float> a = run(c, 1);
  EXPECT_EQ(a, run(c, 1));
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace hyserve
