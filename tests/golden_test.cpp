// Whole-model golden tests: the CPU engine's logits against logits computed in
// fp32 by Hugging Face transformers (kimi_linear, deepseek_v32) and by the Python
// kimi_k3 reference (tools/kimi_k3_reference.py), on tiny random checkpoints.
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

#include "engine/sampler.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace hyserve {
namespace {

constexpr float kAbsTol = 2e-4f;
constexpr float kRelTol = 1e-4f;
constexpr int kNumPrompts = 3;

namespace fs = std::filesystem;

struct Fixture {
  const char* name;
  const char* model_dir;   // relative to the source tree
  const char* golden_dir;  // holds golden.safetensors
};

std::vector<float> floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error("golden tensor missing: " + name);
  std::vector<float> out(static_cast<size_t>(t->num_elements()));
  convert_to_f32(t->data, t->dtype, out.data(), t->num_elements());
  return out;
}

std::vector<int32_t> ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error("golden tensor missing: " + name);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t->num_elements(); ++i)
    out.push_back(static_cast<int32_t>(load_as_f32(t->data, t->dtype, i)));
  return out;
}

// Compares [rows, vocab] logits; reports the worst element.
void expect_close(const std::vector<float>& ours, const float* ref, int64_t rows, int64_t vocab,
                  const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), rows * vocab) << what;
  float max_ref = 0.0f;
  for (int64_t i = 0; i < rows * vocab; ++i) max_ref = std::max(max_ref, std::fabs(ref[i]));
  const float tol = kAbsTol + kRelTol * max_ref;
  float worst = -1.0f;
  int64_t at = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    const float err = std::fabs(ours[i] - ref[i]);
    if (!(err <= worst) || std::isnan(err)) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst |diff| " << worst << " at row " << at / vocab
                        << " token " << at % vocab << " (ours " << ours[at] << ", ref " << ref[at]
                        << "), tolerance " << tol;
}

float top2_gap(const float* row, int64_t vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

class GoldenTest : public testing::TestWithParam<Fixture> {};

TEST_P(GoldenTest, PrefillAndDecodeMatchReference) {
  const Fixture& fx = GetParam();
  const fs::path root(HYSERVE_SOURCE_DIR);
  const fs::path golden_path = root / fx.golden_dir / "golden.safetensors";
  ASSERT_TRUE(fs::exists(golden_path)) << golden_path;
  const SafetensorsFile golden = SafetensorsFile::open(golden_path);
  const auto model = Model::load(root / fx.model_dir);
  const int64_t vocab = model->config().vocab_size;

  for (int p = 0; p < kNumPrompts; ++p) {
    const std::string key = "prompt_" + std::to_string(p) + "_";
    const std::vector<int32_t> prompt = ids(golden, key + "ids");
    const std::vector<float> ref_prefill = floats(golden, key + "logits");
    const std::vector<int32_t> greedy = ids(golden, key + "greedy_ids");
    const std::vector<float> ref_decode = floats(golden, key + "greedy_logits");
    const int64_t n = static_cast<int64_t>(prompt.size());
    const int64_t steps = static_cast<int64_t>(greedy.size());

    // Prefill: every position.
    SequenceState state = model->new_sequence();
    std::vector<float> logits;
    model->forward(prompt, state, logits, /*all_positions=*/true);
    expect_close(logits, ref_prefill.data(), n, vocab, key + "prefill");

    // Decode: step j's logits come after prompt + greedy[:j].
    std::vector<float> step(logits.end() - vocab, logits.end());
    std::vector<float> decoded;  // [steps, vocab]
    for (int64_t j = 0; j < steps; ++j) {
      if (j > 0) model->forward(std::span<const int32_t>(&greedy[j - 1], 1), state, step);
      const float* ref = ref_decode.data() + j * vocab;
      expect_close(step, ref, 1, vocab, key + "decode step " + std::to_string(j));
      if (top2_gap(ref, vocab) > kAbsTol + kRelTol * 20.0f) {
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
    expect_close(tail, decoded.data(), steps, vocab, key + "one long prefill vs decode");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GoldenTest,
    testing::Values(Fixture{"kimi_k3", "models/tiny-kimi-k3", "tests/fixtures/kimi_k3_tiny"},
                    Fixture{"kimi_linear", "tests/fixtures/kimi_linear_tiny",
                            "tests/fixtures/kimi_linear_tiny"},
                    Fixture{"deepseek_v32", "tests/fixtures/deepseek_v32_tiny",
                            "tests/fixtures/deepseek_v32_tiny"},
                    Fixture{"deepseek_v32_fp8", "tests/fixtures/deepseek_v32_fp8_tiny",
                            "tests/fixtures/deepseek_v32_fp8_tiny"}),
    [](const testing::TestParamInfo<Fixture>& param_info) {
      return std::string(param_info.param.name);
    });

}  // namespace
}  // namespace hyserve
