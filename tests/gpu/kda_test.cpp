// CUDA KDA ops against the CPU reference: conv (with state), l2norm, gated
// RMSNorm, and both recurrence forms (GPU chunked against CPU chunked and CPU
// recurrent, GPU recurrent against CPU recurrent), on awkward T, H and head_dim. The gate,
// both forms, is in kda_gate_test.cpp.
#include "kernels/kda/cuda.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kda_decode_util.h"
#include "kernels/kda/cpu.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

// Passes when max |got - want| <= rel_tol * max |want|; names the worst element.
testing::AssertionResult close_to_scale(const std::vector<float>& got,
                                        const std::vector<float>& want, double rel_tol) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || err > worst) {
      worst = std::isnan(got[i]) ? INFINITY : err;
      at = i;
    }
  }
  if (worst <= rel_tol * scale) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << "worst element " << at << ": got " << got[at] << ", want " << want[at]
         << " (max |want| " << scale << ", relative " << worst / scale << " > " << rel_tol << ")";
}

std::vector<float> normal(int64_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Elementwise fp32 ops: the GPU uses expf/log1pf/sqrtf and FMA, a few ulps from the
// CPU's std:: functions; 1e-5 relative + 1e-6 absolute (values are O(1)).
constexpr float kElemAbs = 1e-6f;
constexpr float kElemRel = 1e-5f;

TEST(GpuKda, ShortConvMatchesCpuAndCarriesState) {
  REQUIRE_GPU();
  uint32_t seed = 1;
  for (const int64_t channels : {1, 3, 65, 321}) {
    for (const int64_t width : {1, 4}) {
      for (const int64_t num_tokens : {0, 1, 3, 63, 65, 321}) {
        std::mt19937 rng(++seed);
        const std::vector<float> x = normal(num_tokens * channels, rng);
        const std::vector<float> w = normal(channels * width, rng, 0.5f);
        std::vector<float> state = normal((width - 1) * channels, rng);
        std::vector<float> y(num_tokens * channels);
        DeviceBuffer d_x = to_device(x), d_w = to_device(w), d_state = to_device(state),
                     d_y(sizeof(float) * y.size());
        ShortConvParams p{.x = x.data(),
                          .weight = w.data(),
                          .conv_state = width > 1 ? state.data() : nullptr,
                          .y = y.data(),
                          .num_tokens = num_tokens,
                          .channels = channels,
                          .kernel_size = width};
        cpu::short_conv_silu(p);
        p.x = d_x.as<float>();
        p.weight = d_w.as<float>();
        p.conv_state = width > 1 ? d_state.as<float>() : nullptr;
        p.y = d_y.as<float>();
        cuda::short_conv_silu(p, nullptr);
        sync();
        const std::string name = "C " + std::to_string(channels) + ", W " + std::to_string(width) +
                                 ", T " + std::to_string(num_tokens);
        EXPECT_TRUE(test::all_close(to_host<float>(d_y, y.size()), y, kElemAbs, kElemRel)) << name;
        // The state is copied inputs: exact.
        EXPECT_EQ(to_host<float>(d_state, state.size()), state) << name;
      }
    }
  }
}

TEST(GpuKda, L2NormMatchesCpu) {
  REQUIRE_GPU();
  uint32_t seed = 20;
  for (const int64_t rows : {0, 1, 3, 65, 321}) {
    for (const int64_t dim : {1, 32, 128}) {
      std::vector<float> x = test::random_floats(rows * dim, ++seed, -2.0f, 2.0f);
      if (rows > 2) std::fill_n(x.begin() + dim, dim, 0.0f);  // an all-zero row: eps only
      DeviceBuffer d_x = to_device(x);
      const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
      cpu::l2norm_rows(x.data(), rows, dim, scale);
      cuda::l2norm_rows(d_x.as<float>(), rows, dim, scale, nullptr);
      sync();
      EXPECT_TRUE(test::all_close(to_host<float>(d_x, x.size()), x, kElemAbs, kElemRel))
          << "rows " << rows << ", dim " << dim;
    }
  }
}

TEST(GpuKda, GatedRmsNormMatchesCpuAndRunsInPlace) {
  REQUIRE_GPU();
  uint32_t seed = 30;
  for (const int64_t num_tokens : {0, 1, 3, 65}) {
    for (const int64_t num_heads : {1, 3}) {
      for (const int64_t head_dim : {32, 128}) {
        const int64_t n = num_tokens * num_heads * head_dim;
        const std::vector<float> o = test::random_floats(n, ++seed, -3.0f, 3.0f);
        const std::vector<float> w = test::random_floats(head_dim, ++seed, 0.5f, 1.5f);
        const std::vector<float> gate = test::random_floats(n, ++seed, -6.0f, 6.0f);
        std::vector<float> y(n);
        GatedRmsNormParams p{.o = o.data(),
                             .weight = w.data(),
                             .gate = gate.data(),
                             .y = y.data(),
                             .eps = 1e-5f,
                             .num_tokens = num_tokens,
                             .num_heads = num_heads,
                             .head_dim = head_dim};
        cpu::gated_rms_norm(p);
        DeviceBuffer d_o = to_device(o), d_w = to_device(w), d_gate = to_device(gate);
        p.o = d_o.as<float>();
        p.weight = d_w.as<float>();
        p.gate = d_gate.as<float>();
        p.y = d_o.as<float>();  // in place
        cuda::gated_rms_norm(p, nullptr);
        sync();
        EXPECT_TRUE(test::all_close(to_host<float>(d_o, n), y, kElemAbs, kElemRel))
            << "T " << num_tokens << ", H " << num_heads << ", V " << head_dim;
      }
    }
  }
}

// Inputs as the layer produces them: q, k l2-normed (q scaled by K^-0.5), gates mixing
// near-zero, moderate and -20 decays, beta in (0, 1), a nonzero initial state.
struct KdaInputs {
  int64_t num_tokens, num_heads, head_dim;
  std::vector<float> q, k, v, g, beta, state;
};

KdaInputs random_inputs(int64_t num_tokens, int64_t num_heads, int64_t head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  KdaInputs in{num_tokens, num_heads, head_dim, {}, {}, {}, {}, {}, {}};
  const int64_t n = num_tokens * num_heads * head_dim;
  in.q = normal(n, rng);
  in.k = normal(n, rng);
  in.v = normal(n, rng);
  cpu::l2norm_rows(in.q.data(), num_tokens * num_heads, head_dim,
                   1.0f / std::sqrt(static_cast<float>(head_dim)));
  cpu::l2norm_rows(in.k.data(), num_tokens * num_heads, head_dim, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  in.g.resize(n);
  for (float& g : in.g) {
    const float kind = unit(rng);
    g = kind < 0.35f ? -0.02f * unit(rng) : (kind < 0.9f ? -5.0f * unit(rng) : -20.0f);
  }
  in.beta.resize(num_tokens * num_heads);
  for (float& b : in.beta) b = 1.0f / (1.0f + std::exp(-3.0f * (unit(rng) - 0.5f)));
  in.state = normal(num_heads * head_dim * head_dim, rng, 0.5f);
  return in;
}

struct KdaResult {
  std::vector<float> o, state;
};

KdaParams params_of(const KdaInputs& in, const float* q, const float* k, const float* v,
                    const float* g, const float* beta, float* state, float* o) {
  return {.q = q,
          .k = k,
          .v = v,
          .g = g,
          .beta = beta,
          .state = state,
          .o = o,
          .num_tokens = in.num_tokens,
          .num_heads = in.num_heads,
          .head_dim = in.head_dim};
}

KdaResult run_cpu(const KdaInputs& in, bool chunked, int64_t chunk_size = 64) {
  KdaResult r{std::vector<float>(in.v.size()), in.state};
  const KdaParams p = params_of(in, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                in.beta.data(), r.state.data(), r.o.data());
  if (chunked) {
    cpu::kda_chunked(p, chunk_size);
  } else {
    cpu::kda_recurrent(p);
  }
  return r;
}

KdaResult run_gpu(const KdaInputs& in, bool chunked, int64_t chunk_size = 64, int v_slice = 0) {
  DeviceBuffer q = to_device(in.q), k = to_device(in.k), v = to_device(in.v), g = to_device(in.g),
               beta = to_device(in.beta), state = to_device(in.state),
               o(sizeof(float) * in.v.size());
  const KdaParams p = params_of(in, q.as<float>(), k.as<float>(), v.as<float>(), g.as<float>(),
                                beta.as<float>(), state.as<float>(), o.as<float>());
  if (chunked) {
    const size_t bytes = cuda::kda_chunked_workspace_bytes(p, chunk_size);
    DeviceBuffer workspace(bytes);
    cuda::kda_chunked(p, workspace.data(), bytes, nullptr, chunk_size, v_slice);
  } else {
    cuda::kda_recurrent(p, nullptr);
  }
  sync();
  return {to_host<float>(o, in.v.size()), to_host<float>(state, in.state.size())};
}

std::string shape_name(const KdaInputs& in) {
  return "T=" + std::to_string(in.num_tokens) + " H=" + std::to_string(in.num_heads) +
         " K=" + std::to_string(in.head_dim);
}

// Recurrence: fp32 with the same operation order per element as the CPU, but FMA and
// expf; errors grow with T through the state. 1e-5 of the largest magnitude (the CPU
// test's budget against double). GPU chunked against CPU recurrent: 2e-5 (two forms).
constexpr double kSameFormTol = 1e-5;
constexpr double kCrossFormTol = 2e-5;
// The GPU chunked op runs its products on tensor cores as 3xTF32: a = hi + lo with hi
// rounded to tf32 (|a - hi| <= 2^-12 |a|) and lo rounded again (another <= 2^-24 |a|);
// dropping lo*lo and the two lo roundings leave <= 3 * 2^-24 |a b| per product, against
// 2^-24 for an fp32 product, and the tensor cores' fp32 accumulation truncates (<= 2^-23
// per add, against the CPU's 2^-24 rounding). Its sums also run in another order and
// (I+L)^-1 is solved by 16x16 blocks. So about 3x the fp32 budgets above; plain tf32
// (2^-11) or a wrong index is 1e-3 or worse.
constexpr double kTensorSameFormTol = 3 * kSameFormTol;
constexpr double kTensorCrossFormTol = 2 * kCrossFormTol;

// The inter-chunk blocks' V slice (64, 32, 16 columns; the automatic pick takes 16 at these
// few heads) changes no bit of o or the state; each also matches the CPU chunked op.
TEST(GpuKda, ChunkedSliceWidthChangesNoBit) {
  REQUIRE_GPU();
  uint32_t seed = 900;
  for (const int64_t head_dim : {48, 128}) {
    for (const int64_t num_heads : {1, 3}) {
      for (const int64_t num_tokens : {1, 65, 321}) {
        const KdaInputs in = random_inputs(num_tokens, num_heads, head_dim, ++seed);
        const KdaResult want = run_cpu(in, true);
        const KdaResult wide = run_gpu(in, true, 64, 64);
        EXPECT_TRUE(close_to_scale(wide.o, want.o, kTensorSameFormTol)) << "o " << shape_name(in);
        EXPECT_TRUE(close_to_scale(wide.state, want.state, kTensorSameFormTol))
            << "state " << shape_name(in);
        for (const int slice : {32, 16}) {
          const KdaResult got = run_gpu(in, true, 64, slice);
          EXPECT_EQ(got.o, wide.o) << "o, slice " << slice << " " << shape_name(in);
          EXPECT_EQ(got.state, wide.state) << "state, slice " << slice << " " << shape_name(in);
        }
      }
    }
  }
}

TEST(GpuKda, RecurrentMatchesCpu) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (const int64_t head_dim : {32, 48, 128}) {
    for (const int64_t num_heads : {1, 3}) {
      for (const int64_t num_tokens : {0, 1, 3, 63, 65, 321}) {
        const KdaInputs in = random_inputs(num_tokens, num_heads, head_dim, ++seed);
        const KdaResult want = run_cpu(in, false);
        const KdaResult got = run_gpu(in, false);
        EXPECT_TRUE(close_to_scale(got.o, want.o, kSameFormTol)) << "o " << shape_name(in);
        EXPECT_TRUE(close_to_scale(got.state, want.state, kSameFormTol))
            << "state " << shape_name(in);
      }
    }
  }
}

TEST(GpuKda, ChunkedMatchesCpuChunkedAndRecurrent) {
  REQUIRE_GPU();
  uint32_t seed = 200;
  for (const int64_t head_dim : {32, 48, 128}) {
    for (const int64_t num_heads : {1, 3}) {
      for (const int64_t num_tokens : {0, 1, 3, 63, 64, 65, 321}) {
        const KdaInputs in = random_inputs(num_tokens, num_heads, head_dim, ++seed);
        const KdaResult chunked = run_cpu(in, true);
        const KdaResult recurrent = run_cpu(in, false);
        const KdaResult got = run_gpu(in, true);
        const std::string name = shape_name(in);
        EXPECT_TRUE(close_to_scale(got.o, chunked.o, kTensorSameFormTol))
            << "vs chunked o " << name;
        EXPECT_TRUE(close_to_scale(got.state, chunked.state, kTensorSameFormTol))
            << "vs chunked state " << name;
        EXPECT_TRUE(close_to_scale(got.o, recurrent.o, kTensorCrossFormTol))
            << "vs recurrent o " << name;
        EXPECT_TRUE(close_to_scale(got.state, recurrent.state, kTensorCrossFormTol))
            << "vs recurrent state " << name;
      }
    }
  }
}

TEST(GpuKda, ChunkedAnyChunkSizeMatchesRecurrent) {
  REQUIRE_GPU();
  const KdaInputs in = random_inputs(130, 3, 32, 300);
  const KdaResult want = run_cpu(in, false);
  for (const int64_t chunk_size : {1, 7, 16, 64}) {
    const KdaResult got = run_gpu(in, true, chunk_size);
    EXPECT_TRUE(close_to_scale(got.o, want.o, kTensorCrossFormTol)) << "chunk " << chunk_size;
    EXPECT_TRUE(close_to_scale(got.state, want.state, kTensorCrossFormTol))
        << "chunk " << chunk_size;
  }
}

// -20 on every channel for half of each chunk: G reaches -640 inside a chunk (the case
// the double cumsum is for).
TEST(GpuKda, ChunkedStableWhenCumulativeDecayUnderflows) {
  REQUIRE_GPU();
  KdaInputs in = random_inputs(160, 3, 128, 301);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    const float g = (t % 64) < 32 ? -20.0f : -1e-3f;
    std::fill_n(in.g.begin() + t * in.num_heads * in.head_dim, in.num_heads * in.head_dim, g);
  }
  const KdaResult want = run_cpu(in, false);
  const KdaResult got = run_gpu(in, true);
  EXPECT_TRUE(close_to_scale(got.o, want.o, kTensorCrossFormTol));
  EXPECT_TRUE(close_to_scale(got.state, want.state, kTensorCrossFormTol));
}

// Gates as the layer makes them (cpu::kda_gate): A_log in [0, log 16] (the checkpoints'
// init range), dt_bias the inverse softplus of dt in [1e-3, 0.1], f ~ N(0, 1).
void set_model_gates(KdaInputs& in, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t width = in.num_heads * in.head_dim;
  const std::vector<float> f = normal(in.num_tokens * width, rng);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> dt_bias(width), a_log(in.num_heads);
  for (float& b : dt_bias) {
    const float dt = std::exp(std::log(1e-3f) + unit(rng) * (std::log(0.1f) - std::log(1e-3f)));
    b = std::log(std::expm1(dt));
  }
  for (float& a : a_log) a = unit(rng) * std::log(16.0f);
  cpu::kda_gate({.f = f.data(),
                 .dt_bias = dt_bias.data(),
                 .a_log = a_log.data(),
                 .g = in.g.data(),
                 .num_tokens = in.num_tokens,
                 .num_heads = in.num_heads,
                 .head_dim = in.head_dim});
}

// Long prompts at model-like inputs, several slabs of 64 chunks (4097: a last slab of one
// 1-token chunk; chunk 16 at 1100 tokens: 69 chunks), against the CPU chunked op with the
// same chunk size.
TEST(GpuKda, ChunkedLongPromptMatchesCpuChunked) {
  REQUIRE_GPU();
  uint32_t seed = 400;
  struct Case {
    int64_t num_tokens, chunk_size;
  };
  for (const Case c : {Case{1000, 64}, Case{4097, 64}, Case{5000, 64}, Case{1100, 16}}) {
    KdaInputs in = random_inputs(c.num_tokens, 2, 128, ++seed);
    set_model_gates(in, ++seed);
    const KdaResult want = run_cpu(in, true, c.chunk_size);
    const KdaResult got = run_gpu(in, true, c.chunk_size);
    const std::string name = shape_name(in) + " chunk " + std::to_string(c.chunk_size);
    EXPECT_TRUE(close_to_scale(got.o, want.o, kTensorSameFormTol)) << "o " << name;
    EXPECT_TRUE(close_to_scale(got.state, want.state, kTensorSameFormTol)) << "state " << name;
  }
}

// A prompt in two calls, the first ending on a chunk boundary: the second starts from the
// state the first left (itself from a nonzero initial state) and ends in a short chunk
// (209 = 3 x 64 + 17 tokens). Against one CPU call over all tokens.
TEST(GpuKda, ChunkedCarriesStateAcrossCallsAndShortLastChunk) {
  REQUIRE_GPU();
  const KdaInputs in = random_inputs(209, 3, 128, 500);
  const KdaResult want = run_cpu(in, true);
  DeviceBuffer q = to_device(in.q), k = to_device(in.k), v = to_device(in.v), g = to_device(in.g),
               beta = to_device(in.beta), state = to_device(in.state),
               o(sizeof(float) * in.v.size());
  const int64_t first = 128;
  const int64_t row = in.num_heads * in.head_dim;
  for (const auto& [t0, num_tokens] :
       {std::pair{int64_t{0}, first}, {first, in.num_tokens - first}}) {
    KdaParams p =
        params_of(in, q.as<float>() + t0 * row, k.as<float>() + t0 * row, v.as<float>() + t0 * row,
                  g.as<float>() + t0 * row, beta.as<float>() + t0 * in.num_heads, state.as<float>(),
                  o.as<float>() + t0 * row);
    p.num_tokens = num_tokens;
    const size_t bytes = cuda::kda_chunked_workspace_bytes(p);
    DeviceBuffer workspace(bytes);
    cuda::kda_chunked(p, workspace.data(), bytes, nullptr);
    sync();
  }
  EXPECT_TRUE(close_to_scale(to_host<float>(o, in.v.size()), want.o, kTensorSameFormTol));
  EXPECT_TRUE(
      close_to_scale(to_host<float>(state, in.state.size()), want.state, kTensorSameFormTol));
}

// cuda::kda_decode over device copies of `in`.
test::KdaDecodeResult kda_decode_gpu(const test::KdaDecodeBatch& in, bool one_token_rows = false,
                                     const test::KdaDecodeMode& mode = {}) {
  DeviceBuffer q = to_device(in.q), k = to_device(in.k), v = to_device(in.v), f = to_device(in.f),
               b = to_device(in.b), gate = to_device(in.gate), cw0 = to_device(in.conv_weight[0]),
               cw1 = to_device(in.conv_weight[1]), cw2 = to_device(in.conv_weight[2]),
               dt_bias = to_device(in.dt_bias), a_log = to_device(in.a_log),
               o_norm = to_device(in.o_norm), cache = to_device(in.cache),
               offsets = to_device(in.offsets), rows = to_device(in.state_rows),
               y(sizeof(float) * std::max<int64_t>(1, in.tokens() * in.width())),
               counts = to_device(mode.counts.empty() ? std::vector<int32_t>{0} : mode.counts);
  {
    const std::vector<float> zeros(y.size() / sizeof(float), 0.0f);
    y.upload(zeros.data(), y.size());
  }
  const test::KdaDecodePointers ptr{q.as<float>(),
                                    k.as<float>(),
                                    v.as<float>(),
                                    f.as<float>(),
                                    b.as<float>(),
                                    gate.as<float>(),
                                    {cw0.as<float>(), cw1.as<float>(), cw2.as<float>()},
                                    dt_bias.as<float>(),
                                    a_log.as<float>(),
                                    o_norm.as<float>(),
                                    cache.as<float>(),
                                    offsets.as<int32_t>(),
                                    rows.as<int32_t>(),
                                    y.as<float>()};
  KdaDecodeParams p = test::kda_decode_params(in, ptr, one_token_rows);
  p.write_state = mode.write_state;
  if (!mode.outputs) p.y = nullptr;
  if (!mode.counts.empty()) p.token_counts = counts.as<int32_t>();
  cuda::kda_decode(p, nullptr);
  sync();
  return {to_host<float>(y, in.tokens() * in.width()), to_host<float>(cache, in.cache.size())};
}

// The fused decode against cpu::kda_decode (itself bitwise the separate CPU ops):
// elementwise parts a few ulps apart (expf, FMA), the l2norm's and RMSNorm's sums in a
// warp tree, S^T k and S^T q as four partial sums of 32 rows; the state carries the
// differences through a request's tokens. 1e-5 of the largest magnitude for the state
// (the recurrence's budget above), 2e-5 for y (the gated norm divides by the rms of o).
constexpr double kDecodeStateTol = 1e-5;
constexpr double kDecodeOutTol = 2e-5;

TEST(GpuKda, DecodeMatchesCpu) {
  REQUIRE_GPU();
  uint32_t seed = 500;
  for (const int64_t dim : {32, 48, 128}) {
    for (const int64_t taps : {1, 4}) {
      for (const float lower_bound : {0.0f, -5.0f}) {
        for (const std::vector<int32_t>& tokens :
             {std::vector<int32_t>{1}, {1, 1, 1, 1, 1}, {3, 0, 9, 1, 17}, {0}, {8, 16, 2}}) {
          const test::KdaDecodeBatch in =
              test::make_kda_decode_batch(tokens, 3, dim, taps, lower_bound, ++seed);
          const test::KdaDecodeResult want = test::kda_decode_cpu(in);
          const test::KdaDecodeResult got = kda_decode_gpu(in);
          EXPECT_TRUE(close_to_scale(got.y, want.y, kDecodeOutTol)) << "y " << in.name();
          EXPECT_TRUE(close_to_scale(got.cache, want.cache, kDecodeStateTol))
              << "cache " << in.name();
          // Rows no request names, and the states of requests without tokens, unchanged.
          const int64_t rf = in.row_floats();
          for (int64_t row = 0; row < std::ssize(in.cache) / rf; ++row) {
            bool named = false;
            for (int64_t r = 0; r < in.rows(); ++r) {
              named |= in.state_rows[r] == row && in.offsets[r + 1] > in.offsets[r];
            }
            if (named) continue;
            EXPECT_TRUE(std::equal(got.cache.begin() + row * rf, got.cache.begin() + (row + 1) * rf,
                                   in.cache.begin() + row * rf))
                << "row " << row << " " << in.name();
          }
        }
      }
    }
  }
}

TEST(GpuKda, DecodeOfOneTokenRowsWithoutOffsets) {
  REQUIRE_GPU();
  const test::KdaDecodeBatch in =
      test::make_kda_decode_batch(std::vector<int32_t>(64, 1), 8, 128, 4, -5.0f, 600);
  const test::KdaDecodeResult with_offsets = kda_decode_gpu(in);
  const test::KdaDecodeResult without = kda_decode_gpu(in, /*one_token_rows=*/true);
  EXPECT_EQ(with_offsets.y, without.y);
  EXPECT_EQ(with_offsets.cache, without.cache);
  const test::KdaDecodeResult want = test::kda_decode_cpu(in);
  EXPECT_TRUE(close_to_scale(without.y, want.y, kDecodeOutTol));
  EXPECT_TRUE(close_to_scale(without.cache, want.cache, kDecodeStateTol));
}

// Speculative verification on the GPU: verify leaves every state bit as it was and gives the
// outputs of a normal call (the same kernel: bitwise); a commit of counted tokens gives the
// CPU's states of those tokens within the decode tolerance, and no outputs.
TEST(GpuKda, VerifyWritesNoStateAndCommitKeepsTheCountedTokens) {
  REQUIRE_GPU();
  for (const float lower_bound : {0.0f, -5.0f}) {
    const test::KdaDecodeBatch in =
        test::make_kda_decode_batch({3, 0, 9, 1, 12}, 4, 128, 4, lower_bound, 700);
    const test::KdaDecodeResult full = kda_decode_gpu(in);
    const test::KdaDecodeResult verified =
        kda_decode_gpu(in, false, {.write_state = false, .outputs = true, .counts = {}});
    EXPECT_EQ(verified.y, full.y);
    EXPECT_EQ(verified.cache, in.cache);
    for (const std::vector<int32_t>& counts :
         {std::vector<int32_t>{1, 0, 1, 1, 1}, {2, 0, 9, 1, 9}, {0, 0, 4, 0, 12}}) {
      const test::KdaDecodeResult committed =
          kda_decode_gpu(in, false, {.write_state = true, .outputs = false, .counts = counts});
      const test::KdaDecodeResult want = test::kda_decode_by_ops(test::kept_tokens(in, counts));
      EXPECT_TRUE(close_to_scale(committed.cache, want.cache, kDecodeStateTol)) << counts[4];
      EXPECT_EQ(committed.y, std::vector<float>(full.y.size(), 0.0f));
    }
  }
}

TEST(GpuKda, RefusesHeadDimOver128) {
  REQUIRE_GPU();
  float dummy = 0.0f;
  KdaParams p{.state = &dummy, .num_tokens = 0, .num_heads = 1, .head_dim = 256};
  EXPECT_THROW(cuda::kda_recurrent(p, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::kda_chunked(p, nullptr, 0, nullptr), InvalidArgument);
  p.head_dim = 32;
  EXPECT_THROW(cuda::kda_chunked(p, nullptr, 0, nullptr, 65), InvalidArgument);
  KdaDecodeParams d{
      .state = &dummy, .state_rows = nullptr, .num_heads = 1, .head_dim = 256, .kernel_size = 4};
  EXPECT_THROW(cuda::kda_decode(d, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
