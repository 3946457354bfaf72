// Whole-model golden tests: the CPU engine's logits against logits computed in
// fp32 by Hugging Face transformers (kimi_linear, deepseek_v32, deepseek_v3 with
// Kimi K2 / K2.5) and by the Python kimi_k3 reference (tools/k3_reference.py), on
// tiny random checkpoints.
//
// For each prompt of a fixture (tools/make_fixtures.py writes golden.safetensors):
//   - prefill: logits at every prompt position;
//   - decode: 32 steps, one token at a time with the per-request state, fed the
//     reference's greedy tokens; logits at every step, and our greedy choice equals
//     the reference's wherever its top-2 gap exceeds the tolerance;
//   - prefill then decode equals one long prefill of the same tokens.
// Tolerance: |ours - ref| <= kAbsTol + kRelTol * max|ref| per element. Both sides
// compute in fp32 from the same stored weights; the difference is summation order
// (and libm), ~1e-6 relative per op over a handful of layers.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "golden_util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "util/logits.h"

namespace hyserve {
namespace {

constexpr float kAbsTol = 2e-4f;
constexpr float kRelTol = 1e-4f;
constexpr int kNumPrompts = 3;

namespace fs = std::filesystem;

using test::GoldenFixture;

class GoldenTest : public testing::TestWithParam<GoldenFixture> {};

TEST_P(GoldenTest, PrefillAndDecodeMatchReference) {
  const GoldenFixture& fx = GetParam();
  const fs::path root(HYSERVE_SOURCE_DIR);
  const fs::path golden_path = root / fx.golden_dir / "golden.safetensors";
  ASSERT_TRUE(fs::exists(golden_path)) << golden_path;
  const SafetensorsFile golden = SafetensorsFile::open(golden_path);
  const auto model = Model::load(root / fx.model_dir);
  const int64_t vocab = model->config().vocab_size;

  for (int p = 0; p < kNumPrompts; ++p) {
    const std::string key = "prompt_" + std::to_string(p) + "_";
    const std::vector<int32_t> prompt = test::golden_ids(golden, key + "ids");
    const std::vector<float> ref_prefill = test::golden_floats(golden, key + "logits");
    const std::vector<int32_t> greedy = test::golden_ids(golden, key + "greedy_ids");
    const std::vector<float> ref_decode = test::golden_floats(golden, key + "greedy_logits");
    const int64_t n = static_cast<int64_t>(prompt.size());
    const int64_t steps = static_cast<int64_t>(greedy.size());

    // Prefill: every position.
    SequenceState state = model->new_sequence();
    std::vector<float> logits;
    model->forward(prompt, state, logits, /*all_positions=*/true);
    test::expect_logits_close(logits, ref_prefill.data(), n, vocab, kAbsTol, kRelTol,
                              key + "prefill");

    // Decode: step j's logits come after prompt + greedy[:j].
    std::vector<float> step(logits.end() - vocab, logits.end());
    std::vector<float> decoded;  // [steps, vocab]
    for (int64_t j = 0; j < steps; ++j) {
      if (j > 0) model->forward(std::span<const int32_t>(&greedy[j - 1], 1), state, step);
      const float* ref = ref_decode.data() + j * vocab;
      test::expect_logits_close(step, ref, 1, vocab, kAbsTol, kRelTol,
                                key + "decode step " + std::to_string(j));
      if (test::top2_gap(ref, vocab) > kAbsTol + kRelTol * 20.0f) {
        EXPECT_EQ(argmax(step), greedy[j]) << key << "greedy step " << j;
      }
      decoded.insert(decoded.end(), step.begin(), step.end());
    }

    // Prefill then decode == one long prefill of prompt + greedy[:-1].
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), greedy.begin(), greedy.end() - 1);
    SequenceState long_state = model->new_sequence();
    std::vector<float> long_logits;
    model->forward(all, long_state, long_logits, /*all_positions=*/true);
    const std::vector<float> tail(long_logits.end() - steps * vocab, long_logits.end());
    test::expect_logits_close(tail, decoded.data(), steps, vocab, kAbsTol, kRelTol,
                              key + "one long prefill vs decode");
  }
}

std::string fixture_name(const testing::TestParamInfo<GoldenFixture>& param_info) {
  return std::string(param_info.param.name);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, testing::ValuesIn(test::kGoldenFixtures),
                         fixture_name);

// DeepSeek-V3's architecture as its checkpoints ship it (issue 25, item 14): deepseek_v3
// with FP8 128x128-block linears, Kimi K2's kimi_k2, and the same weights in Kimi K2.5's
// wrapper (text_config, language_model. names, a vision tower), checked against
// kimi_k2's golden.
const GoldenFixture kDeepseekV3Fixtures[] = {
    {"deepseek_v3_fp8", "tests/fixtures/deepseek_v3_tiny", "tests/fixtures/deepseek_v3_tiny"},
    {"kimi_k2", "tests/fixtures/kimi_k2_tiny", "tests/fixtures/kimi_k2_tiny"},
    {"kimi_k25", "tests/fixtures/kimi_k25_tiny", "tests/fixtures/kimi_k2_tiny"},
};

INSTANTIATE_TEST_SUITE_P(DeepseekV3Fixtures, GoldenTest, testing::ValuesIn(kDeepseekV3Fixtures),
                         fixture_name);

}  // namespace
}  // namespace hyserve
