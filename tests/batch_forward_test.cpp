// Batched forward: sequences of different lengths, prefill chunks and decode steps
// mixed in one batch, give bitwise the logits each gets when run alone (the CPU ops
// are batch invariant: every output element has a fixed summation order).
#include <filesystem>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

class BatchForward : public testing::TestWithParam<const char*> {};

TEST_P(BatchForward, MixedBatchEqualsEachSequenceAlone) {
  const auto model = Model::load(fs::path(HYSERVE_SOURCE_DIR) / GetParam());
  Workspace ws(&model->backend());
  const int64_t vocab = model->config().vocab_size;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  // Five requests; each step feeds each a chunk of 1..13 tokens, over four steps.
  constexpr int kSeqs = 5, kSteps = 4;
  std::vector<std::vector<std::vector<int32_t>>> chunks(kSeqs);
  for (auto& seq : chunks) {
    for (int s = 0; s < kSteps; ++s) {
      const int n = s == 0 ? 1 + static_cast<int>(rng() % 13) : 1 + static_cast<int>(rng() % 3);
      std::vector<int32_t> c(n);
      for (auto& v : c) v = tok(rng);
      seq.push_back(c);
    }
  }
  // Alone: each sequence's logits per step (all positions).
  std::vector<std::vector<std::vector<float>>> alone(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    SequenceState st = model->new_sequence();
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> l;
      model->forward(chunks[i][s], st, l, /*all_positions=*/true);
      alone[i].push_back(l);
    }
  }
  // Together: all sequences in one batch per step; sequence i joins at step i % 2.
  std::vector<SequenceState> states;
  for (int i = 0; i < kSeqs; ++i) states.push_back(model->new_sequence());
  std::vector<int> next(kSeqs, 0);
  for (int round = 0; round < kSteps + 1; ++round) {
    std::vector<SequenceInput> batch;
    std::vector<int> who;
    for (int i = 0; i < kSeqs; ++i) {
      if (round < i % 2 || next[i] >= kSteps) continue;
      batch.push_back(model->prepare(states[i], chunks[i][next[i]], true));
      who.push_back(i);
    }
    if (batch.empty()) continue;
    std::vector<float> logits;
    model->forward(batch, logits, ws);
    for (int i : who) states[i].num_tokens += static_cast<int64_t>(chunks[i][next[i]].size());
    size_t row = 0;
    for (int i : who) {
      const std::vector<float>& want = alone[i][next[i]];
      const std::vector<float> got(logits.begin() + row, logits.begin() + row + want.size());
      EXPECT_EQ(got, want) << "sequence " << i << " step " << next[i];
      row += want.size();
      ++next[i];
    }
    EXPECT_EQ(row, logits.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchForward,
                         testing::Values("models/tiny-kimi-k3", "tests/fixtures/kimi_linear_tiny",
                                         "tests/fixtures/deepseek_v32_tiny"));

}  // namespace
}  // namespace hyserve
