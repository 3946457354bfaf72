// The gated MLP against a double-precision loop, with an error budget propagated
// from the fp32 dot products through silu(gate) * up into down.
#include "kernels/mlp/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

// A dense matrix and the fp32 values it decodes to. Move only: w points into the vectors.
struct TestMatrix {
  std::vector<float> values;
  std::vector<uint16_t> bf16;
  Weight w;
  TestMatrix() = default;
  TestMatrix(TestMatrix&&) = default;
  TestMatrix(const TestMatrix&) = delete;
};

TestMatrix random_matrix(int64_t rows, int64_t cols, bool as_bf16, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  TestMatrix m;
  m.values.resize(rows * cols);
  for (auto& v : m.values) v = as_bf16 ? round_bf16(dist(rng)) : dist(rng);
  m.w = {.dtype = DType::kF32, .rows = rows, .cols = cols, .data = m.values.data()};
  if (as_bf16) {
    for (float v : m.values) m.bf16.push_back(f32_to_bf16(v));
    m.w.dtype = DType::kBF16;
    m.w.data = m.bf16.data();
  }
  return m;
}

double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

TEST(Mlp, MatchesDoubleLoop) {
  std::mt19937 rng(30);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (bool as_bf16 : {false, true}) {
    for (int64_t hidden : {1, 3, 65}) {
      for (int64_t inter : {3, 63}) {
        for (int64_t num_tokens : {1, 3, 63, 65}) {
          TestMatrix gate = random_matrix(inter, hidden, as_bf16, rng);
          TestMatrix up = random_matrix(inter, hidden, as_bf16, rng);
          TestMatrix down = random_matrix(hidden, inter, as_bf16, rng);
          const MlpWeights w{.gate = gate.w, .up = up.w, .down = down.w};
          std::vector<float> x(num_tokens * hidden);
          for (auto& v : x) v = dist(rng);
          std::vector<float> y(num_tokens * hidden, NAN);
          mlp({.x = x.data(), .w = &w, .y = y.data(), .num_tokens = num_tokens, .act = {}});

          double worst = 0.0;
          int64_t worst_i = -1;
          std::vector<double> h(inter), h_err(inter);
          for (int64_t t = 0; t < num_tokens; ++t) {
            const float* xt = x.data() + t * hidden;
            for (int64_t i = 0; i < inter; ++i) {
              double g = 0, u = 0, g_mag = 0, u_mag = 0;
              for (int64_t d = 0; d < hidden; ++d) {
                g += static_cast<double>(xt[d]) * gate.values[i * hidden + d];
                u += static_cast<double>(xt[d]) * up.values[i * hidden + d];
                g_mag += std::fabs(static_cast<double>(xt[d]) * gate.values[i * hidden + d]);
                u_mag += std::fabs(static_cast<double>(xt[d]) * up.values[i * hidden + d]);
              }
              h[i] = silu(g) * u;
              // |silu'| <= 1.1; a few more roundings in silu and the product.
              h_err[i] = 1.1 * (hidden + 2) * kU * g_mag * std::fabs(u) +
                         std::fabs(silu(g)) * (hidden + 2) * kU * u_mag + 8 * kU * std::fabs(h[i]);
            }
            for (int64_t d = 0; d < hidden; ++d) {
              double ref = 0, mag = 0, err = 0;
              for (int64_t i = 0; i < inter; ++i) {
                const double wd = down.values[d * inter + i];
                ref += h[i] * wd;
                mag += std::fabs(h[i] * wd);
                err += h_err[i] * std::fabs(wd);
              }
              const double tol = 2 * (err + (inter + 2) * kU * mag) + 1e-30;
              const double ratio = std::fabs(y[t * hidden + d] - ref) / tol;
              if (!(ratio <= worst)) {
                worst = ratio;
                worst_i = t * hidden + d;
              }
            }
          }
          EXPECT_LE(worst, 1.0) << "bf16 " << as_bf16 << " D " << hidden << " I " << inter << " T "
                                << num_tokens << ": worst element " << worst_i;
        }
      }
    }
  }
}

// Kimi K3's SiTU (K3.md §3.7): beta tanh(g/beta) sigmoid(g) * linear_beta tanh(u/linear_beta),
// and without the cap on u (linear_beta 0). Pre-activations reach far past both caps.
TEST(Mlp, SituMatchesDoubleLoop) {
  std::mt19937 rng(31);
  for (float linear_beta : {25.0f, 0.0f}) {
    const int64_t hidden = 65, inter = 63, num_tokens = 5;
    TestMatrix gate = random_matrix(inter, hidden, true, rng);
    TestMatrix up = random_matrix(inter, hidden, true, rng);
    TestMatrix down = random_matrix(hidden, inter, true, rng);
    const MlpWeights w{.gate = gate.w, .up = up.w, .down = down.w};
    std::normal_distribution<float> dist(0.0f, 40.0f);  // |g|, |u| up to ~150
    std::vector<float> x(num_tokens * hidden);
    for (auto& v : x) v = dist(rng);
    std::vector<float> y(num_tokens * hidden, NAN);
    const GatedActivation act{GatedActivation::Kind::kSitu, 4.0f, linear_beta};
    mlp({.x = x.data(), .w = &w, .y = y.data(), .num_tokens = num_tokens, .act = act});
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::vector<double> a(inter);
      double scale = 0.0;
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < hidden; ++k) {
          g += static_cast<double>(gate.values[i * hidden + k]) * x[t * hidden + k];
          u += static_cast<double>(up.values[i * hidden + k]) * x[t * hidden + k];
        }
        const double cap_u = linear_beta > 0 ? linear_beta * std::tanh(u / linear_beta) : u;
        a[i] = 4.0 * std::tanh(g / 4.0) / (1.0 + std::exp(-g)) * cap_u;
        scale = std::max(scale, std::fabs(a[i]));
      }
      for (int64_t o = 0; o < hidden; ++o) {
        double want = 0.0;
        for (int64_t i = 0; i < inter; ++i)
          want += static_cast<double>(down.values[o * inter + i]) * a[i];
        // fp32 dot products of 65 terms of |x| ~ 40 (~1e-5 relative), then tanh/exp.
        ASSERT_NEAR(y[t * hidden + o], want, 1e-4 * scale) << "token " << t << " out " << o;
      }
    }
  }
  // beta must be positive.
  TestMatrix g2 = random_matrix(3, 3, false, rng), u2 = random_matrix(3, 3, false, rng),
             d2 = random_matrix(3, 3, false, rng);
  const MlpWeights w2{.gate = g2.w, .up = u2.w, .down = d2.w};
  std::vector<float> x2(3, 1.0f), y2(3);
  EXPECT_THROW(mlp({.x = x2.data(),
                    .w = &w2,
                    .y = y2.data(),
                    .num_tokens = 1,
                    .act = {GatedActivation::Kind::kSitu, 0.0f, 25.0f}}),
               InvalidArgument);
}

TEST(Mlp, InPlaceAndBatchInvariant) {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t hidden = 65, inter = 63, num_tokens = 65;
  TestMatrix gate = random_matrix(inter, hidden, true, rng);
  TestMatrix up = random_matrix(inter, hidden, true, rng);
  TestMatrix down = random_matrix(hidden, inter, true, rng);
  const MlpWeights w{.gate = gate.w, .up = up.w, .down = down.w};
  std::vector<float> x(num_tokens * hidden);
  for (auto& v : x) v = dist(rng);
  std::vector<float> y(x.size());
  mlp({.x = x.data(), .w = &w, .y = y.data(), .num_tokens = num_tokens, .act = {}});
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<float> alone(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
    mlp({.x = alone.data(), .w = &w, .y = alone.data(), .num_tokens = 1, .act = {}});
    ASSERT_EQ(std::memcmp(alone.data(), y.data() + t * hidden, hidden * sizeof(float)), 0)
        << "token " << t;
  }
}

TEST(Mlp, RejectsMismatchedShapes) {
  std::mt19937 rng(32);
  TestMatrix gate = random_matrix(4, 3, false, rng);
  TestMatrix up = random_matrix(5, 3, false, rng);
  TestMatrix down = random_matrix(3, 4, false, rng);
  const MlpWeights w{.gate = gate.w, .up = up.w, .down = down.w};
  std::vector<float> x(3), y(3);
  EXPECT_THROW(mlp({.x = x.data(), .w = &w, .y = y.data(), .num_tokens = 1, .act = {}}),
               InvalidArgument);
  const MlpWeights w2{.gate = gate.w, .up = gate.w, .down = up.w};
  EXPECT_THROW(mlp({.x = x.data(), .w = &w2, .y = y.data(), .num_tokens = 1, .act = {}}),
               InvalidArgument);
}

}  // namespace
}  // namespace hyserve::cpu
