// CUDA indexer ops against the CPU reference: Hadamard and FP8 quantization bitwise,
// scores within fp32 summation-order tolerance (the tensor-core scorer on paged caches
// within its accumulation tolerance), causal top-k exactly (sets and order, ties at the
// threshold, short and fully masked rows, 1M-key rows).
#include "kernels/attention/indexer/cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "gpu/gpu_test_util.h"
#include "kernels/attention/indexer/cpu.h"

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

// The prefill scorer on FP8 tensor cores (one block table for all queries, head_dim 128,
// Hi 16 / 32 / 64) over a paged FP8 cache whose blocks are scattered in the pool
// (block_size 0: the contiguous cache of the other scorer tests).
struct PagedScoreCase {
  int64_t block_size, num_heads, num_tokens, num_keys;
  std::vector<int64_t> q_pos;
};

// Tolerance: the e4m3 products are exact, but the tensor cores add them (and the fp32
// accumulator) in their own order and internal precision, and heads are summed in
// another order: |got - want| <= 2^-10 * k_scale * sum_h |w'_h| * sum_d |q8 k8| (w' = w *
// q_scale), the bound the DSA decode indexer on the same MMA passes with. Masked keys
// must be -inf on both sides.
void expect_fp8_scores_within_bound(const PagedScoreCase& c, const std::vector<float>& q,
                                    const std::vector<float>& w, const std::vector<uint8_t>& k8,
                                    const std::vector<float>& k_scales,
                                    const std::vector<float>& got, const std::vector<float>& want) {
  const int64_t d = kIndexerFp8BlockSize;
  const int64_t rows = c.num_tokens * c.num_heads;
  std::vector<uint8_t> q8(rows * d);
  std::vector<float> q_scales(rows);
  cpu::quantize_fp8_ue8m0(q.data(), rows, d, q8.data(), q_scales.data());
  // |decoded codes| once, so the bound's O(T S H d) loop is plain float multiply-adds (a
  // bound needs no more precision: float rounding moves it by ~2^-24 relative).
  auto abs_decoded = [](const std::vector<uint8_t>& codes) {
    std::vector<float> v(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) v[i] = std::fabs(e4m3_to_f32(codes[i]));
    return v;
  };
  const std::vector<float> q_abs = abs_decoded(q8), k_abs = abs_decoded(k8);
  double worst = 0.0;
  int64_t worst_at = -1;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t s = 0; s < c.num_keys; ++s) {
      const int64_t i = t * c.num_keys + s;
      if (std::isinf(want[i]) || std::isinf(got[i])) {
        ASSERT_EQ(got[i], want[i]) << "query " << t << " (q_pos " << c.q_pos[t] << "), key " << s
                                   << "; block_size " << c.block_size << ", Hi " << c.num_heads
                                   << ", T " << c.num_tokens << ", S " << c.num_keys;
        continue;
      }
      double bound = 0.0;
      const float* k_row = k_abs.data() + s * d;
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const float* q_row = q_abs.data() + (t * c.num_heads + h) * d;
        float dot = 0.0f;
        for (int64_t j = 0; j < d; ++j) dot += q_row[j] * k_row[j];
        bound += std::fabs(double{w[t * c.num_heads + h]} * q_scales[t * c.num_heads + h]) * dot;
      }
      const double excess =
          std::fabs(double{got[i]} - want[i]) / (bound * k_scales[s] * 0x1p-10 + 1e-30);
      if (excess > worst || std::isnan(got[i])) {
        worst = std::isnan(got[i]) ? INFINITY : excess;
        worst_at = i;
      }
    }
  }
  EXPECT_LE(worst, 1.0) << "worst at query " << worst_at / c.num_keys << ", key "
                        << worst_at % c.num_keys << ": got " << got[worst_at] << ", want "
                        << want[worst_at] << " (error / tolerance " << worst << "); block_size "
                        << c.block_size << ", Hi " << c.num_heads << ", T " << c.num_tokens
                        << ", S " << c.num_keys;
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
    for (const cuda::IndexerScorer scorer :
         {cuda::IndexerScorer::kMmaSync, cuda::IndexerScorer::kWgmma}) {
      SCOPED_TRACE(scorer == cuda::IndexerScorer::kWgmma ? "wgmma scorer" : "mma.sync scorer");
      if (!want.empty()) {  // garbage (not -inf), so that a score left unwritten shows
        CUDA_CHECK(cudaMemset(d_scores.data(), 0x7f, sizeof(float) * want.size()));
      }
      cuda::indexer_scores_fp8_cache(p, nullptr, scorer);
      sync();
      const std::vector<float> got = to_host<float>(d_scores, want.size());
      if (c.head_dim == kIndexerFp8BlockSize &&
          (c.num_heads == 16 || c.num_heads == 32 || c.num_heads == 64)) {
        // Scored on the tensor cores: their accumulation tolerance.
        expect_fp8_scores_within_bound({0, c.num_heads, c.num_tokens, c.num_keys, q_pos}, q, w, k8,
                                       k_scales, got, want);
      } else {
        expect_scores_match(got, want, "fp8 cache", c);
      }
    }
  }
}

void run_paged_score_case(const PagedScoreCase& c, uint32_t seed) {
  const int64_t d = kIndexerFp8BlockSize;
  const int64_t bs = c.block_size;
  // Page of a block: [bs x 128 codes | bs x fp32 scales], then 256 bytes of other data.
  const int64_t stride = bs * (d + 4) + 256;
  const int64_t num_used = (c.num_keys + bs - 1) / bs;
  const int64_t num_blocks = num_used + 3;
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(seed));
  table.resize(std::max<int64_t>(num_used, 1));

  const std::vector<float> q = test::random_floats(c.num_tokens * c.num_heads * d, seed + 1);
  const std::vector<float> w = test::random_floats(c.num_tokens * c.num_heads, seed + 2);
  // Keys of very different magnitudes, so that the per-key scales matter.
  std::vector<float> k = test::random_floats(c.num_keys * d, seed + 3);
  for (int64_t s = 0; s < c.num_keys; ++s) {
    for (int64_t j = 0; j < d; ++j) k[s * d + j] *= std::ldexp(1.0f, static_cast<int>(s % 7) - 3);
  }
  std::vector<uint8_t> k8(c.num_keys * d);
  std::vector<float> k_scales(c.num_keys);
  cpu::quantize_fp8_ue8m0(k.data(), c.num_keys, d, k8.data(), k_scales.data());
  std::vector<uint8_t> pool(num_blocks * stride, 0xff);  // 0xff: an e4m3 NaN outside the keys
  for (int64_t s = 0; s < c.num_keys; ++s) {
    uint8_t* page = pool.data() + table[s / bs] * stride;
    std::memcpy(page + (s % bs) * d, &k8[s * d], d);
    std::memcpy(page + bs * d + (s % bs) * 4, &k_scales[s], 4);
  }

  IndexerFp8CacheScoreParams p{
      .q = q.data(),
      .k_fp8 = pool.data(),
      .k_scales = reinterpret_cast<const float*>(pool.data() + bs * d),
      .k_pages = {.block_table = table.data(), .block_size = bs, .block_stride_bytes = stride},
      .table_stride = 0,
      .head_weights = w.data(),
      .q_pos = c.q_pos.data(),
      .scores = nullptr,
      .num_tokens = c.num_tokens,
      .num_keys = c.num_keys,
      .num_heads = c.num_heads,
      .head_dim = d};
  std::vector<float> want(c.num_tokens * c.num_keys);
  p.scores = want.data();
  cpu::indexer_scores_fp8_cache(p);

  DeviceBuffer d_q = to_device(q), d_w = to_device(w), d_pos = to_device(c.q_pos),
               d_pool = to_device(pool), d_table = to_device(table);
  DeviceBuffer d_scores(sizeof(float) * want.size());
  p.q = d_q.as<float>();
  p.k_fp8 = d_pool.as<uint8_t>();
  p.k_scales = reinterpret_cast<const float*>(d_pool.as<uint8_t>() + bs * d);
  p.k_pages.block_table = d_table.as<int32_t>();
  p.head_weights = d_w.as<float>();
  p.q_pos = d_pos.as<int64_t>();
  p.scores = d_scores.as<float>();
  // Both tensor-core scorers, each on scores that start as garbage (not -inf).
  for (const cuda::IndexerScorer scorer :
       {cuda::IndexerScorer::kMmaSync, cuda::IndexerScorer::kWgmma}) {
    SCOPED_TRACE(scorer == cuda::IndexerScorer::kWgmma ? "wgmma scorer" : "mma.sync scorer");
    CUDA_CHECK(cudaMemset(d_scores.data(), 0x7f, sizeof(float) * want.size()));
    cuda::indexer_scores_fp8_cache(p, nullptr, scorer);
    sync();
    expect_fp8_scores_within_bound(c, q, w, k8, k_scales, to_host<float>(d_scores, want.size()),
                                   want);
  }
}

std::vector<int64_t> causal_positions(int64_t num_tokens, int64_t first_pos) {
  std::vector<int64_t> q_pos(num_tokens);
  std::iota(q_pos.begin(), q_pos.end(), first_pos);
  return q_pos;
}

TEST(GpuIndexer, TensorCoreScoresMatchCpuOnPagedCache) {
  REQUIRE_GPU();
  uint32_t seed = 500;
  // Sizes kept so that the CPU reference and the per-element bound (both O(T S H d) on
  // one core) stay within seconds.
  for (const int64_t bs : {64, 128}) {
    for (const int64_t t : {1, 3, 63, 65, 257}) {
      for (const int64_t s : {1, 100, 1025}) {
        if (bs == 128 && t > 65 && s > 100) continue;
        // The last query sees every key; with t > s the first rows see none (q_pos < 0).
        run_paged_score_case({bs, 32, t, s, causal_positions(t, s - t)}, seed += 10);
      }
    }
  }
}

TEST(GpuIndexer, TensorCoreScoresOffsetChunkMaskedRowsAndOtherHeads) {
  REQUIRE_GPU();
  uint32_t seed = 900;
  // A chunk starting at position 5000 of a 6000-key context: keys past 5000 + t masked.
  run_paged_score_case({64, 32, 65, 6000, causal_positions(65, 5000)}, seed += 10);
  run_paged_score_case({128, 32, 9, 6000, causal_positions(9, 5000)}, seed += 10);
  // Positions in no order: all-masked rows among visible ones, q_pos past the keys.
  std::vector<int64_t> mixed(33);
  std::mt19937 rng(17);
  std::uniform_int_distribution<int64_t> pick(-5, 3100);
  for (int64_t& x : mixed) x = pick(rng);
  mixed[0] = -1;
  mixed[7] = 5000;
  run_paged_score_case({64, 32, 33, 3000, mixed}, seed += 10);
  run_paged_score_case({128, 32, 3, 300, {-1, -7, -2}}, seed += 10);
  for (const int64_t h : {16, 64}) {
    for (const int64_t t : {1, 3, 65}) {
      for (const int64_t s : {1, 100, 1025}) {
        run_paged_score_case({64, h, t, s, causal_positions(t, s - t)}, seed += 10);
      }
    }
    run_paged_score_case({128, h, 17, 6000, causal_positions(17, 5000)}, seed += 10);
  }
}

TEST(GpuIndexer, ScoresRefuseHeadDimOver128OnFp8) {
  REQUIRE_GPU();
  IndexerScoreParams p;
  p.num_tokens = 1;
  p.num_keys = 1;
  p.num_heads = 1;
  p.head_dim = 256;
  p.fp8 = true;
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
  for (const int64_t S : {0, 1, 3, 63, 65, 321, 511, 512, 513}) {
    for (const int64_t topk : {1, 3, 64, 300, 2048}) {
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

// Rows whose threshold falls in a run of equal scores: `tied` keys equal to 1.0 (plus
// near neighbours sharing its top 12 bits) below a few clear winners; with few ties the
// top-k resolves them from the candidates in shared memory, with many (beyond 8192 in
// the threshold bin) from the whole row. Ties must go to the lower positions.
TEST(GpuIndexer, CausalTopkHeavyTiesAtThreshold) {
  REQUIRE_GPU();
  const int64_t S = 40000;
  for (const int64_t tied : {1500, 5000, 20000}) {
    std::mt19937 rng(static_cast<uint32_t>(tied));
    std::uniform_real_distribution<float> high(10.0f, 20.0f), low(-5.0f, 0.5f);
    std::vector<float> scores(3 * S);
    for (float& x : scores) x = low(rng);
    for (int64_t r = 0; r < 3; ++r) {
      float* row = scores.data() + r * S;
      for (int64_t i = 0; i < 1000; ++i) row[(i * 37 + r) % S] = high(rng);
      for (int64_t i = 0; i < tied; ++i) {
        const int64_t at = (i * 7919 + 11 * r) % S;
        row[at] = i % 5 == 0 ? std::nextafter(1.0f, 2.0f) : 1.0f;
      }
    }
    expect_topk_equal(scores, {S - 1, S / 2, 2100}, S, 2048,
                      "ties at the threshold, " + std::to_string(tied) + " tied");
    expect_topk_equal(scores, {S - 1, S / 2, 2100}, S, 5000, "topk above the sorted limit");
  }
}

// 1M-key rows with distinct scores (their threshold bin needs the 24-bit pass before the
// candidates fit), a row past the keys, and a row whose scores rise with the position
// (all winners at the end of the row).
TEST(GpuIndexer, CausalTopkMillionKeysDistinct) {
  REQUIRE_GPU();
  const int64_t S = int64_t{1} << 20;
  std::vector<float> scores = topk_scores(4 * S, 9, false);
  for (int64_t i = 0; i < S; ++i) scores[3 * S + i] = static_cast<float>(i) * 1e-3f;
  expect_topk_equal(scores, {S - 1, S / 2, 3000, S + 5}, S, 2048, "1M keys, distinct");
}

}  // namespace
}  // namespace hyserve
