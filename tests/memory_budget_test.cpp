// The scratch budget of a step, as `hyserve serve` plans it: a warm-up step of T fresh
// tokens, plus the indexer's score chunk grown to the longest context
// (Model::context_transient_bytes), reserved at once, holds every later step up to that
// context: chunked prefill up to L tokens and decode at L never grow the workspace. Without
// the context term, the same steps do grow it.
#include <filesystem>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/workspace.h"

namespace hyserve {
namespace {

constexpr int64_t kStepTokens = 256;
constexpr int64_t kContext = 4096;

std::unique_ptr<Model> load_tiny() {
  ModelOptions options;
  options.indexer_fp8 = true;
  return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", options);
}

// Prefills kContext - 1 tokens in steps of kStepTokens, then decodes one token at kContext,
// in a workspace reserved to `reserve` bytes first; returns that workspace.
std::unique_ptr<Workspace> run_to_full_context(const Model& model, size_t reserve,
                                               size_t& reserved) {
  SequenceState s = model.new_sequence(kContext);
  s.workspace = std::make_unique<Workspace>(&model.backend());
  s.workspace->reserve(reserve);
  reserved = s.workspace->capacity_bytes();
  std::vector<float> logits;
  for (int64_t done = 0; done < kContext - 1;) {
    const int64_t n = std::min(kStepTokens, kContext - 1 - done);
    const std::vector<int32_t> chunk(static_cast<size_t>(n), 7);
    model.forward(chunk, s, logits);
    done += n;
  }
  const std::vector<int32_t> one = {9};
  model.forward(one, s, logits);
  return std::move(s.workspace);
}

size_t warm_up(const Model& model) {
  SequenceState warm = model.new_sequence();
  const std::vector<int32_t> tokens(static_cast<size_t>(kStepTokens), 5);
  std::vector<float> logits;
  model.forward(tokens, warm, logits);
  return warm.workspace->capacity_bytes();
}

TEST(MemoryBudget, ReservedScratchHoldsEveryStepUpToTheLongestContext) {
  const auto model = load_tiny();
  ASSERT_TRUE(model->config().has_indexer());
  const size_t profiled = warm_up(*model);
  const auto transient = static_cast<size_t>(model->context_transient_bytes(kContext));
  EXPECT_GT(transient, 0u);
  size_t reserved = 0;
  const auto ws = run_to_full_context(*model, profiled + transient, reserved);
  EXPECT_GE(reserved, profiled + transient);
  EXPECT_EQ(ws->capacity_bytes(), reserved);
  EXPECT_EQ(ws->num_blocks(), 1u);
}

TEST(MemoryBudget, WithoutTheContextTermAFullContextStepGrowsTheScratch) {
  const auto model = load_tiny();
  const size_t profiled = warm_up(*model);
  size_t reserved = 0;
  const auto ws = run_to_full_context(*model, profiled, reserved);
  EXPECT_GT(ws->capacity_bytes(), profiled);
}

}  // namespace
}  // namespace hyserve
