// Zero-mismatch RL on the CPU (issue 48, item 3): under batch-invariant mode a rollout's
// sampled-token log-probs equal, bit for bit, the log-probs of the same tokens when the
// completed rollout (prompt + sampled tokens) is scored in one prefill (prompt_logprobs), for
// any batch composition, prefill chunk size, prefix-cache hit, asynchronous scheduling and
// speculative setting and cache format. A scripted RL loop of 20 steps on the bundled tiny model
// asserts the rollout/scorer KL (the sum over tokens of rollout - scored log-prob) == 0.0 at every
// step, each token equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsa_model_util.h"
#include "engine/engine.h"
#include "engine_test_helpers.h"
#include "lora_test_util.h"
#include "random_prompt.h"
#include "rl_loop_util.h"
#include "util/format.h"

namespace hyserve::test {
namespace {

namespace fs = std::filesystem;

// The step's model: batch-invariant, with the cache formats of the step (fp32 latents and
// index keys as the reference; serve's defaults, a bf16 latent and FP8 index keys; a mix).
std::unique_ptr<Model> load_invariant(int step) {
  ModelOptions options;
  options.batch_invariant = true;
  options.latent_cache = step % 3 == 1 ? LatentCacheDtype::kBf16 : LatentCacheDtype::kFp32;
  options.indexer_fp8 = step % 3 != 0;
  return Model::load(fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", options);
}

// Every named intermediate (Model::set_dump) of the last token of `tokens`, decoded after a
// prefill of the others, against the same token's row in a prefill of all of them: the names
// whose bits differ, in layer order.
std::vector<std::string> decode_vs_prefill_differences(Model& model,
                                                       const std::vector<int32_t>& tokens) {
  using Dumps = std::vector<std::pair<std::string, std::vector<float>>>;
  const auto capture = [&](Dumps& into, bool last_row_only) {
    model.set_dump([&into, last_row_only](std::string_view name, const float* data, int64_t rows,
                                          int64_t cols) {
      const float* row = data + (last_row_only ? (rows - 1) * cols : 0);
      into.emplace_back(std::string(name), std::vector<float>(row, row + cols));
    });
  };
  const std::span<const int32_t> all(tokens);
  std::vector<float> logits;
  Dumps prefill, decode;
  SequenceState a = model.new_sequence();
  capture(prefill, true);
  model.forward(all, a, logits, /*all_logits=*/true);
  SequenceState b = model.new_sequence();
  model.set_dump(nullptr);
  model.forward(all.first(all.size() - 1), b, logits);
  capture(decode, false);
  model.forward(all.last(1), b, logits);
  model.set_dump(nullptr);
  std::vector<std::string> differ;
  for (const auto& [name, row] : decode) {
    const auto it = std::find_if(prefill.begin(), prefill.end(),
                                 [&](const auto& p) { return p.first == name; });
    if (it == prefill.end()) continue;
    if (it->second.size() != row.size() ||
        std::memcmp(it->second.data(), row.data(), row.size() * sizeof(float)) != 0) {
      differ.push_back(name);
    }
  }
  EXPECT_GT(decode.size(), 10u);
  return differ;
}

// The model alone, every intermediate: a decode step equals its row of a prefill bit for bit
// under batch-invariant mode (a prompt of 100 tokens: more than one KDA chunk). The default
// mode's prefill takes other forms (chunked KDA, expanded MLA), so there they differ.
TEST(RlScoring, DecodeStepEqualsItsPrefillRowAtEveryIntermediate) {
  const std::unique_ptr<Model> invariant = load_invariant(0);
  const std::vector<int32_t> tokens = random_prompt(100, 31, invariant->config().vocab_size);
  const std::vector<std::string> differ = decode_vs_prefill_differences(*invariant, tokens);
  EXPECT_TRUE(differ.empty()) << "first differing intermediate: " << differ.front();
  const std::unique_ptr<Model> fast = load_tiny();
  EXPECT_FALSE(decode_vs_prefill_differences(*fast, tokens).empty());
}

TEST(RlScoring, RolloutLogprobsEqualScoredLogprobsBitwiseForTwentySteps) {
  run_rl_loop(load_invariant, 0, 20);
}

// The seed's setting: the policy is a LoRA adapter on every projection and expert, replaced
// by a new one every step; rollouts mix it with the base model (and speculation on odd
// steps); KL == 0.0 at every step.
TEST(RlScoring, AdapterPolicyRolloutsEqualScoringForTwentySteps) {
  run_rl_loop(load_invariant, 0, 20, /*lora=*/true);
}

// The FP8 latent on the DSA kernels' shapes (random weights) under batch-invariant mode: the
// fused DSA decode step (dsa_fp8_fused) for two steps, the first with speculation, and the
// generic DSA path (dsa_fp8) for the speculative one.
TEST(RlScoring, DsaFp8LatentRolloutsEqualScoring) {
  const ModelConfig config = dsa_config("tests/fixtures/deepseek_v32_tiny");
  const auto load = [&](AttentionBackend attention) {
    return [&config, attention](int) {
      ModelOptions o;
      o.batch_invariant = true;
      o.indexer_fp8 = true;
      o.latent_cache = LatentCacheDtype::kFp8;
      o.attention_backend = attention;
      return Model::create(config, std::make_unique<RandomWeights>(config, 11), o);
    };
  };
  {
    SCOPED_TRACE("dsa_fp8_fused");
    run_rl_loop(load(AttentionBackend::kDsaFp8Fused), 1, 3);
  }
  SCOPED_TRACE("dsa_fp8");
  run_rl_loop(load(AttentionBackend::kDsaFp8), 1, 2);
}

}  // namespace
}  // namespace hyserve::test
