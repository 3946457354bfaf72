// Token sampling (kernels/sampling): the fixed-point pieces against double math, the
// filters exactly on hand-made logits, reproducibility, and sampled frequencies
// against the probabilities the definition gives.
#include "kernels/sampling/cpu.h"

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

using sampling::kMaxWeight;

int32_t sample_one(const std::vector<float>& logits, const SamplingOptions& o) {
  int32_t token = -2;
  cpu::sample_tokens({.logits = logits.data(),
                      .options = &o,
                      .tokens = &token,
                      .num_rows = 1,
                      .vocab = static_cast<int64_t>(logits.size())});
  return token;
}

// The set of tokens drawn over `draws` steps.
std::set<int32_t> support(const std::vector<float>& logits, SamplingOptions o, int draws = 2000) {
  std::set<int32_t> seen;
  for (int s = 0; s < draws; ++s) {
    o.step = static_cast<uint64_t>(s);
    seen.insert(sample_one(logits, o));
  }
  return seen;
}

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double v : p) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

TEST(SamplingMath, TokenWeightIsExpInFixedPoint) {
  // x is truncated to a multiple of 2^-24 (relative error of exp(x) < 6e-8, finer than
  // a float logit's own ulp), the rest truncates at ~2^-30: |W / 2^31 - e^x| <=
  // 1e-7 e^x + 2^-30.
  for (double x = 0.0; x > -30.0; x -= 0.0137) {
    const float l = static_cast<float>(x);
    const uint64_t w = sampling::token_weight(l, 0.0f, 1.0);
    const double want = std::exp(static_cast<double>(l));
    ASSERT_NEAR(static_cast<double>(w) / kMaxWeight, want, 1e-7 * want + 0x1p-30) << "x = " << l;
  }
  EXPECT_EQ(sampling::token_weight(3.0f, 3.0f, 2.0), kMaxWeight);
  EXPECT_EQ(sampling::token_weight(-INFINITY, 0.0f, 1.0), 0u);
  EXPECT_EQ(sampling::token_weight(-100.0f, 0.0f, 1.0), 0u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampling::token_weight(inf, inf, 1.0), kMaxWeight);
  EXPECT_EQ(sampling::token_weight(1e30f, inf, 1.0), 0u);
  // Monotone in the logit.
  uint64_t prev = 0;
  for (float l = -25.0f; l <= 0.0f; l += 0.001f) {
    const uint64_t w = sampling::token_weight(l, 0.0f, 1.0 / 0.7);
    ASSERT_GE(w, prev) << l;
    prev = w;
  }
}

TEST(SamplingMath, ScaleDrawIsTheExactProductShift) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t a = rng() >> 11, b = rng() >> (11 + i % 40);
    const unsigned __int128 want = (static_cast<unsigned __int128>(a) * b) >> 53;
    ASSERT_EQ(sampling::scale_draw(a, b), static_cast<uint64_t>(want)) << a << " * " << b;
  }
}

TEST(SamplingMath, RankKeyOrdersByLogitThenId) {
  const float values[] = {-INFINITY, -3.5f, -1e-30f, 0.0f, 1e-30f, 2.0f, INFINITY};
  for (size_t i = 0; i + 1 < std::size(values); ++i) {
    EXPECT_LT(sampling::rank_key(values[i], 0), sampling::rank_key(values[i + 1], 0)) << i;
  }
  EXPECT_GT(sampling::rank_key(1.0f, 3), sampling::rank_key(1.0f, 4));
  // -0 and +0 tie (core/order_key.h), so the lower id ranks first whichever sign it has.
  EXPECT_GT(sampling::rank_key(-0.0f, 2), sampling::rank_key(0.0f, 3));
  EXPECT_GT(sampling::rank_key(0.0f, 2), sampling::rank_key(-0.0f, 3));
}

TEST(Sampling, GreedyTakesTheLowerIdOnTiesAndSkipsNaN) {
  const SamplingOptions greedy;
  EXPECT_EQ(sample_one({1.0f, 5.0f, 2.0f, 5.0f}, greedy), 1);
  EXPECT_EQ(sample_one({NAN, -1.0f, NAN}, greedy), 1);
  EXPECT_EQ(sample_one({NAN, NAN}, greedy), -1);
  EXPECT_EQ(sample_one({-INFINITY, -INFINITY}, greedy), 0);
  EXPECT_EQ(support({-INFINITY, -INFINITY}, {.temperature = 1.0f}), (std::set<int32_t>{0, 1}));
}

TEST(Sampling, TopKKeepsTheHighestRanks) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f, 2.0f};
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_k = 1}), (std::set<int32_t>{1}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_k = 2}), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_k = 3}), (std::set<int32_t>{1, 3, 4}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_k = 99}),
            (std::set<int32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampling, TopPKeepsTheShortestPrefixReachingP) {
  const std::vector<float> logits = log_probs({0.1, 0.5, 0.15, 0.25});  // ranks: 1, 3, 2, 0
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_p = 0.4f}), (std::set<int32_t>{1}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_p = 0.7f}), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_p = 0.8f}), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_p = 0.95f}),
            (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampling, TopPAppliesToTheTopKRenormalized) {
  // Alone, top_p 0.5 needs {0, 1} (0.4 < 0.5); after top_k 2 the kept masses are 4/7
  // and 3/7, so 0 alone reaches 0.5.
  const std::vector<float> logits = log_probs({0.4, 0.3, 0.2, 0.1});
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_p = 0.5f}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .top_k = 2, .top_p = 0.5f}),
            (std::set<int32_t>{0}));
}

TEST(Sampling, MinPKeepsTokensAboveAFractionOfTheTop) {
  const std::vector<float> logits = log_probs({0.5, 0.25, 0.15, 0.1});
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .min_p = 0.35f}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .min_p = 0.25f}), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(support(logits, {.temperature = 1.0f, .min_p = 1.0f}), (std::set<int32_t>{0}));
}

TEST(Sampling, ASeedReproducesItsTokensWhateverTheRow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  const int64_t vocab = 321;
  std::vector<float> row(vocab);
  for (float& v : row) v = d(rng);
  std::vector<float> logits;
  std::vector<SamplingOptions> opts;
  for (int r = 0; r < 8; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    opts.push_back({.temperature = 1.3f, .top_p = 0.9f, .seed = 77, .step = 5});
  }
  std::vector<int32_t> tokens(8);
  cpu::sample_tokens({.logits = logits.data(),
                      .options = opts.data(),
                      .tokens = tokens.data(),
                      .num_rows = 8,
                      .vocab = vocab});
  for (int r = 1; r < 8; ++r) EXPECT_EQ(tokens[r], tokens[0]);
  EXPECT_EQ(sample_one(row, opts[0]), tokens[0]);
  // Other steps do draw other tokens.
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 50; ++step) {
    seen.insert(sample_one(row, {.temperature = 1.3f, .top_p = 0.9f, .seed = 77, .step = step}));
  }
  EXPECT_GT(seen.size(), 5u);
}

// Pearson chi-square of the counts against probabilities p (all > 0).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = n * p[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

TEST(Sampling, FrequenciesFollowTheFilteredSoftmax) {
  // 6 tokens, temperature 0.7; with and without filters. The expected distribution is
  // computed here in double from the definition. Bound: the chi-square 0.99999 quantile
  // for 5 degrees of freedom is 30.9 (35 used); the draws are fixed by the seeds, so
  // this either always passes or always fails.
  const std::vector<float> logits = {0.3f, -0.2f, 1.1f, 0.0f, -1.0f, 0.8f};
  const float temperature = 0.7f;
  std::vector<double> p(6);
  for (int i = 0; i < 6; ++i) p[i] = std::exp((logits[i] - 1.1) / temperature);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= z;
  const int n = 200000;
  {
    std::vector<int> counts(6, 0);
    for (int s = 0; s < n; ++s) {
      ++counts[sample_one(
          logits, {.temperature = temperature, .seed = 1234, .step = static_cast<uint64_t>(s)})];
    }
    EXPECT_LT(chi_square(counts, p, n), 35.0);
  }
  {
    // top_k 4 keeps ids 2, 5, 0, 3 (ranks by logit); min_p 0.25 then drops those below
    // 0.25 p_max (id 3, at 0.208 p_max).
    std::vector<double> q(6, 0.0);
    for (int i : {2, 5, 0, 3}) q[i] = p[i] >= 0.25 * p[2] ? p[i] : 0.0;
    const double zq = std::accumulate(q.begin(), q.end(), 0.0);
    std::vector<int> counts(6, 0);
    for (int s = 0; s < n; ++s) {
      ++counts[sample_one(logits, {.temperature = temperature,
                                   .top_k = 4,
                                   .min_p = 0.25f,
                                   .seed = 99,
                                   .step = static_cast<uint64_t>(s)})];
    }
    std::vector<int> kept_counts;
    std::vector<double> kept_p;
    for (int i = 0; i < 6; ++i) {
      if (q[i] > 0.0) {
        kept_counts.push_back(counts[i]);
        kept_p.push_back(q[i] / zq);
      } else {
        EXPECT_EQ(counts[i], 0) << "token " << i << " was filtered out";
      }
    }
    ASSERT_EQ(kept_p.size(), 3u);
    EXPECT_LT(chi_square(kept_counts, kept_p, n), 25.0);  // 2 dof: 0.99999 quantile 23.0
  }
}

TEST(Sampling, RejectsInvalidOptionsAndShapes) {
  const std::vector<float> logits = {0.0f, 1.0f};
  for (const SamplingOptions& o :
       {SamplingOptions{.temperature = -1.0f}, SamplingOptions{.temperature = NAN},
        SamplingOptions{.temperature = INFINITY}, SamplingOptions{.temperature = 1, .top_k = -1},
        SamplingOptions{.temperature = 1, .top_p = 0.0f},
        SamplingOptions{.temperature = 1, .top_p = 1.5f},
        SamplingOptions{.temperature = 1, .min_p = -0.1f}}) {
    EXPECT_THROW(sample_one(logits, o), InvalidArgument);
  }
  int32_t token;
  const SamplingOptions o;
  EXPECT_THROW(
      cpu::sample_tokens(
          {.logits = logits.data(), .options = &o, .tokens = &token, .num_rows = 1, .vocab = 0}),
      InvalidArgument);
  EXPECT_NO_THROW(cpu::sample_tokens({.num_rows = 0, .vocab = 2}));
}

}  // namespace
}  // namespace hyserve
