// DSA lightning indexer: Hadamard rotation, ue8m0 FP8 quantization, the fp32 and FP8
// scores against naive formulas written here, the FP8 key-cache entry, and causal top-k
// against a naive stable sort.
#include "kernels/attention/indexer/cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "util/error.h"

namespace hyserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_normal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Indexer, HadamardIsTheOrthonormalSylvesterMatrix) {
  for (const int64_t n : {1, 2, 4, 64, 128}) {
    // Rotating the rows of I gives the matrix itself (it is symmetric).
    std::vector<float> h(n * n, 0.0f);
    for (int64_t i = 0; i < n; ++i) h[i * n + i] = 1.0f;
    cpu::hadamard_rotate(h.data(), n, n);
    const double norm = 1.0 / std::sqrt(static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // Sylvester: H[i][j] = (-1)^popcount(i & j).
        const double want = (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -norm : norm);
        ASSERT_NEAR(h[i * n + j], want, 1e-7) << "n " << n << " at " << i << "," << j;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t k = 0; k < n; ++k) d += double(h[i * n + k]) * h[j * n + k];
        ASSERT_NEAR(d, i == j ? 1.0 : 0.0, 1e-6) << "H H^T at " << i << "," << j << " n " << n;
      }
    }
  }
}

TEST(Indexer, HadamardPreservesDotProducts) {
  const int64_t d = 128, rows = 65;
  std::vector<float> q = random_normal(rows * d, 1), k = random_normal(rows * d, 2);
  std::vector<float> hq = q, hk = k;
  cpu::hadamard_rotate(hq.data(), rows, d);
  cpu::hadamard_rotate(hk.data(), rows, d);
  for (int64_t r = 0; r < rows; ++r) {
    double before = 0, after = 0;
    for (int64_t i = 0; i < d; ++i) {
      before += double(q[r * d + i]) * k[r * d + i];
      after += double(hq[r * d + i]) * hk[r * d + i];
    }
    EXPECT_NEAR(after, before, 1e-4) << "row " << r;
  }
  EXPECT_THROW(cpu::hadamard_rotate(q.data(), 1, 96), InvalidArgument);
}

// Scale = 2^ceil(log2(max(amax, 1e-4) / 448)) per 128-block, computed here in double;
// every element then satisfies |x - s * e4m3(x / s)| <= max(|x| * 2^-4, s * 2^-10):
// half an e4m3 ulp, 2^-4 relative for normal codes (3 mantissa bits), 2^-10 absolute
// (in units of s) for subnormal codes; |x / s| <= 448 so nothing saturates.
TEST(Indexer, Fp8QuantizationScalesAndErrorBound) {
  for (const int64_t dim : {1, 3, 63, 65, 128, 200}) {
    const std::vector<float> magnitudes = {0.0f, 1e-7f, 1e-3f, 1.0f, 300.0f, 1e5f};
    const int64_t rows = static_cast<int64_t>(magnitudes.size()) + 1;
    std::vector<float> x = random_normal(rows * dim, static_cast<uint32_t>(dim));
    for (int64_t r = 0; r + 1 < rows; ++r) {
      for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= magnitudes[r];
    }
    x[(rows - 1) * dim] = 5000.0f;  // an outlier in the first block of the last row
    const int64_t blocks = (dim + 127) / 128;
    std::vector<uint8_t> q(rows * dim);
    std::vector<float> scales(rows * blocks);
    cpu::quantize_fp8_ue8m0(x.data(), rows, dim, q.data(), scales.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t lo = b * 128, hi = std::min(dim, lo + 128);
        double amax = 0;
        for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, double(std::fabs(x[r * dim + i])));
        const double want = std::exp2(std::ceil(std::log2(std::max(amax, double(1e-4f)) / 448)));
        const float s = scales[r * blocks + b];
        ASSERT_EQ(s, want) << "dim " << dim << " row " << r << " block " << b;
        int exponent;
        ASSERT_EQ(std::frexp(s, &exponent), 0.5f) << "scale " << s << " is not a power of two";
        for (int64_t i = lo; i < hi; ++i) {
          const double v = x[r * dim + i];
          const double deq = double(e4m3_to_f32(q[r * dim + i])) * s;
          ASSERT_LE(std::fabs(v - deq), std::max(std::fabs(v) / 16, s / 1024.0))
              << "dim " << dim << " row " << r << " elem " << i << " x " << v << " deq " << deq;
        }
      }
    }
  }
}

struct ScoreProblem {
  int64_t num_tokens, num_keys, num_heads, head_dim;
  std::vector<float> q, k, w;
  std::vector<int64_t> q_pos;

  ScoreProblem(int64_t t, int64_t s, int64_t h, int64_t d, uint32_t seed)
      : num_tokens(t), num_keys(s), num_heads(h), head_dim(d) {
    q = random_normal(t * h * d, seed);
    k = random_normal(s * d, seed + 1);
    // weights_proj(x) * Hi^-0.5 * d^-0.5, with weights_proj(x) ~ N(0, 1).
    w = random_normal(t * h, seed + 2, 1.0f / std::sqrt(float(h * d)));
    // The last token sits at S - 1; one token sees nothing.
    q_pos.resize(t);
    for (int64_t i = 0; i < t; ++i) q_pos[i] = s - t + i;
    q_pos[0] = -1;
  }

  std::vector<float> run(bool fp8) const {
    std::vector<float> scores(num_tokens * num_keys, std::nanf(""));
    cpu::indexer_scores({.q = q.data(),
                         .k = k.data(),
                         .k_pages = {},
                         .head_weights = w.data(),
                         .q_pos = q_pos.data(),
                         .scores = scores.data(),
                         .num_tokens = num_tokens,
                         .num_keys = num_keys,
                         .num_heads = num_heads,
                         .head_dim = head_dim,
                         .fp8 = fp8});
    return scores;
  }
  const float* qh(int64_t t, int64_t h) const { return &q[(t * num_heads + h) * head_dim]; }
  const float* ks(int64_t s) const { return &k[s * head_dim]; }
};

double pow2_scale(const float* x, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, double(std::fabs(x[i])));
  return std::exp2(std::ceil(std::log2(std::max(amax, double(1e-4f)) / 448)));
}

TEST(Indexer, Fp32ScoresMatchNaive) {
  for (const int64_t s : {1, 3, 63, 65}) {
    const ScoreProblem pr(std::min<int64_t>(s, 5), s, 4, 64, 10 + s);
    const std::vector<float> got = pr.run(false);
    for (int64_t t = 0; t < pr.num_tokens; ++t) {
      for (int64_t j = 0; j < s; ++j) {
        if (j > pr.q_pos[t]) {
          EXPECT_EQ(got[t * s + j], -kInf) << "masked key " << j << " of token " << t;
          continue;
        }
        double want = 0;
        for (int64_t h = 0; h < pr.num_heads; ++h) {
          double qk = 0;
          for (int64_t i = 0; i < pr.head_dim; ++i) qk += double(pr.qh(t, h)[i]) * pr.ks(j)[i];
          want += pr.w[t * pr.num_heads + h] * std::max(qk, 0.0);
        }
        EXPECT_NEAR(got[t * s + j], want, 1e-5) << "S " << s << " token " << t << " key " << j;
      }
    }
  }
}

// The CPU scores are vectorized over keys, but every sum keeps the scalar order: q.k
// left to right over the head dimension from 0.0f in fp32, then the heads in order. So
// they equal that chain bit for bit, across key tiles (64 keys) and ragged tails.
TEST(Indexer, Fp32ScoresKeepTheScalarOrderBitForBit) {
  for (const int64_t s : {1, 63, 64, 65, 130, 257}) {
    const ScoreProblem pr(std::min<int64_t>(s, 6), s, 5, 96, 50 + s);
    const std::vector<float> got = pr.run(false);
    for (int64_t t = 0; t < pr.num_tokens; ++t) {
      for (int64_t j = 0; j <= std::min(pr.q_pos[t], s - 1); ++j) {
        float want = 0.0f;
        for (int64_t h = 0; h < pr.num_heads; ++h) {
          float qk = 0.0f;
          for (int64_t i = 0; i < pr.head_dim; ++i) qk += pr.qh(t, h)[i] * pr.ks(j)[i];
          want += pr.w[t * pr.num_heads + h] * std::max(qk, 0.0f);
        }
        ASSERT_EQ(std::bit_cast<uint32_t>(got[t * s + j]), std::bit_cast<uint32_t>(want))
            << "S " << s << " token " << t << " key " << j;
      }
    }
  }
}

// |I8 - I| <= sum_h |w_h| * sum_i (eq_i |k_i| + |q_i| ek_i + eq_i ek_i), with eq, ek the
// per-element bounds of the quantization test (relu is 1-Lipschitz), plus fp32 rounding.
TEST(Indexer, Fp8ScoresWithinQuantizationBoundOfFp32) {
  ScoreProblem pr(7, 65, 8, 128, 21);
  cpu::hadamard_rotate(pr.q.data(), pr.num_tokens * pr.num_heads, pr.head_dim);
  cpu::hadamard_rotate(pr.k.data(), pr.num_keys, pr.head_dim);
  const std::vector<float> exact = pr.run(false), fp8 = pr.run(true);
  double sum_sq_err = 0, sum_sq = 0;
  for (int64_t t = 0; t < pr.num_tokens; ++t) {
    for (int64_t s = 0; s < pr.num_keys; ++s) {
      const size_t at = t * pr.num_keys + s;
      if (s > pr.q_pos[t]) {
        EXPECT_EQ(fp8[at], -kInf);
        continue;
      }
      const double sk = pow2_scale(pr.ks(s), pr.head_dim);
      double bound = 0;
      for (int64_t h = 0; h < pr.num_heads; ++h) {
        const double sq = pow2_scale(pr.qh(t, h), pr.head_dim);
        double b = 0;
        for (int64_t i = 0; i < pr.head_dim; ++i) {
          const double qa = std::fabs(pr.qh(t, h)[i]), ka = std::fabs(pr.ks(s)[i]);
          const double eq = std::max(qa / 16, sq / 1024), ek = std::max(ka / 16, sk / 1024);
          b += eq * ka + qa * ek + eq * ek;
        }
        bound += std::fabs(pr.w[t * pr.num_heads + h]) * b;
      }
      EXPECT_LE(std::fabs(fp8[at] - exact[at]), bound * 1.001 + 1e-5)
          << "token " << t << " key " << s << " fp8 " << fp8[at] << " fp32 " << exact[at];
      sum_sq_err += double(fp8[at] - exact[at]) * (fp8[at] - exact[at]);
      sum_sq += double(exact[at]) * exact[at];
    }
  }
  // Typical error is far below the worst case: e4m3 keeps 3 mantissa bits, ~4% RMS here.
  EXPECT_LT(std::sqrt(sum_sq_err / sum_sq), 0.06);
}

TEST(Indexer, Fp8CacheEntryEqualsFp8Path) {
  for (const int64_t s : {1, 3, 63, 65}) {
    const ScoreProblem pr(std::min<int64_t>(s, 4), s, 3, 128, 30 + s);
    std::vector<uint8_t> k_fp8(s * pr.head_dim);
    std::vector<float> k_scales(s);
    cpu::quantize_fp8_ue8m0(pr.k.data(), s, pr.head_dim, k_fp8.data(), k_scales.data());
    std::vector<float> cached(pr.num_tokens * s, std::nanf(""));
    cpu::indexer_scores_fp8_cache({.q = pr.q.data(),
                                   .k_fp8 = k_fp8.data(),
                                   .k_scales = k_scales.data(),
                                   .k_pages = {},
                                   .head_weights = pr.w.data(),
                                   .q_pos = pr.q_pos.data(),
                                   .scores = cached.data(),
                                   .num_tokens = pr.num_tokens,
                                   .num_keys = s,
                                   .num_heads = pr.num_heads,
                                   .head_dim = pr.head_dim});
    const std::vector<float> direct = pr.run(true);
    EXPECT_EQ(0, std::memcmp(cached.data(), direct.data(), direct.size() * 4)) << "S " << s;
  }
}

TEST(Indexer, Fp8RefusesHeadDimOver128) {
  const ScoreProblem pr(2, 3, 2, 256, 40);
  EXPECT_THROW(pr.run(true), InvalidArgument);
  EXPECT_NO_THROW(pr.run(false));
}

// Naive selection: visible keys stably sorted by descending score (so ties keep the
// lower position first), the first min(topk, visible) kept, sorted, padded with -1.
std::vector<int32_t> naive_topk(const float* row, int64_t q_pos, int64_t S, int64_t topk) {
  std::vector<int32_t> keys;
  for (int64_t s = 0; s < S && s <= q_pos; ++s) keys.push_back(static_cast<int32_t>(s));
  std::stable_sort(keys.begin(), keys.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  keys.resize(std::min<size_t>(keys.size(), topk));
  std::sort(keys.begin(), keys.end());
  keys.resize(topk, -1);
  return keys;
}

TEST(Indexer, CausalTopkMatchesNaiveSortWithTies) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(0, 5);
  for (const int64_t S : {1, 3, 63, 65}) {
    const int64_t T = 40;
    std::vector<float> scores(T * S);
    // Few distinct values, so most comparisons are ties; level 0 is -inf.
    for (float& v : scores) {
      const int l = level(rng);
      v = l == 0 ? -kInf : static_cast<float>(l);
    }
    std::vector<int64_t> q_pos(T);
    for (auto& p : q_pos) p = std::uniform_int_distribution<int64_t>(-2, S + 3)(rng);
    for (const int64_t topk : {1, 3, 8, 64, 100}) {
      std::vector<int32_t> got(T * topk, 7777);
      cpu::causal_topk(scores.data(), q_pos.data(), T, S, topk, got.data());
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<int32_t> want = naive_topk(&scores[t * S], q_pos[t], S, topk);
        const std::vector<int32_t> row(got.begin() + t * topk, got.begin() + (t + 1) * topk);
        EXPECT_EQ(row, want) << "S " << S << " topk " << topk << " token " << t << " q_pos "
                             << q_pos[t];
      }
    }
  }
}

TEST(Indexer, CausalTopkAllMaskedRows) {
  const std::vector<float> scores = {3.0f, 2.0f, 1.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<int64_t> q_pos = {-1, 0};
  std::vector<int32_t> out(2 * 4, 7777);
  cpu::causal_topk(scores.data(), q_pos.data(), 2, 3, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{-1, -1, -1, -1, 0, -1, -1, -1}));
  // No keys at all.
  cpu::causal_topk(nullptr, q_pos.data(), 2, 0, 4, out.data());
  EXPECT_EQ(out, std::vector<int32_t>(8, -1));
  // The scorer masks the same rows: -inf everywhere for q_pos = -1.
  const ScoreProblem pr(2, 3, 1, 4, 50);
  const std::vector<float> s = pr.run(false);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(s[j], -kInf);
}

TEST(Indexer, CausalTopkRefusesBadInput) {
  const std::vector<float> scores = {1.0f, std::nanf(""), 2.0f};
  const int64_t q_pos = 2;
  std::vector<int32_t> out(3);
  EXPECT_THROW(cpu::causal_topk(scores.data(), &q_pos, 1, 3, 3, out.data()), InvalidArgument);
  EXPECT_THROW(cpu::causal_topk(scores.data(), &q_pos, 1, 3, 0, out.data()), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
