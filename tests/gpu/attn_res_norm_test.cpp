// CUDA attn_res_norm (the Block AttnRes mix fused with the RMSNorm after it) against the
// CPU op. Both sum each candidate's v^2 and v . query, and the mix's m^2, in double, and
// mix in fp32 with one rounding per product and per add in candidate order; what differs
// is the order of the double sums (a score moves by an ulp), the device expf (1-2 ulp in
// the softmax weights) and the last ulp of the fp32 statistics. Each is a few fp32 ulp
// of the output: tolerance abs 1e-5 * max|y|, rel 2e-5 (rel alone covers ~100 ulp; the
// abs part covers outputs where the mix cancels).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/norm/cuda.h"
#include "util/error.h"

namespace hyserve {
namespace {

struct Inputs {
  int64_t tokens, dim, num_snapshots, stride;
  std::vector<float> snapshots;  // [num_snapshots, stride]
  std::vector<float> current;    // [tokens, dim]
  std::vector<float> query;      // [dim]
  std::vector<float> weight;     // [dim]
};

// Candidate i is scale_i * (u + offset_i), u uniform in [-1, 1], scale_i spread over
// 10^-2 .. 10^2 and the offsets evenly spaced over [-1, 1] (shuffled); the query is
// 3 / dim * (1 +- 0.5), so s_i ~ 3 * mean(rmsnorm(v_i)): the scores differ by a few
// units between candidates (the softmax is neither uniform nor one-hot) while the
// candidates' raw magnitudes differ by up to 10^4.
Inputs make_inputs(int64_t tokens, int64_t dim, int64_t num_snapshots, int64_t pad, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Inputs in{tokens, dim, num_snapshots, tokens * dim + pad, {}, {}, {}, {}};
  const int64_t n = num_snapshots + 1;
  std::vector<float> scale(n), offset(n);
  for (int64_t i = 0; i < n; ++i) {
    scale[i] = std::pow(10.0f, 2.0f * u(rng));
    offset[i] = n == 1 ? 0.5f : -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(n - 1);
  }
  std::shuffle(offset.begin(), offset.end(), rng);
  const auto fill = [&](float* v, int64_t count, int64_t i) {
    for (int64_t k = 0; k < count; ++k) v[k] = scale[i] * (u(rng) + offset[i]);
  };
  // Padding between snapshots holds NaN: reading it would show.
  in.snapshots.assign(std::max<int64_t>(num_snapshots * in.stride, 1), NAN);
  for (int64_t i = 0; i < num_snapshots; ++i)
    fill(in.snapshots.data() + i * in.stride, tokens * dim, i);
  in.current.resize(std::max<int64_t>(tokens * dim, 1));
  fill(in.current.data(), tokens * dim, n - 1);
  const float q = 3.0f / static_cast<float>(dim);
  for (int64_t d = 0; d < dim; ++d) in.query.push_back(q * (1.0f + 0.5f * u(rng)));
  for (int64_t d = 0; d < dim; ++d) in.weight.push_back(1.0f + 0.5f * u(rng));
  return in;
}

// Largest minus smallest AttnRes score of token 0 (in double): the test's inputs must
// make the softmax non-uniform.
double score_spread(const Inputs& in) {
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i <= in.num_snapshots; ++i) {
    const float* v = i < in.num_snapshots ? in.snapshots.data() + i * in.stride : in.current.data();
    double sum_sq = 0.0, dot = 0.0;
    for (int64_t d = 0; d < in.dim; ++d) {
      sum_sq += static_cast<double>(v[d]) * v[d];
      dot += static_cast<double>(v[d]) * in.query[d];
    }
    const double s = dot / std::sqrt(sum_sq / in.dim + 1e-5);
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
  return hi - lo;
}

AttnResNormParams params_for(const Inputs& in, const float* snapshots, const float* current,
                             const float* query, const float* weight, float* y) {
  return {.snapshots = snapshots,
          .snapshot_stride = in.stride,
          .num_snapshots = in.num_snapshots,
          .current = current,
          .query = query,
          .res_eps = 1e-5f,
          .norm_weight = weight,
          .norm_eps = 1e-5f,
          .y = y,
          .num_tokens = in.tokens,
          .dim = in.dim};
}

std::vector<float> run_gpu(const Inputs& in) {
  const cuda::DeviceBuffer ds = cuda::to_device(in.snapshots);
  const cuda::DeviceBuffer dc = cuda::to_device(in.current);
  const cuda::DeviceBuffer dq = cuda::to_device(in.query);
  const cuda::DeviceBuffer dw = cuda::to_device(in.weight);
  cuda::DeviceBuffer dy(in.current.size() * sizeof(float));
  cuda::attn_res_norm(params_for(in, ds.as<float>(), dc.as<float>(), dq.as<float>(), dw.as<float>(),
                                 dy.as<float>()),
                      nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return cuda::to_host<float>(dy, static_cast<size_t>(in.tokens * in.dim));
}

TEST(GpuAttnResNorm, MatchesCpuOnAwkwardShapes) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (int64_t dim : {1, 3, 63, 64, 65, 321, 7168}) {
    for (int64_t tokens : {0, 1, 3, 65}) {
      for (int64_t num_snapshots : {0, 1, 2, 8}) {
        const int64_t pad = (seed % 3) * 7;  // snapshot_stride > tokens * dim when pad > 0
        SCOPED_TRACE("dim " + std::to_string(dim) + ", tokens " + std::to_string(tokens) +
                     ", snapshots " + std::to_string(num_snapshots) + ", pad " +
                     std::to_string(pad));
        const Inputs in = make_inputs(tokens, dim, num_snapshots, pad, seed++);
        if (tokens > 0 && num_snapshots > 0 && dim >= 63) {
          EXPECT_GT(score_spread(in), 1.0);
        }
        std::vector<float> want(in.current.size());
        cpu::attn_res_norm(params_for(in, in.snapshots.data(), in.current.data(), in.query.data(),
                                      in.weight.data(), want.data()));
        want.resize(static_cast<size_t>(tokens * dim));
        EXPECT_TRUE(test::all_close(run_gpu(in), want, 1e-5f * test::max_abs(want), 2e-5f));
      }
    }
  }
}

// The kernel's limit: up to kMaxAttnResCandidates - 1 snapshots (16 is well inside).
TEST(GpuAttnResNorm, MatchesCpuWithManySnapshots) {
  REQUIRE_GPU();
  uint64_t seed = 1000;
  for (int64_t num_snapshots : {int64_t{16}, cuda::kMaxAttnResCandidates - 1}) {
    SCOPED_TRACE("snapshots " + std::to_string(num_snapshots));
    const Inputs in = make_inputs(5, 257, num_snapshots, 11, seed++);
    std::vector<float> want(in.current.size());
    cpu::attn_res_norm(params_for(in, in.snapshots.data(), in.current.data(), in.query.data(),
                                  in.weight.data(), want.data()));
    EXPECT_TRUE(test::all_close(run_gpu(in), want, 1e-5f * test::max_abs(want), 2e-5f));
  }
}

TEST(GpuAttnResNorm, RefusesBadArguments) {
  REQUIRE_GPU();
  cuda::DeviceBuffer buf(1 << 16);
  float* b = buf.as<float>();
  const auto good = [&] {
    return AttnResNormParams{.snapshots = b,
                             .snapshot_stride = 64,
                             .num_snapshots = 2,
                             .current = b + 256,
                             .query = b + 512,
                             .norm_weight = b + 768,
                             .y = b + 1024,
                             .num_tokens = 4,
                             .dim = 16};
  };
  EXPECT_NO_THROW(cuda::attn_res_norm(good(), nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  AttnResNormParams p = good();
  p.num_snapshots = cuda::kMaxAttnResCandidates;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.snapshot_stride = 63;  // < num_tokens * dim
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.dim = 0;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.query = nullptr;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.snapshots = nullptr;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.res_eps = -1.0f;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.norm_eps = -1.0f;
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.y = b + 64 + 10;  // inside snapshot 1
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.y = b + 256;  // current
  EXPECT_THROW(cuda::attn_res_norm(p, nullptr), InvalidArgument);
  p = good();
  p.num_tokens = 0;
  p.y = nullptr;  // nothing to do: not read
  EXPECT_NO_THROW(cuda::attn_res_norm(p, nullptr));
}

}  // namespace
}  // namespace hyserve
