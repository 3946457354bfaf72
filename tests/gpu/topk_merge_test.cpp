// The DCP top-k merge steps on the GPU (kernels/attention/topk_merge) against the CPU ops, ranks
// simulated in one process: every rank's share equal (integer keys), the union the
// single-rank top-k, the same rows resent; at the DSA shape (k = 2048, W = 8, 32K keys)
// and small k, with a skew that forces round 2 and ties that span ranks.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"
#include "parallel/topk_merge.h"
#include "topk_merge_util.h"

namespace hyserve {
namespace {

// want_resend: 1 some row takes round 2, 0 none, -1 either.
void expect_gpu_equals_cpu(const test::Rows& rows, int world, int64_t k, int want_resend) {
  SCOPED_TRACE(testing::Message() << "world " << world << ", k " << k);
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  const test::MergeStepsRun want = test::run_merge_steps(*cpu, rows, world, k);
  const test::MergeStepsRun got = test::run_merge_steps(*gpu, rows, world, k);
  EXPECT_EQ(got.per_rank, want.per_rank);
  EXPECT_EQ(got.resent_rows, want.resent_rows);
  EXPECT_EQ(test::run_merge_steps(*gpu, rows, world, k, true).per_rank, want.per_rank);
  if (want_resend >= 0) {
    EXPECT_EQ(want_resend == 1, got.resent_rows > 0);
  }
  for (size_t row = 0; row < rows.size(); ++row) {
    EXPECT_EQ(got.selected[row], test::reference_topk(rows[row], k)) << "row " << row;
  }
}

TEST(GpuTopkMerge, MatchesCpuSteps) {
  REQUIRE_GPU();
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(0, 3);
  for (const int world : {2, 4, 8}) {
    for (const int64_t k : {1, 64, 2048}) {
      const int64_t n = k == 2048 ? 32768 : 3000;
      expect_gpu_equals_cpu(test::random_rows({0, 1, 65, n, n, n}, 7,
                                              [&](std::mt19937& g, int64_t) { return normal(g); }),
                            world, k, k == 2048 ? 0 : -1);
      // Rank 0 outscores everyone: it holds the whole top-k, more than it sent (when it
      // sent fewer than k: c < k).
      const int want = parallel::merge_candidates(k, world) < k ? 1 : 0;
      expect_gpu_equals_cpu(test::random_rows({n, n / 2}, 11,
                                              [&](std::mt19937& g, int64_t p) {
                                                return u(g) + (p % world == 0 ? 10.0f : 0.0f);
                                              }),
                            world, k, want);
      // Four score levels: the threshold tied on every rank.
      expect_gpu_equals_cpu(
          test::random_rows({n, 400}, 13,
                            [&](std::mt19937& g, int64_t) { return 0.5f * level(g); }),
          world, k, -1);
    }
  }
}

}  // namespace
}  // namespace hyserve
