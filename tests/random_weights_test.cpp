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

}  // namespace
}  // namespace hyserve
