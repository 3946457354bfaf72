// KDA ops (MODEL.md §4) against naive double-precision formulas written here, and the
// chunked recurrence against the token-by-token one (outputs and final state),
// including gates whose cumulative decay underflows fp32.
#include "kernels/kda/cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

std::vector<float> random_normal(int64_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

std::vector<float> random_uniform(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// Asserts max |got - want| <= rel_tol * max(max |want|, 1e-30) and names the worst element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  scale = std::max(scale, 1e-30);
  double worst = -1.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isnan(worst) && !(err <= worst)) {  // a NaN is the worst and stays so
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rel_tol * scale)
      << what << ": worst element " << worst_i << " got " << got[worst_i] << " want "
      << want[worst_i] << " (max |want| " << scale << ", relative error " << worst / scale << ")";
}

std::vector<double> to_double(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

double silu_ref(double x) {
  return x / (1.0 + std::exp(-x));
}
double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// ---- short conv -------------------------------------------------------------------

// y_t[c] = silu(sum_i w[c,i] * x_{t-(W-1)+i}[c]) over the state rows followed by x.
std::vector<double> conv_ref(const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& state, int64_t num_tokens, int64_t channels,
                             int64_t width) {
  std::vector<double> y(num_tokens * channels);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0.0;
      for (int64_t i = 0; i < width; ++i) {
        const int64_t src = t - (width - 1) + i;
        const double in = src < 0 ? state[(width - 1 + src) * channels + c] : x[src * channels + c];
        acc += static_cast<double>(w[c * width + i]) * in;
      }
      y[t * channels + c] = silu_ref(acc);
    }
  }
  return y;
}

void run_conv(const float* x, const float* w, float* state, float* y, int64_t num_tokens,
              int64_t channels, int64_t width) {
  ShortConvParams p;
  p.x = x;
  p.weight = w;
  p.conv_state = state;
  p.y = y;
  p.num_tokens = num_tokens;
  p.channels = channels;
  p.kernel_size = width;
  cpu::short_conv_silu(p);
}

TEST(KdaShortConv, MatchesNaiveAndCarriesState) {
  std::mt19937 rng(1);
  for (int64_t width : {1, 2, 4}) {
    for (int64_t num_tokens : {1, 2, 3, 65}) {
      for (bool fresh : {true, false}) {
        const int64_t channels = 67;
        const auto x = random_normal(num_tokens * channels, rng);
        const auto w = random_normal(channels * width, rng, 0.5f);
        std::vector<float> state(std::max<int64_t>(width - 1, 0) * channels, 0.0f);
        if (!fresh) state = random_normal((width - 1) * channels, rng);
        const auto want = conv_ref(x, w, state, num_tokens, channels, width);

        // The inputs that end up in the state: the last W-1 of [state rows | x rows].
        std::vector<float> history = state;
        history.insert(history.end(), x.begin(), x.end());
        const std::vector<float> want_state(history.end() - (width - 1) * channels, history.end());

        std::vector<float> y(num_tokens * channels);
        run_conv(x.data(), w.data(), width > 1 ? state.data() : nullptr, y.data(), num_tokens,
                 channels, width);
        const std::string what = "W=" + std::to_string(width) + " T=" + std::to_string(num_tokens) +
                                 (fresh ? " fresh" : " carried");
        expect_close(y, want, 1e-6, what);
        EXPECT_EQ(state, want_state) << what;
      }
    }
  }
}

TEST(KdaShortConv, PiecesEqualOnePassBitwise) {
  std::mt19937 rng(2);
  const int64_t channels = 37, width = 4, num_tokens = 131;
  const auto x = random_normal(num_tokens * channels, rng);
  const auto w = random_normal(channels * width, rng, 0.5f);
  const auto state0 = random_normal((width - 1) * channels, rng);

  std::vector<float> state_one = state0;
  std::vector<float> y_one(num_tokens * channels);
  run_conv(x.data(), w.data(), state_one.data(), y_one.data(), num_tokens, channels, width);

  for (int trial = 0; trial < 5; ++trial) {
    // Random cut points, zero-length and one-token pieces included.
    std::vector<int64_t> cuts = {0, num_tokens, 1, 2, 2};
    std::uniform_int_distribution<int64_t> pick(0, num_tokens);
    for (int i = 0; i < 6; ++i) cuts.push_back(pick(rng));
    std::sort(cuts.begin(), cuts.end());

    std::vector<float> state = state0;
    std::vector<float> y(num_tokens * channels);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int64_t t0 = cuts[i], n = cuts[i + 1] - cuts[i];
      run_conv(x.data() + t0 * channels, w.data(), state.data(), y.data() + t0 * channels, n,
               channels, width);
    }
    EXPECT_EQ(0, std::memcmp(y.data(), y_one.data(), y.size() * sizeof(float))) << trial;
    EXPECT_EQ(0, std::memcmp(state.data(), state_one.data(), state.size() * sizeof(float)))
        << trial;
  }
}

TEST(KdaShortConv, ZeroTokensLeavesStateUnchanged) {
  std::mt19937 rng(3);
  const auto state0 = random_normal(3 * 8, rng);
  std::vector<float> state = state0;
  run_conv(nullptr, nullptr, state.data(), nullptr, 0, 8, 4);
  EXPECT_EQ(state, state0);
}

TEST(KdaShortConv, RejectsBadArguments) {
  std::vector<float> x(4 * 2), w(2 * 4), state(3 * 2), y(4 * 2);
  EXPECT_THROW(run_conv(x.data(), w.data(), nullptr, y.data(), 4, 2, 4), InvalidArgument);
  EXPECT_THROW(run_conv(x.data(), w.data(), state.data(), x.data(), 4, 2, 4), InvalidArgument);
  EXPECT_THROW(run_conv(x.data(), w.data(), state.data(), y.data(), 4, 2, 0), InvalidArgument);
  EXPECT_THROW(run_conv(x.data(), w.data(), state.data(), y.data(), -1, 2, 4), InvalidArgument);
}

// ---- gate, l2norm, gated rmsnorm -------------------------------------------------------

double softplus_ref(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}

std::vector<float> run_gate(const std::vector<float>& f, const std::vector<float>& dt_bias,
                            const std::vector<float>& a_log, int64_t num_tokens, int64_t num_heads,
                            int64_t head_dim, float lower_bound = 0.0f) {
  std::vector<float> g(f.size());
  KdaGateParams p;
  p.f = f.data();
  p.dt_bias = dt_bias.data();
  p.a_log = a_log.data();
  p.g = g.data();
  p.num_tokens = num_tokens;
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.lower_bound = lower_bound;
  cpu::kda_gate(p);
  return g;
}

TEST(KdaGate, MatchesNaiveFormula) {
  std::mt19937 rng(4);
  const int64_t num_tokens = 65, num_heads = 3, head_dim = 32;
  const auto f = random_uniform(num_tokens * num_heads * head_dim, rng, -30.0f, 30.0f);
  const auto dt_bias = random_normal(num_heads * head_dim, rng);
  const auto a_log = random_uniform(num_heads, rng, -2.0f, 3.0f);
  const auto g = run_gate(f, dt_bias, a_log, num_tokens, num_heads, head_dim);

  std::vector<double> want(g.size());
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < num_heads * head_dim; ++i) {
      const int64_t h = i / head_dim;
      const double x = static_cast<double>(f[t * num_heads * head_dim + i]) + dt_bias[i];
      want[t * num_heads * head_dim + i] =
          -std::exp(static_cast<double>(a_log[h])) * softplus_ref(x);
    }
  }
  // Relative per element: softplus spans many orders of magnitude, and f + dt_bias is
  // rounded to fp32 (ulp 4e-6 near 30) before exp.
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_LE(g[i], 0.0f) << "element " << i;
    ASSERT_NEAR(g[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-30) << "element " << i;
  }
}

// Kimi K3's bounded gate (K3.md §3.3): lb * sigmoid(exp(A_log) * (f + dt_bias)), in
// (lb, 0) for any input, saturating at the ends instead of overflowing.
TEST(KdaGate, BoundedFormMatchesNaiveFormula) {
  std::mt19937 rng(5);
  const int64_t num_tokens = 63, num_heads = 3, head_dim = 32;
  auto f = random_uniform(num_tokens * num_heads * head_dim, rng, -60.0f, 60.0f);
  f[0] = 1e30f;   // saturates to lb (the strongest decay)
  f[1] = -1e30f;  // saturates to 0 (no decay)
  const auto dt_bias = random_normal(num_heads * head_dim, rng);
  const auto a_log = random_uniform(num_heads, rng, -2.0f, 3.0f);
  const auto g = run_gate(f, dt_bias, a_log, num_tokens, num_heads, head_dim, -5.0f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < num_heads * head_dim; ++i) {
      const int64_t e = t * num_heads * head_dim + i;
      const double x = static_cast<double>(f[e]) + dt_bias[i];
      const double want =
          -5.0 / (1.0 + std::exp(-std::exp(static_cast<double>(a_log[i / head_dim])) * x));
      ASSERT_GE(g[e], -5.0f) << e;
      ASSERT_LE(g[e], 0.0f) << e;
      // fp32 exp and division: a few ulps of 5.
      ASSERT_NEAR(g[e], want, 4e-6 * 5.0) << "element " << e;
    }
  }
  EXPECT_EQ(g[0], -5.0f);
  EXPECT_EQ(g[1], 0.0f);
  // A positive bound is refused.
  EXPECT_THROW(run_gate(f, dt_bias, a_log, num_tokens, num_heads, head_dim, 1.0f), InvalidArgument);
}

TEST(KdaGate, SoftplusThresholdAt20) {
  // Above 20 softplus is the identity: finite and exact even where exp(x) overflows fp32.
  const std::vector<float> f = {20.5f, 100.0f, 1e6f, 0.0f, -100.0f, 19.0f};
  const std::vector<float> dt_bias(f.size(), 0.0f);
  const std::vector<float> a_log = {std::log(2.0f)};
  const float rate = -std::exp(a_log[0]);
  const auto g = run_gate(f, dt_bias, a_log, 1, 1, static_cast<int64_t>(f.size()));
  EXPECT_EQ(g[0], rate * 20.5f);
  EXPECT_EQ(g[1], rate * 100.0f);
  EXPECT_EQ(g[2], rate * 1e6f);
  EXPECT_NEAR(g[3], rate * std::log(2.0f), 1e-6);
  EXPECT_LE(g[4], 0.0f);
  EXPECT_GT(g[4], -1e-40f);
  EXPECT_NEAR(g[5], rate * std::log1p(std::exp(19.0)), 1e-5);
  // The bias is added before the threshold: -80 + 100 = 20 is below it, 20.5 above.
  const auto g_bias = run_gate({-80.0f, -79.5f}, {100.0f, 100.0f}, a_log, 1, 1, 2);
  EXPECT_NEAR(g_bias[0], rate * std::log1p(std::exp(20.0)), 1e-5);
  EXPECT_EQ(g_bias[1], rate * 20.5f);
}

TEST(KdaL2Norm, MatchesNaive) {
  std::mt19937 rng(5);
  for (int64_t dim : {1, 8, 32, 128}) {
    for (float scale : {1.0f, 1.0f / std::sqrt(static_cast<float>(dim))}) {
      const int64_t rows = 65;
      auto x = random_normal(rows * dim, rng, 3.0f);
      std::fill(x.begin(), x.begin() + dim, 0.0f);  // an all-zero row stays zero
      std::vector<double> want(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double sum_sq = 0.0;
        for (int64_t d = 0; d < dim; ++d)
          sum_sq += static_cast<double>(x[r * dim + d]) * x[r * dim + d];
        for (int64_t d = 0; d < dim; ++d) {
          want[r * dim + d] = x[r * dim + d] / std::sqrt(sum_sq + 1e-6) * scale;
        }
      }
      cpu::l2norm_rows(x.data(), rows, dim, scale);
      expect_close(x, want, 1e-6, "dim=" + std::to_string(dim));
      for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(x[d], 0.0f);
    }
  }
}

TEST(KdaGatedRmsNorm, MatchesNaiveAndMayRunInPlace) {
  std::mt19937 rng(6);
  for (int64_t head_dim : {1, 32, 128}) {
    const int64_t num_tokens = 3, num_heads = 3;
    const int64_t n = num_tokens * num_heads * head_dim;
    const float eps = 1e-5f;
    const auto o = random_normal(n, rng, 2.0f);
    const auto weight = random_normal(head_dim, rng);
    const auto gate = random_normal(n, rng, 3.0f);
    std::vector<double> want(n);
    for (int64_t r = 0; r < num_tokens * num_heads; ++r) {
      double sum_sq = 0.0;
      for (int64_t e = 0; e < head_dim; ++e)
        sum_sq += static_cast<double>(o[r * head_dim + e]) * o[r * head_dim + e];
      const double inv_rms = 1.0 / std::sqrt(sum_sq / head_dim + eps);
      for (int64_t e = 0; e < head_dim; ++e) {
        const int64_t i = r * head_dim + e;
        want[i] = o[i] * inv_rms * weight[e] * sigmoid_ref(gate[i]);
      }
    }
    GatedRmsNormParams p;
    p.o = o.data();
    p.weight = weight.data();
    p.gate = gate.data();
    p.eps = eps;
    p.num_tokens = num_tokens;
    p.num_heads = num_heads;
    p.head_dim = head_dim;
    std::vector<float> y(n);
    p.y = y.data();
    cpu::gated_rms_norm(p);
    expect_close(y, want, 1e-6, "head_dim=" + std::to_string(head_dim));

    std::vector<float> in_place = o;
    p.o = in_place.data();
    p.y = in_place.data();
    cpu::gated_rms_norm(p);
    EXPECT_EQ(in_place, y);
  }
}

// ---- recurrence -----------------------------------------------------------------------

struct KdaInputs {
  int64_t num_tokens, num_heads, head_dim;
  std::vector<float> q, k, v, g, beta, state;
};

void l2norm_ref(std::vector<float>& x, int64_t dim, double scale) {
  for (size_t r = 0; r < x.size() / dim; ++r) {
    double sum_sq = 0.0;
    for (int64_t d = 0; d < dim; ++d)
      sum_sq += static_cast<double>(x[r * dim + d]) * x[r * dim + d];
    for (int64_t d = 0; d < dim; ++d) {
      x[r * dim + d] = static_cast<float>(x[r * dim + d] / std::sqrt(sum_sq + 1e-6) * scale);
    }
  }
}

// Realistic gates: a mix of near-zero decay, moderate decay and strong decay (-20), so
// the in-chunk cumulative decay G underflows fp32 when exponentiated alone.
KdaInputs random_kda_inputs(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                            uint32_t seed) {
  std::mt19937 rng(seed);
  KdaInputs in{num_tokens, num_heads, head_dim, {}, {}, {}, {}, {}, {}};
  const int64_t n = num_tokens * num_heads * head_dim;
  in.q = random_normal(n, rng);
  in.k = random_normal(n, rng);
  in.v = random_normal(n, rng);
  l2norm_ref(in.q, head_dim, 1.0 / std::sqrt(static_cast<double>(head_dim)));
  l2norm_ref(in.k, head_dim, 1.0);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  in.g.resize(n);
  for (auto& g : in.g) {
    const float kind = unit(rng);
    if (kind < 0.35f) {
      g = -0.02f * unit(rng);
    } else if (kind < 0.9f) {
      g = -5.0f * unit(rng);
    } else {
      g = -20.0f;
    }
  }
  in.beta.resize(num_tokens * num_heads);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (auto& b : in.beta) b = static_cast<float>(sigmoid_ref(normal(rng)));
  in.state = random_normal(num_heads * head_dim * head_dim, rng, 0.5f);
  return in;
}

struct KdaResult {
  std::vector<float> o, state;
};

// Runs tokens [t0, t0 + num_tokens) of `in`, starting from `state`.
KdaResult run_kda(const KdaInputs& in, int64_t t0, int64_t num_tokens, std::vector<float> state,
                  bool chunked, int64_t chunk_size = 64) {
  const int64_t row = in.num_heads * in.head_dim;
  KdaResult r{std::vector<float>(num_tokens * row), std::move(state)};
  KdaParams p;
  p.q = in.q.data() + t0 * row;
  p.k = in.k.data() + t0 * row;
  p.v = in.v.data() + t0 * row;
  p.g = in.g.data() + t0 * row;
  p.beta = in.beta.data() + t0 * in.num_heads;
  p.state = r.state.data();
  p.o = r.o.data();
  p.num_tokens = num_tokens;
  p.num_heads = in.num_heads;
  p.head_dim = in.head_dim;
  if (chunked) {
    cpu::kda_chunked(p, chunk_size);
  } else {
    cpu::kda_recurrent(p);
  }
  return r;
}

struct KdaReference {
  std::vector<double> o, state;
};

// MODEL.md §4.5 in double: S = diag(exp(g)) S; S += beta k (v - S^T k)^T; o = S^T q.
KdaReference kda_ref(const KdaInputs& in) {
  const int64_t H = in.num_heads, K = in.head_dim, V = in.head_dim;
  KdaReference ref{std::vector<double>(in.num_tokens * H * V), to_double(in.state)};
  for (int64_t h = 0; h < H; ++h) {
    double* s = ref.state.data() + h * K * V;
    for (int64_t t = 0; t < in.num_tokens; ++t) {
      const int64_t base = (t * H + h) * K;
      const double beta = in.beta[t * H + h];
      for (int64_t a = 0; a < K; ++a) {
        for (int64_t b = 0; b < V; ++b)
          s[a * V + b] *= std::exp(static_cast<double>(in.g[base + a]));
      }
      std::vector<double> delta(V);
      for (int64_t b = 0; b < V; ++b) {
        double sk = 0.0;
        for (int64_t a = 0; a < K; ++a) sk += s[a * V + b] * in.k[base + a];
        delta[b] = beta * (in.v[base + b] - sk);
      }
      for (int64_t a = 0; a < K; ++a) {
        for (int64_t b = 0; b < V; ++b) s[a * V + b] += in.k[base + a] * delta[b];
      }
      for (int64_t b = 0; b < V; ++b) {
        double o = 0.0;
        for (int64_t a = 0; a < K; ++a) o += s[a * V + b] * in.q[base + a];
        ref.o[base + b] = o;
      }
    }
  }
  return ref;
}

// fp32 against double, and chunked against token-by-token: relative to the largest
// magnitude of the tensor compared.
constexpr double kKdaTol = 1e-5;

std::string shape_name(const KdaInputs& in) {
  return "T=" + std::to_string(in.num_tokens) + " H=" + std::to_string(in.num_heads) +
         " K=" + std::to_string(in.head_dim);
}

TEST(KdaRecurrent, MatchesNaiveDouble) {
  for (int64_t head_dim : {1, 8, 32, 128}) {
    const auto in = random_kda_inputs(head_dim == 128 ? 65 : 130, 3, head_dim, 7);
    const auto ref = kda_ref(in);
    const auto got = run_kda(in, 0, in.num_tokens, in.state, false);
    expect_close(got.o, ref.o, kKdaTol, "o " + shape_name(in));
    expect_close(got.state, ref.state, kKdaTol, "state " + shape_name(in));
  }
}

TEST(KdaChunked, MatchesRecurrentAndNaive) {
  uint32_t seed = 100;
  for (int64_t head_dim : {8, 32, 128}) {
    for (int64_t num_heads : {1, 3}) {
      for (int64_t num_tokens : {1, 3, 63, 64, 65, 130, 321}) {
        if (head_dim == 128 && num_tokens > 65) continue;
        const auto in = random_kda_inputs(num_tokens, num_heads, head_dim, seed++);
        const auto ref = kda_ref(in);
        const auto rec = run_kda(in, 0, num_tokens, in.state, false);
        const auto chk = run_kda(in, 0, num_tokens, in.state, true);
        const std::string name = shape_name(in);
        expect_close(chk.o, to_double(rec.o), kKdaTol, "chunked vs recurrent o " + name);
        expect_close(chk.state, to_double(rec.state), kKdaTol,
                     "chunked vs recurrent state " + name);
        expect_close(chk.o, ref.o, kKdaTol, "chunked vs naive o " + name);
        expect_close(chk.state, ref.state, kKdaTol, "chunked vs naive state " + name);
      }
    }
  }
}

TEST(KdaChunked, AnyChunkSizeGivesTheSameResult) {
  const auto in = random_kda_inputs(130, 3, 32, 8);
  const auto ref = kda_ref(in);
  for (int64_t chunk_size : {1, 2, 7, 16, 64, 129, 130, 1000}) {
    const auto got = run_kda(in, 0, in.num_tokens, in.state, true, chunk_size);
    const std::string name = "chunk_size=" + std::to_string(chunk_size);
    expect_close(got.o, ref.o, kKdaTol, "o " + name);
    expect_close(got.state, ref.state, kKdaTol, "state " + name);
  }
}

// Exactly -20 on every channel for the first half of each chunk, then almost no decay:
// G reaches -640 inside a chunk, so exp(-G) alone would be inf while every
// exp(G_c - G_j) is well defined.
TEST(KdaChunked, StableWhenCumulativeDecayUnderflows) {
  auto in = random_kda_inputs(160, 3, 32, 9);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    const float g = (t % 64) < 32 ? -20.0f : -1e-3f;
    for (int64_t i = 0; i < in.num_heads * in.head_dim; ++i) {
      in.g[t * in.num_heads * in.head_dim + i] = g;
    }
  }
  const auto ref = kda_ref(in);
  const auto got = run_kda(in, 0, in.num_tokens, in.state, true);
  expect_close(got.o, ref.o, kKdaTol, "o");
  expect_close(got.state, ref.state, kKdaTol, "state");
}

TEST(KdaChunked, PrefillThenDecodeEqualsRecurrent) {
  for (int64_t num_tokens : {1, 64, 65, 130}) {
    const int64_t num_decode = 5;
    const auto in = random_kda_inputs(num_tokens + num_decode, 3, 32, 10);
    const auto all = run_kda(in, 0, num_tokens + num_decode, in.state, false);
    const auto prefill = run_kda(in, 0, num_tokens, in.state, true);
    std::vector<float> o = prefill.o;
    std::vector<float> state = prefill.state;
    for (int64_t t = num_tokens; t < num_tokens + num_decode; ++t) {
      const auto step = run_kda(in, t, 1, state, false);
      o.insert(o.end(), step.o.begin(), step.o.end());
      state = step.state;
    }
    const std::string name = "T=" + std::to_string(num_tokens) + "+5";
    expect_close(o, to_double(all.o), kKdaTol, "o " + name);
    expect_close(state, to_double(all.state), kKdaTol, "state " + name);
  }
}

TEST(KdaChunked, ZeroTokensLeavesStateUnchanged) {
  const auto in = random_kda_inputs(0, 3, 8, 11);
  EXPECT_EQ(run_kda(in, 0, 0, in.state, true).state, in.state);
  EXPECT_EQ(run_kda(in, 0, 0, in.state, false).state, in.state);
}

TEST(KdaChunked, RejectsBadArguments) {
  const auto in = random_kda_inputs(4, 1, 8, 12);
  EXPECT_THROW(run_kda(in, 0, 4, in.state, true, 0), InvalidArgument);
  KdaParams p;
  p.num_tokens = 4;
  p.num_heads = 1;
  p.head_dim = 8;
  std::vector<float> state(64);
  p.state = state.data();
  EXPECT_THROW(cpu::kda_recurrent(p), InvalidArgument);
  EXPECT_THROW(cpu::kda_chunked(p), InvalidArgument);
  p.num_tokens = 0;
  p.head_dim = 0;
  EXPECT_THROW(cpu::kda_recurrent(p), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
