// CUDA rms_norm / layer_norm against the CPU ops. Both sum the row statistics in
// double and scale in fp32 with the same rounding steps, so the only difference is the
// order of the double sums: the fp32 statistic can differ by one ulp, which moves an
// output by at most ~2 ulp: tolerance rel 1e-6, abs 1e-6 (layer_norm's x - mean
// cancels, so an ulp of the mean shows up absolutely).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/norm/cuda.h"

namespace hyserve {
namespace {

struct Case {
  int64_t rows, dim;
};

const Case kCases[] = {{0, 8}, {1, 1}, {3, 3}, {63, 63}, {65, 65}, {321, 321}, {5, 7168}, {2, 1}};

// At least one element, so that the CPU op gets non-null pointers for an empty batch.
size_t padded(int64_t n) {
  return static_cast<size_t>(std::max<int64_t>(n, 1));
}

TEST(GpuNorm, RmsNormMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.dim) +
                   (in_place ? " in place" : ""));
      const std::vector<float> x = test::random_floats(padded(c.rows * c.dim), seed++, -3.0f, 3.0f);
      const std::vector<float> w = test::random_floats(c.dim, seed++, 0.5f, 1.5f);
      std::vector<float> want(x.size());
      cpu::rms_norm({.x = x.data(),
                     .weight = w.data(),
                     .y = want.data(),
                     .num_rows = c.rows,
                     .dim = c.dim,
                     .eps = 1e-6f});
      cuda::DeviceBuffer dx = cuda::to_device(x);
      const cuda::DeviceBuffer dw = cuda::to_device(w);
      cuda::DeviceBuffer dy(x.size() * sizeof(float));
      float* y = in_place ? dx.as<float>() : dy.as<float>();
      cuda::rms_norm({.x = dx.as<float>(),
                      .weight = dw.as<float>(),
                      .y = y,
                      .num_rows = c.rows,
                      .dim = c.dim,
                      .eps = 1e-6f},
                     nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto n = static_cast<size_t>(c.rows * c.dim);
      want.resize(n);
      EXPECT_TRUE(test::all_close(cuda::to_host<float>(in_place ? dx : dy, n), want, 1e-6f, 1e-6f));
    }
  }
}

TEST(GpuNorm, LayerNormMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.dim) +
                   (in_place ? " in place" : ""));
      const std::vector<float> x = test::random_floats(padded(c.rows * c.dim), seed++, -2.0f, 4.0f);
      const std::vector<float> w = test::random_floats(c.dim, seed++, 0.5f, 1.5f);
      const std::vector<float> b = test::random_floats(c.dim, seed++);
      std::vector<float> want(x.size());
      cpu::layer_norm({.x = x.data(),
                       .weight = w.data(),
                       .bias = b.data(),
                       .y = want.data(),
                       .num_rows = c.rows,
                       .dim = c.dim,
                       .eps = 1e-5f});
      cuda::DeviceBuffer dx = cuda::to_device(x);
      const cuda::DeviceBuffer dw = cuda::to_device(w);
      const cuda::DeviceBuffer db = cuda::to_device(b);
      cuda::DeviceBuffer dy(x.size() * sizeof(float));
      float* y = in_place ? dx.as<float>() : dy.as<float>();
      cuda::layer_norm({.x = dx.as<float>(),
                        .weight = dw.as<float>(),
                        .bias = db.as<float>(),
                        .y = y,
                        .num_rows = c.rows,
                        .dim = c.dim,
                        .eps = 1e-5f},
                       nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto n = static_cast<size_t>(c.rows * c.dim);
      want.resize(n);
      EXPECT_TRUE(test::all_close(cuda::to_host<float>(in_place ? dx : dy, n), want, 1e-6f, 1e-6f));
    }
  }
}

TEST(GpuNorm, ZeroRowsGiveTheCpuResult) {
  REQUIRE_GPU();
  // An all-zero row: rms = sqrt(eps), so y = 0; layer_norm gives the bias.
  const std::vector<float> x(3 * 65, 0.0f);
  const std::vector<float> w(65, 1.0f);
  const std::vector<float> b = test::random_floats(65, 9);
  cuda::DeviceBuffer dx = cuda::to_device(x);
  const cuda::DeviceBuffer dw = cuda::to_device(w);
  const cuda::DeviceBuffer db = cuda::to_device(b);
  cuda::DeviceBuffer dy(x.size() * sizeof(float));
  cuda::layer_norm({.x = dx.as<float>(),
                    .weight = dw.as<float>(),
                    .bias = db.as<float>(),
                    .y = dy.as<float>(),
                    .num_rows = 3,
                    .dim = 65},
                   nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda::to_host<float>(dy, x.size());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(std::vector<float>(got.begin() + r * 65, got.begin() + (r + 1) * 65), b);
  }
}

TEST(GpuNorm, RefusesBadShapes) {
  REQUIRE_GPU();
  cuda::DeviceBuffer d(64);
  EXPECT_THROW(cuda::rms_norm({.x = d.as<float>(),
                               .weight = d.as<float>(),
                               .y = d.as<float>(),
                               .num_rows = 1,
                               .dim = 0},
                              nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::layer_norm({.x = d.as<float>(),
                                 .weight = d.as<float>(),
                                 .bias = nullptr,
                                 .y = d.as<float>(),
                                 .num_rows = 1,
                                 .dim = 4},
                                nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace hyserve
