// CUDA gated MLP with Kimi K3's SiTU activation (K3.md §3.7) against the CPU op, bf16
// weights. Inputs span [-6, 6] so that gate and up reach the tanh caps (beta 4 and a
// linear_beta of 2 bite; K3's linear_beta 25 is nearly linear here).
// Tolerances: GEMV path (T <= 16): fp32 throughout, only the summation order and
// tanhf / expf (a few ulp from the host's std::tanh / std::exp) differ: abs 2e-5 *
// max(1, max|y|), rel 1e-4. Tensor-core path: x and act(gate, up) are rounded to bf16
// (2^-9 relative each): abs 1e-2 * max|y|, rel 1e-2, as for SiLU (mlp_test.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/mlp/cuda.h"

namespace hyserve {
namespace {

using test::Format;

constexpr GatedActivation kK3Situ{
    .kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = 25.0f};
constexpr GatedActivation kTightSitu{
    .kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = 2.0f};
constexpr GatedActivation kUncappedSitu{
    .kind = GatedActivation::Kind::kSitu, .beta = 1.5f, .linear_beta = 0.0f};

struct Shape {
  int64_t hidden, inter;
};

std::vector<float> run_gpu(const MlpWeights& dw, const std::vector<float>& x, int64_t t,
                           const GatedActivation& act, cuda::LinearKernel kernel) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  std::vector<float> y;
  {
    cuda::Blas blas(stream);
    cuda::DeviceBuffer dx = cuda::to_device(x);
    cuda::DeviceBuffer ws(cuda::mlp_workspace_bytes(dw, t));
    cuda::mlp({.x = dx.as<float>(), .w = &dw, .y = dx.as<float>(), .num_tokens = t, .act = act},
              blas, ws.data(), ws.size(), stream, kernel);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    y = cuda::to_host<float>(dx, static_cast<size_t>(t * dw.down.rows));
  }
  cudaStreamDestroy(stream);
  return y;
}

std::string act_name(const GatedActivation& a) {
  return "SiTU beta " + std::to_string(a.beta) + " linear_beta " + std::to_string(a.linear_beta);
}

TEST(GpuMlpSitu, MatchesCpuBf16BothPaths) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (const GatedActivation& act : {kK3Situ, kTightSitu, kUncappedSitu}) {
    for (const Shape& s : {Shape{64, 96}, Shape{65, 63}, Shape{320, 192}}) {
      const int64_t hidden = s.hidden, inter = s.inter;
      const test::HostMlp m = test::random_mlp(hidden, inter, Format::kBF16, seed);
      seed += 3;
      const test::DeviceMlp d = test::upload(m);
      for (int64_t t : {1, 3, 16, 17, 65}) {
        SCOPED_TRACE(act_name(act) + " D=" + std::to_string(hidden) +
                     " I=" + std::to_string(inter) + " T=" + std::to_string(t));
        const std::vector<float> x = test::random_floats(t * hidden, seed++, -6.0f, 6.0f);
        std::vector<float> want(x.size());
        cpu::mlp({.x = x.data(), .w = &m.w, .y = want.data(), .num_tokens = t, .act = act});
        const std::vector<float> got = run_gpu(d.w, x, t, act, cuda::LinearKernel::kAuto);
        const float scale = test::max_abs(want);
        if (t <= cuda::kSmallBatchMaxTokens) {
          EXPECT_TRUE(test::all_close(got, want, 2e-5f * std::max(1.0f, scale), 1e-4f));
        } else {
          EXPECT_TRUE(test::all_close(got, want, 1e-2f * scale, 1e-2f));
        }
      }
    }
  }
}

// SiTU with batch-invariant linears: close to the CPU, and each token's output the same
// bits alone as in a batch of 37.
TEST(GpuMlpSitu, BatchInvariantEachTokenAloneEqualsInBatch) {
  REQUIRE_GPU();
  const auto k = cuda::LinearKernel::kBatchInvariant;
  const int64_t hidden = 64, inter = 96, t = 37;
  const test::HostMlp m = test::random_mlp(hidden, inter, Format::kBF16, 77);
  const test::DeviceMlp d = test::upload(m);
  const std::vector<float> x = test::random_floats(t * hidden, 78, -6.0f, 6.0f);
  std::vector<float> want(x.size());
  cpu::mlp({.x = x.data(), .w = &m.w, .y = want.data(), .num_tokens = t, .act = kK3Situ});
  const std::vector<float> all = run_gpu(d.w, x, t, kK3Situ, k);
  EXPECT_TRUE(test::all_close(all, want, 1e-2f * test::max_abs(want), 1e-2f));
  for (int64_t i = 0; i < t; i += 6) {
    const std::vector<float> xi(x.begin() + i * hidden, x.begin() + (i + 1) * hidden);
    const std::vector<float> one = run_gpu(d.w, xi, 1, kK3Situ, k);
    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + i * hidden, hidden * sizeof(float)))
        << "token " << i;
  }
}

// SiLU through the same launcher keeps its bits: mlp with act left at its default equals
// mlp with an explicit kSilu (and SiTU differs, so act is read).
TEST(GpuMlpSitu, SiluDefaultUnchangedAndSituDiffers) {
  REQUIRE_GPU();
  const int64_t hidden = 64, inter = 96, t = 5;
  const test::HostMlp m = test::random_mlp(hidden, inter, Format::kBF16, 91);
  const test::DeviceMlp d = test::upload(m);
  const std::vector<float> x = test::random_floats(t * hidden, 92, -6.0f, 6.0f);
  const std::vector<float> silu = run_gpu(d.w, x, t, GatedActivation{}, cuda::LinearKernel::kAuto);
  std::vector<float> want(x.size());
  cpu::mlp({.x = x.data(), .w = &m.w, .y = want.data(), .num_tokens = t, .act = {}});
  EXPECT_TRUE(test::all_close(silu, want, 2e-5f * std::max(1.0f, test::max_abs(want)), 1e-4f));
  const std::vector<float> situ = run_gpu(d.w, x, t, kTightSitu, cuda::LinearKernel::kAuto);
  EXPECT_NE(0, std::memcmp(silu.data(), situ.data(), silu.size() * sizeof(float)));
}

TEST(GpuMlpSitu, RefusesBadSituParameters) {
  REQUIRE_GPU();
  const test::HostMlp m = test::random_mlp(64, 32, Format::kBF16, 5);
  const test::DeviceMlp d = test::upload(m);
  cuda::Blas blas(nullptr);
  cuda::DeviceBuffer buf(64 * 64 * sizeof(float));
  cuda::DeviceBuffer ws(cuda::mlp_workspace_bytes(d.w, 1));
  for (GatedActivation bad :
       {GatedActivation{.kind = GatedActivation::Kind::kSitu, .beta = 0.0f, .linear_beta = 0.0f},
        GatedActivation{
            .kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = -1.0f}}) {
    EXPECT_THROW(
        cuda::mlp(
            {.x = buf.as<float>(), .w = &d.w, .y = buf.as<float>(), .num_tokens = 1, .act = bad},
            blas, ws.data(), ws.size(), nullptr),
        InvalidArgument);
  }
}

}  // namespace
}  // namespace hyserve
