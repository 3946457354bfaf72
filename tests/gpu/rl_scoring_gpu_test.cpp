// Zero-mismatch RL on the GPU (issue 48, item 3): the CPU's scripted RL loop
// (tests/rl_loop_util.h) with the bundled tiny K3 on the CUDA backend in batch-invariant
// mode: a rollout's sampled-token log-probs equal the same tokens' scored log-probs bit for
// bit and the KL is 0.0 at every step, across batch compositions, prefill chunk sizes,
// prefix-cache hits, asynchronous scheduling and speculation; and with a LoRA policy (an
// adapter on every target the CUDA backend adapts: all but routed experts and kv_b),
// replaced every step, on half the rollouts.
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "model/model.h"
#include "rl_loop_util.h"

namespace hyserve::test {
namespace {

std::unique_ptr<Model> load_invariant_gpu(int step) {
  ModelOptions options;
  options.batch_invariant = true;
  options.latent_cache = step % 3 == 1 ? LatentCacheDtype::kBf16 : LatentCacheDtype::kFp32;
  options.indexer_fp8 = step % 3 != 0;
  return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", options,
                     make_cuda_backend(0));
}

TEST(GpuRlScoring, RolloutLogprobsEqualScoredLogprobsBitwise) {
  REQUIRE_GPU();
  run_rl_loop(load_invariant_gpu, 0, 6);
}

TEST(GpuRlScoring, AdapterPolicyRolloutsEqualScoring) {
  REQUIRE_GPU();
  run_rl_loop(load_invariant_gpu, 0, 6, /*lora=*/true);
}

}  // namespace
}  // namespace hyserve::test
