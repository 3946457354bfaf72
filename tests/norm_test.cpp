// rms_norm and layer_norm against double-precision formulas on random rows.
#include "kernels/norm/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve::cpu {
namespace {

std::vector<float> random_vector(int64_t n, std::mt19937& rng, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(RmsNorm, MatchesDoubleFormula) {
  std::mt19937 rng(20);
  const float eps = 1e-6f;
  for (int64_t num_rows : {1, 3, 63, 65}) {
    for (int64_t dim : {1, 3, 63, 65, 1000}) {
      const auto x = random_vector(num_rows * dim, rng, 0.0f, 2.0f);
      const auto w = random_vector(dim, rng, 1.0f, 0.5f);
      std::vector<float> y(num_rows * dim, NAN);
      rms_norm({.x = x.data(),
                .weight = w.data(),
                .y = y.data(),
                .num_rows = num_rows,
                .dim = dim,
                .eps = eps});
      double worst = 0.0;
      int64_t worst_i = -1;
      for (int64_t r = 0; r < num_rows; ++r) {
        double sum_sq = 0.0;
        for (int64_t i = 0; i < dim; ++i)
          sum_sq += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
        const double inv = 1.0 / std::sqrt(sum_sq / dim + static_cast<double>(eps));
        for (int64_t i = 0; i < dim; ++i) {
          const double ref = x[r * dim + i] * inv * w[i];
          const double ratio = std::fabs(y[r * dim + i] - ref) / (1e-6 * std::fabs(ref) + 1e-30);
          if (!(ratio <= worst)) {
            worst = ratio;
            worst_i = r * dim + i;
          }
        }
      }
      EXPECT_LE(worst, 1.0) << "rows " << num_rows << " dim " << dim << ": worst element "
                            << worst_i;
    }
  }
}

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  std::mt19937 rng(21);
  const int64_t num_rows = 65, dim = 63;
  auto x = random_vector(num_rows * dim, rng, 0.0f, 1.0f);
  const auto w = random_vector(dim, rng, 1.0f, 0.5f);
  std::vector<float> y(x.size());
  rms_norm({.x = x.data(), .weight = w.data(), .y = y.data(), .num_rows = num_rows, .dim = dim});
  rms_norm({.x = x.data(), .weight = w.data(), .y = x.data(), .num_rows = num_rows, .dim = dim});
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
}

TEST(RmsNorm, ZeroRowGivesZeroAndEmptyIsANoOp) {
  const float x[3] = {0.0f, 0.0f, 0.0f};
  const float w[3] = {1.0f, 2.0f, 3.0f};
  float y[3] = {NAN, NAN, NAN};
  rms_norm({.x = x, .weight = w, .y = y, .num_rows = 1, .dim = 3, .eps = 1e-6f});
  for (float v : y) EXPECT_EQ(v, 0.0f);
  y[0] = 7.0f;
  rms_norm({.x = x, .weight = w, .y = y, .num_rows = 0, .dim = 3});
  EXPECT_EQ(y[0], 7.0f);
  EXPECT_THROW(rms_norm({.x = x, .weight = w, .y = y, .num_rows = 1, .dim = 0}), InvalidArgument);
  EXPECT_THROW(rms_norm({.x = x, .weight = nullptr, .y = y, .num_rows = 1, .dim = 3}),
               InvalidArgument);
}

TEST(LayerNorm, MatchesDoubleFormula) {
  std::mt19937 rng(22);
  const float eps = 1e-6f;
  for (int64_t num_rows : {1, 3, 63, 65}) {
    for (int64_t dim : {1, 3, 63, 65, 1000}) {
      // An offset mean exercises the (x - mean) cancellation.
      const auto x = random_vector(num_rows * dim, rng, 3.0f, 2.0f);
      const auto w = random_vector(dim, rng, 1.0f, 0.5f);
      const auto b = random_vector(dim, rng, 0.0f, 0.5f);
      std::vector<float> y(num_rows * dim, NAN);
      layer_norm({.x = x.data(),
                  .weight = w.data(),
                  .bias = b.data(),
                  .y = y.data(),
                  .num_rows = num_rows,
                  .dim = dim,
                  .eps = eps});
      double worst = 0.0;
      int64_t worst_i = -1;
      for (int64_t r = 0; r < num_rows; ++r) {
        double mean = 0.0;
        for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
        mean /= dim;
        double var = 0.0;
        for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
        var /= dim;
        const double inv = 1.0 / std::sqrt(var + static_cast<double>(eps));
        for (int64_t i = 0; i < dim; ++i) {
          const double xi = x[r * dim + i];
          const double ref = (xi - mean) * inv * w[i] + b[i];
          // fp32 rounding of x - mean is relative to |x| + |mean|, not to the difference.
          const double tol =
              1e-6 * ((std::fabs(xi) + std::fabs(mean)) * inv * std::fabs(w[i]) + std::fabs(b[i])) +
              1e-30;
          const double ratio = std::fabs(y[r * dim + i] - ref) / tol;
          if (!(ratio <= worst)) {
            worst = ratio;
            worst_i = r * dim + i;
          }
        }
      }
      EXPECT_LE(worst, 1.0) << "rows " << num_rows << " dim " << dim << ": worst element "
                            << worst_i;
    }
  }
}

TEST(LayerNorm, InPlaceEqualsOutOfPlaceAndConstantRowGivesBias) {
  std::mt19937 rng(23);
  const int64_t num_rows = 3, dim = 65;
  auto x = random_vector(num_rows * dim, rng, 0.0f, 1.0f);
  const auto w = random_vector(dim, rng, 1.0f, 0.5f);
  const auto b = random_vector(dim, rng, 0.0f, 0.5f);
  std::vector<float> y(x.size());
  layer_norm({.x = x.data(),
              .weight = w.data(),
              .bias = b.data(),
              .y = y.data(),
              .num_rows = num_rows,
              .dim = dim});
  layer_norm({.x = x.data(),
              .weight = w.data(),
              .bias = b.data(),
              .y = x.data(),
              .num_rows = num_rows,
              .dim = dim});
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);

  const std::vector<float> constant(dim, 2.5f);
  layer_norm({.x = constant.data(),
              .weight = w.data(),
              .bias = b.data(),
              .y = y.data(),
              .num_rows = 1,
              .dim = dim});
  for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(y[i], b[i]) << i;
  EXPECT_THROW(layer_norm({.x = x.data(),
                           .weight = w.data(),
                           .bias = nullptr,
                           .y = y.data(),
                           .num_rows = 1,
                           .dim = dim}),
               InvalidArgument);
}

// Block AttnRes + RMSNorm (K3.md §3.2) against the formula in double: scores of the
// normalized candidates, softmax, mix of the raw candidates, RMSNorm. Candidates at very
// different scales so the softmax is far from uniform; snapshots strided apart.
TEST(AttnResNorm, MatchesDoubleFormula) {
  std::mt19937 rng(21);
  for (int64_t dim : {1, 3, 64, 65}) {
    for (int64_t num_tokens : {1, 3, 17}) {
      for (int64_t num_snapshots : {0, 1, 2, 8}) {
        const int64_t stride = num_tokens * dim + 7;
        std::vector<float> bank(num_snapshots * stride, NAN);
        for (int64_t j = 0; j < num_snapshots; ++j) {
          const auto v = random_vector(num_tokens * dim, rng, 0.0f, 0.1f * (j + 1) * (j + 1));
          std::copy(v.begin(), v.end(), bank.begin() + j * stride);
        }
        const auto current = random_vector(num_tokens * dim, rng, 0.5f, 3.0f);
        const auto query = random_vector(dim, rng, 0.0f, 2.0f);
        const auto norm_w = random_vector(dim, rng, 1.0f, 0.3f);
        std::vector<float> y(num_tokens * dim, NAN);
        AttnResNormParams p;
        p.snapshots = num_snapshots > 0 ? bank.data() : nullptr;
        p.snapshot_stride = stride;
        p.num_snapshots = num_snapshots;
        p.current = current.data();
        p.query = query.data();
        p.res_eps = 1e-5f;
        p.norm_weight = norm_w.data();
        p.norm_eps = 1e-5f;
        p.y = y.data();
        p.num_tokens = num_tokens;
        p.dim = dim;
        attn_res_norm(p);
        for (int64_t t = 0; t < num_tokens; ++t) {
          std::vector<const float*> v;
          for (int64_t j = 0; j < num_snapshots; ++j)
            v.push_back(bank.data() + j * stride + t * dim);
          v.push_back(current.data() + t * dim);
          std::vector<double> s(v.size());
          double max_s = -INFINITY;
          for (size_t i = 0; i < v.size(); ++i) {
            double sq = 0, dot = 0;
            for (int64_t d = 0; d < dim; ++d) {
              sq += static_cast<double>(v[i][d]) * v[i][d];
              dot += static_cast<double>(v[i][d]) * query[d];
            }
            s[i] = dot / std::sqrt(sq / dim + 1e-5);
            max_s = std::max(max_s, s[i]);
          }
          double total = 0;
          for (double& e : s) total += (e = std::exp(e - max_s));
          std::vector<double> m(dim, 0.0);
          for (size_t i = 0; i < v.size(); ++i)
            for (int64_t d = 0; d < dim; ++d) m[d] += s[i] / total * v[i][d];
          double sq = 0;
          for (double e : m) sq += e * e;
          const double inv = 1.0 / std::sqrt(sq / dim + 1e-5);
          for (int64_t d = 0; d < dim; ++d) {
            const double want = m[d] * inv * norm_w[d];
            // fp32 scores (|s| up to ~20: exp amplifies a 1e-6 relative error to ~2e-5).
            ASSERT_NEAR(y[t * dim + d], want, 5e-5 * (1.0 + std::fabs(want)))
                << "dim " << dim << " tokens " << num_tokens << " snapshots " << num_snapshots
                << " token " << t << " d " << d;
          }
        }
      }
    }
  }
}

TEST(AttnResNorm, RejectsBadArguments) {
  std::vector<float> x(8, 1.0f), y(8);
  AttnResNormParams p;
  p.current = x.data();
  p.query = x.data();
  p.norm_weight = x.data();
  p.y = y.data();
  p.num_tokens = 2;
  p.dim = 4;
  p.num_snapshots = 1;
  p.snapshots = x.data();
  p.snapshot_stride = 4;  // < num_tokens * dim
  EXPECT_THROW(attn_res_norm(p), InvalidArgument);
  p.snapshots = nullptr;
  p.snapshot_stride = 8;
  EXPECT_THROW(attn_res_norm(p), InvalidArgument);
}

}  // namespace
}  // namespace hyserve::cpu
