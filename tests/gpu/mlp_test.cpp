// CUDA gated MLP against the CPU op, every weight format, both linear paths.
// Tolerances: GEMV path (T <= 16): fp32, only summation order and expf differ:
// abs 2e-5, rel 1e-4 (outputs are O(0.1 - 1)). Tensor-core path: x and silu*up are
// rounded to bf16 (2^-9 relative each, and F32 / F16 / FP8 weights too), so
// abs 1e-2 * max|y|, rel 1e-2.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/mlp/cuda.h"

namespace hyserve {
namespace {

using test::Format;

struct Shape {
  int64_t hidden, inter;
};

std::vector<float> run_gpu(const MlpWeights& dw, const std::vector<float>& x, int64_t t,
                           bool in_place, cuda::LinearKernel kernel = cuda::LinearKernel::kAuto) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  std::vector<float> y;
  {
    cuda::Blas blas(stream);
    const int64_t hidden = dw.down.rows;
    cuda::DeviceBuffer dx = cuda::to_device(x);
    cuda::DeviceBuffer dy(x.size() * sizeof(float) + 4);
    cuda::DeviceBuffer ws(cuda::mlp_workspace_bytes(dw, t));
    float* out = in_place ? dx.as<float>() : dy.as<float>();
    cuda::mlp({.x = dx.as<float>(), .w = &dw, .y = out, .num_tokens = t, .act = {}}, blas,
              ws.data(), ws.size(), stream, kernel);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    y = cuda::to_host<float>(in_place ? dx : dy, static_cast<size_t>(t * hidden));
  }
  cudaStreamDestroy(stream);
  return y;
}

TEST(GpuMlp, MatchesCpuEveryFormatBothPaths) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (Format f : test::kAllFormats) {
    for (Shape s : {Shape{64, 96}, Shape{65, 63}, Shape{320, 192}}) {
      if (test::needs_cols_of_32(f) && (s.hidden % 32 != 0 || s.inter % 32 != 0)) continue;
      const test::HostMlp m = test::random_mlp(s.hidden, s.inter, f, seed);
      seed += 3;
      const test::DeviceMlp d = test::upload(m);
      for (int64_t t : {1, 3, 16, 17, 63, 65}) {
        SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(s.hidden) +
                     " I=" + std::to_string(s.inter) + " T=" + std::to_string(t));
        const std::vector<float> x = test::random_floats(t * s.hidden, seed++);
        std::vector<float> want(x.size());
        cpu::mlp({.x = x.data(), .w = &m.w, .y = want.data(), .num_tokens = t, .act = {}});
        const bool in_place = t % 2 == 1;
        if (t <= cuda::kSmallBatchMaxTokens) {
          EXPECT_TRUE(test::all_close(run_gpu(d.w, x, t, in_place), want, 2e-5f, 1e-4f));
        } else {
          EXPECT_TRUE(test::all_close(run_gpu(d.w, x, t, in_place), want,
                                      1e-2f * test::max_abs(want), 1e-2f));
        }
      }
    }
  }
}

// Batch-invariant linears: close to the CPU (bf16 operands) and each token's output the
// same bits alone as in a batch of 37.
TEST(GpuMlp, BatchInvariantMatchesCpuAndEachTokenAlone) {
  REQUIRE_GPU();
  const auto k = cuda::LinearKernel::kBatchInvariant;
  uint64_t seed = 500;
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4}) {
    SCOPED_TRACE(test::format_name(f));
    const int64_t hidden = 64, inter = 96, t = 37;
    const test::HostMlp m = test::random_mlp(hidden, inter, f, seed);
    seed += 3;
    const test::DeviceMlp d = test::upload(m);
    const std::vector<float> x = test::random_floats(t * hidden, seed++);
    std::vector<float> want(x.size());
    cpu::mlp({.x = x.data(), .w = &m.w, .y = want.data(), .num_tokens = t, .act = {}});
    const std::vector<float> all = run_gpu(d.w, x, t, false, k);
    EXPECT_TRUE(test::all_close(all, want, 1e-2f * test::max_abs(want), 1e-2f));
    for (int64_t i = 0; i < t; i += 5) {
      const std::vector<float> xi(x.begin() + i * hidden, x.begin() + (i + 1) * hidden);
      const std::vector<float> one = run_gpu(d.w, xi, 1, i % 2 == 1, k);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + i * hidden, hidden * sizeof(float)))
          << "token " << i;
    }
  }
}

TEST(GpuMlp, EmptyBatchAndSmallWorkspace) {
  REQUIRE_GPU();
  const test::HostMlp m = test::random_mlp(64, 32, Format::kBF16, 5);
  const test::DeviceMlp d = test::upload(m);
  cuda::Blas blas(nullptr);
  cuda::DeviceBuffer buf(64 * 64 * sizeof(float));
  EXPECT_NO_THROW(
      cuda::mlp({.x = buf.as<float>(), .w = &d.w, .y = buf.as<float>(), .num_tokens = 0, .act = {}},
                blas, nullptr, 0, nullptr));
  cuda::DeviceBuffer ws(cuda::mlp_workspace_bytes(d.w, 64) - 1);
  EXPECT_THROW(
      cuda::mlp(
          {.x = buf.as<float>(), .w = &d.w, .y = buf.as<float>(), .num_tokens = 64, .act = {}},
          blas, ws.data(), ws.size(), nullptr),
      InvalidArgument);
}

}  // namespace
}  // namespace hyserve
