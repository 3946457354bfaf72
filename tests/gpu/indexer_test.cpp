// CUDA indexer ops against the CPU reference: Hadamard and FP8 quantization bitwise,
// scores within fp32 summation-order tolerance, causal top-k exactly (sets and order,
// ties, short and fully masked rows, a 1M-key row).
#include "kernels/indexer/cuda.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/indexer/cpu.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(GpuIndexer, HadamardBitwiseEqualsCpu) {
  REQUIRE_GPU();
  for (const int64_t dim : {1, 2, 32, 128, 4096}) {
    for (const int64_t rows : {0, 1, 3, 65}) {
      std::vector<float> x = test::random_floats(rows * dim, 7 + dim + rows, -3.0f, 3.0f);
      DeviceBuffer d_x = to_device(x);
      cuda::hadamard_rotate(d_x.as<float>(), rows, dim, nullptr);
      sync();
      cpu::hadamard_rotate(x.data(), rows, dim);
      const std::vector<float> got = to_host<float>(d_x, x.size());
      EXPECT_EQ(0, std::memcmp(got.data(), x.data(), x.size() * sizeof(float)))
          << "dim " << dim << ", rows " << rows;
    }
  }
}

// Rows of very different magnitudes (scales from 2^-30 to 2^20), an all-zero row (the
// 1e-4 floor), rows whose amax is exactly 448 * 2^k (the frexp edge of pow2_ceil), and
// values on e4m3 rounding midpoints (ties to even).
std::vector<float> quantization_inputs(int64_t rows, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * dim;
    const float mag = std::ldexp(1.0f, static_cast<int>(r % 51) - 30);
    for (int64_t i = 0; i < dim; ++i) row[i] = uni(rng) * mag;
    if (r % 7 == 3) {
      for (int64_t i = 0; i < dim; ++i) row[i] = 0.0f;
    } else if (r % 7 == 4) {
      row[0] = 448.0f * mag;
    } else if (r % 7 == 5) {
      // amax = 448 * mag, and midpoints between e4m3 neighbours at scale mag.
      row[0] = -448.0f * mag;
      for (int64_t i = 1; i < dim; ++i) {
        const float step = std::ldexp(1.0f, static_cast<int>(i % 9) - 3);
        row[i] = (static_cast<float>(8 + i % 8) + 0.5f) * step * mag * ((i % 2) ? -1.0f : 1.0f);
      }
    }
  }
  return x;
}

TEST(GpuIndexer, QuantizeFp8BitwiseEqualsCpu) {
  REQUIRE_GPU();
  for (const int64_t dim : {1, 3, 32, 128, 200, 257}) {
    for (const int64_t rows : {0, 1, 3, 65, 321}) {
      const std::vector<float> x = quantization_inputs(rows, dim, 11 + dim * 7 + rows);
      const int64_t blocks = (dim + 127) / 128;
      std::vector<uint8_t> q(rows * dim);
      std::vector<float> scales(rows * blocks);
      cpu::quantize_fp8_ue8m0(x.data(), rows, dim, q.data(), scales.data());
      DeviceBuffer d_x = to_device(x);
      DeviceBuffer d_q(q.size()), d_s(scales.size() * sizeof(float));
      cuda::quantize_fp8_ue8m0(d_x.as<float>(), rows, dim, d_q.as<uint8_t>(), d_s.as<float>(),
                               nullptr);
      sync();
      const std::vector<uint8_t> got_q = to_host<uint8_t>(d_q, q.size());
      const std::vector<float> got_s = to_host<float>(d_s, scales.size());
      EXPECT_EQ(0, std::memcmp(got_q.data(), q.data(), q.size()))
          << "dim " << dim << ", rows " << rows;
      EXPECT_EQ(0, std::memcmp(got_s.data(), scales.data(), scales.size() * sizeof(float)))
          << "dim " << dim << ", rows " << rows;
    }
  }
}

struct ScoreCase {
  int64_t num_tokens, num_keys, num_heads, head_dim, first_pos;
};

// Scores are sums over Hi heads of w * relu(q.k) with |q.k| <= ~d/3 for these inputs;
// the GPU sums in a different order with FMA, so the error is a few fp32 ulps of the
// largest partial sum: 2e-5 relative to the score plus 1e-4 absolute (scores are O(10)).
// Masked keys must be -inf on both sides.
void expect_scores_match(const std::vector<float>& got, const std::vector<float>& want,
                         const char* what, const ScoreCase& c) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    }
  }
  EXPECT_TRUE(test::all_close(got, want, 1e-4f, 2e-5f))
      << what << ": T " << c.num_tokens << ", S " << c.num_keys << ", Hi " << c.num_heads << ", d "
      << c.head_dim << ", first_pos " << c.first_pos;
}

TEST(GpuIndexer, ScoresMatchCpuFp32Fp8AndFp8Cache) {
  REQUIRE_GPU();
  std::vector<ScoreCase> cases;
  for (const int64_t t : {0, 1, 3, 65}) {
    for (const int64_t s : {1, 3, 63, 321}) {
      for (const int64_t h : {1, 3}) {
        for (const int64_t d : {32, 128}) cases.push_back({t, s, h, d, s - t});
      }
    }
  }
  cases.push_back({3, 65, 3, 32, -2});      // first rows see no key
  cases.push_back({5, 0, 2, 32, 0});        // no keys at all
  cases.push_back({2, 300, 64, 128, 200});  // V3.2's 64 heads
  uint32_t seed = 1;
  for (const ScoreCase& c : cases) {
    const std::vector<float> q =
        test::random_floats(c.num_tokens * c.num_heads * c.head_dim, ++seed);
    const std::vector<float> k = test::random_floats(c.num_keys * c.head_dim, ++seed);
    const std::vector<float> w = test::random_floats(c.num_tokens * c.num_heads, ++seed);
    std::vector<int64_t> q_pos(c.num_tokens);
    for (int64_t t = 0; t < c.num_tokens; ++t) q_pos[t] = c.first_pos + t;
    DeviceBuffer d_q = to_device(q), d_k = to_device(k), d_w = to_device(w),
                 d_pos = to_device(q_pos);
    DeviceBuffer d_scores(sizeof(float) * c.num_tokens * c.num_keys);
    for (const bool fp8 : {false, true}) {
      IndexerScoreParams p{.q = q.data(),
                           .k = k.data(),
                           .k_pages = {},
                           .head_weights = w.data(),
                           .q_pos = q_pos.data(),
                           .scores = nullptr,
                           .num_tokens = c.num_tokens,
                           .num_keys = c.num_keys,
                           .num_heads = c.num_heads,
                           .head_dim = c.head_dim,
                           .fp8 = fp8};
      std::vector<float> want(c.num_tokens * c.num_keys);
      p.scores = want.data();
      cpu::indexer_scores(p);
      p.q = d_q.as<float>();
      p.k = d_k.as<float>();
      p.head_weights = d_w.as<float>();
      p.q_pos = d_pos.as<int64_t>();
      p.scores = d_scores.as<float>();
      cuda::indexer_scores(p, nullptr);
      sync();
      expect_scores_match(to_host<float>(d_scores, want.size()), want, fp8 ? "fp8" : "fp32", c);
    }
    // FP8 cache: keys quantized once (by the CPU here), q quantized by the scorer.
    std::vector<uint8_t> k8(c.num_keys * c.head_dim);
    std::vector<float> k_scales(c.num_keys);
    cpu::quantize_fp8_ue8m0(k.data(), c.num_keys, c.head_dim, k8.data(), k_scales.data());
    IndexerFp8CacheScoreParams p{.q = q.data(),
                                 .k_fp8 = k8.data(),
                                 .k_scales = k_scales.data(),
                                 .k_pages = {},
                                 .head_weights = w.data(),
                                 .q_pos = q_pos.data(),
                                 .scores = nullptr,
                                 .num_tokens = c.num_tokens,
                                 .num_keys = c.num_keys,
                                 .num_heads = c.num_heads,
                                 .head_dim = c.head_dim};
    std::vector<float> want(c.num_tokens * c.num_keys);
    p.scores = want.data();
    cpu::indexer_scores_fp8_cache(p);
    DeviceBuffer d_k8 = to_device(k8), d_ks = to_device(k_scales);
    p.q = d_q.as<float>();
    p.k_fp8 = d_k8.as<uint8_t>();
    p.k_scales = d_ks.as<float>();
    p.head_weights = d_w.as<float>();
    p.q_pos = d_pos.as<int64_t>();
    p.scores = d_scores.as<float>();
    cuda::indexer_scores_fp8_cache(p, nullptr);
    sync();
    expect_scores_match(to_host<float>(d_scores, want.size()), want, "fp8 cache", c);
  }
}

TEST(GpuIndexer, ScoresRefuseHeadDimOver128OnFp8) {
  REQUIRE_GPU();
  IndexerScoreParams p{
      .k_pages = {}, .num_tokens = 1, .num_keys = 1, .num_heads = 1, .head_dim = 256, .fp8 = true};
  EXPECT_THROW(cuda::indexer_scores(p, nullptr), InvalidArgument);
}

// Runs both top-k implementations and expects identical outputs.
void expect_topk_equal(const std::vector<float>& scores, const std::vector<int64_t>& q_pos,
                       int64_t S, int64_t topk, const std::string& what) {
  const int64_t T = static_cast<int64_t>(q_pos.size());
  std::vector<int32_t> want(T * topk, 12345);
  cpu::causal_topk(scores.data(), q_pos.data(), T, S, topk, want.data());
  DeviceBuffer d_scores = to_device(scores), d_pos = to_device(q_pos);
  DeviceBuffer d_out(sizeof(int32_t) * T * topk);
  cuda::causal_topk(d_scores.as<float>(), d_pos.as<int64_t>(), T, S, topk, d_out.as<int32_t>(),
                    nullptr);
  sync();
  const std::vector<int32_t> got = to_host<int32_t>(d_out, want.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < topk; ++i) {
      ASSERT_EQ(got[t * topk + i], want[t * topk + i])
          << what << ": S " << S << ", topk " << topk << ", row " << t << " (q_pos " << q_pos[t]
          << "), slot " << i;
    }
  }
}

// Scores drawn from a handful of levels (so most keys tie), with +0, -0 and -inf among
// them, or from a continuum (no ties).
std::vector<float> topk_scores(int64_t n, uint32_t seed, bool ties) {
  std::mt19937 rng(seed);
  const float levels[] = {0.0f, -0.0f, 1.5f, -2.25f, 3.0f, -INFINITY, 1e-30f, -1e-30f};
  std::uniform_int_distribution<int> pick(0, 7);
  std::uniform_real_distribution<float> uni(-10.0f, 10.0f);
  std::vector<float> v(n);
  for (float& x : v) x = ties ? levels[pick(rng)] : uni(rng);
  return v;
}

TEST(GpuIndexer, CausalTopkEqualsCpuWithTiesShortAndMaskedRows) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (const int64_t S : {0, 1, 3, 63, 65, 321}) {
    for (const int64_t topk : {1, 3, 64, 2048}) {
      for (const bool ties : {true, false}) {
        // Queries at every position, one beyond the keys, and two before any key.
        std::vector<int64_t> q_pos;
        for (int64_t t = -2; t <= S + 1; ++t) q_pos.push_back(t);
        const std::vector<float> scores =
            topk_scores(static_cast<int64_t>(q_pos.size()) * S, ++seed, ties);
        expect_topk_equal(scores, q_pos, S, topk, ties ? "ties" : "no ties");
      }
    }
  }
}

TEST(GpuIndexer, CausalTopkAllEqualScoresKeepsLowestPositions) {
  REQUIRE_GPU();
  const int64_t S = 5000;
  const std::vector<float> scores(2 * S, 0.5f);
  expect_topk_equal(scores, {S - 1, 2500}, S, 2048, "all equal");
}

TEST(GpuIndexer, CausalTopkEmptyBatch) {
  REQUIRE_GPU();
  EXPECT_NO_THROW(cuda::causal_topk(nullptr, nullptr, 0, 10, 4, nullptr, nullptr));
}

// A 1M-key row (the K3.1 Pro context), half its scores tied at one of a few levels.
TEST(GpuIndexer, CausalTopkMillionKeys) {
  REQUIRE_GPU();
  const int64_t S = int64_t{1} << 20;
  std::vector<float> scores = topk_scores(2 * S, 7, false);
  const std::vector<float> tied = topk_scores(2 * S, 8, true);
  for (int64_t i = 0; i < 2 * S; i += 2) scores[i] = tied[i] + 5.0f;
  expect_topk_equal(scores, {S - 1, S / 3}, S, 2048, "1M keys");
}

}  // namespace
}  // namespace hyserve
