// CUDA linears (several projections of one input, x rounded to bf16 once on the tensor-core
// path) against one cuda::linear per projection: the results must be EQUAL, bit for bit, on
// every path (GEMV, cuBLAS, batch-invariant tiles) and for weights of different formats.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/device_weight.h"
#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/linear/cuda.h"

namespace hyserve {
namespace {

using test::Format;

using test::Stream;

TEST(GpuLinears, SharedInputEqualsOneLinearEachBitwise) {
  REQUIRE_GPU();
  constexpr int64_t kCols = 256;
  const Format formats[] = {Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4, Format::kF32};
  const int64_t rows[] = {96, 64, 160, 33};
  std::vector<test::HostWeight> host;
  std::vector<cuda::DeviceWeight> dev;
  for (size_t i = 0; i < std::size(formats); ++i) {
    host.push_back(test::random_weight(rows[i], kCols, formats[i], 700 + i, 0.05f));
    dev.push_back(cuda::DeviceWeight::upload(host.back().w));
  }
  Stream stream;
  cuda::Blas blas(stream.s);
  for (cuda::LinearKernel kernel : {cuda::LinearKernel::kAuto, cuda::LinearKernel::kCublas,
                                    cuda::LinearKernel::kBatchInvariant}) {
    for (int64_t t : {1, 8, 17, 64, 300}) {
      SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)) +
                   " T=" + std::to_string(t));
      const cuda::DeviceBuffer dx = cuda::to_device(test::random_floats(t * kCols, 800 + t));
      std::vector<cuda::DeviceBuffer> shared_y, alone_y;
      std::vector<LinearParams> ps;
      for (size_t i = 0; i < dev.size(); ++i) {
        shared_y.emplace_back(static_cast<size_t>(t * rows[i]) * 4);
        alone_y.emplace_back(static_cast<size_t>(t * rows[i]) * 4);
        ps.push_back({.x = dx.as<float>(),
                      .w = &dev[i].view(),
                      .y = shared_y.back().as<float>(),
                      .num_tokens = t});
      }
      cuda::DeviceBuffer ws(cuda::linears_workspace_bytes(ps));
      cuda::linears(ps, blas, ws.data(), ws.size(), stream.s, kernel);
      for (size_t i = 0; i < dev.size(); ++i) {
        LinearParams p = ps[i];
        p.y = alone_y[i].as<float>();
        cuda::DeviceBuffer one(cuda::linear_workspace_bytes(host[i].w, t));
        cuda::linear(p, blas, one.data(), one.size(), stream.s, kernel);
      }
      CUDA_CHECK(cudaStreamSynchronize(stream.s));
      for (size_t i = 0; i < dev.size(); ++i) {
        const auto n = static_cast<size_t>(t * rows[i]);
        const std::vector<float> a = cuda::to_host<float>(shared_y[i], n);
        const std::vector<float> b = cuda::to_host<float>(alone_y[i], n);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << "projection " << i;
      }
    }
  }
}

TEST(GpuLinears, RefusesProjectionsOfDifferentInputs) {
  REQUIRE_GPU();
  const test::HostWeight a = test::random_weight(8, 64, Format::kBF16, 1);
  const test::HostWeight b = test::random_weight(8, 32, Format::kBF16, 2);
  const cuda::DeviceWeight da = cuda::DeviceWeight::upload(a.w),
                           db = cuda::DeviceWeight::upload(b.w);
  const cuda::DeviceBuffer dx = cuda::to_device(test::random_floats(64 * 4, 3));
  cuda::DeviceBuffer y1(8 * 4 * 4), y2(8 * 4 * 4);
  Stream stream;
  cuda::Blas blas(stream.s);
  const std::vector<LinearParams> ps = {
      {.x = dx.as<float>(), .w = &da.view(), .y = y1.as<float>(), .num_tokens = 4},
      {.x = dx.as<float>(), .w = &db.view(), .y = y2.as<float>(), .num_tokens = 4}};
  cuda::DeviceBuffer ws(1 << 16);
  EXPECT_THROW(cuda::linears(ps, blas, ws.data(), ws.size(), stream.s), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
