// CUDA elementwise steps against the CPU ops and the formulas. residual_add and scale
// are single IEEE operations: bitwise equal. sigmoid_gate and silu_mul use expf, which
// may differ from the host exp by 2 ulp: tolerance rel 1e-6, abs 1e-7.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/elementwise/cpu.h"
#include "kernels/elementwise/cuda.h"

namespace hyserve {
namespace {

const int64_t kSizes[] = {0, 1, 3, 63, 65, 321, 100003};

TEST(GpuElementwise, ResidualAddAndScaleAreExact) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> h = test::random_floats(n, 1 + n, -5.0f, 5.0f);
    const std::vector<float> x = test::random_floats(n, 2 + n, -5.0f, 5.0f);
    std::vector<float> want = h;
    cpu::residual_add({.h = want.data(), .x = x.data(), .n = n});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(want[i], h[i] + x[i]);
    cpu::scale({.x = want.data(), .n = n, .scale = 0.37f});
    cuda::DeviceBuffer dh = cuda::to_device(h);
    const cuda::DeviceBuffer dx = cuda::to_device(x);
    cuda::residual_add({.h = dh.as<float>(), .x = dx.as<float>(), .n = n}, nullptr);
    cuda::scale({.x = dh.as<float>(), .n = n, .scale = 0.37f}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(cuda::to_host<float>(dh, n), want);
  }
}

TEST(GpuElementwise, SigmoidGateMatchesCpu) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> o = test::random_floats(n, 3 + n, -4.0f, 4.0f);
    const std::vector<float> g = test::random_floats(n, 4 + n, -20.0f, 20.0f);
    std::vector<float> want = o;
    cpu::sigmoid_gate({.o = want.data(), .g = g.data(), .n = n});
    for (int64_t i = 0; i < std::min<int64_t>(n, 100); ++i) {
      ASSERT_NEAR(want[i], o[i] / (1.0 + std::exp(-static_cast<double>(g[i]))), 1e-6);
    }
    cuda::DeviceBuffer d_o = cuda::to_device(o);
    const cuda::DeviceBuffer dg = cuda::to_device(g);
    cuda::sigmoid_gate({.o = d_o.as<float>(), .g = dg.as<float>(), .n = n}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::all_close(cuda::to_host<float>(d_o, n), want, 1e-7f, 1e-6f));
  }
}

TEST(GpuElementwise, SiluMulMatchesCpuInPlace) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> gate = test::random_floats(n, 5 + n, -20.0f, 20.0f);
    const std::vector<float> up = test::random_floats(n, 6 + n, -3.0f, 3.0f);
    std::vector<float> want(n);
    cpu::silu_mul({.gate = gate.data(), .up = up.data(), .out = want.data(), .n = n});
    for (int64_t i = 0; i < std::min<int64_t>(n, 100); ++i) {
      const double g = gate[i];
      ASSERT_NEAR(want[i], g / (1.0 + std::exp(-g)) * up[i], 1e-5);
    }
    cuda::DeviceBuffer dg = cuda::to_device(gate);
    const cuda::DeviceBuffer du = cuda::to_device(up);
    cuda::silu_mul({.gate = dg.as<float>(), .up = du.as<float>(), .out = dg.as<float>(), .n = n},
                   nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::all_close(cuda::to_host<float>(dg, n), want, 1e-7f, 1e-6f));
  }
}

TEST(GpuElementwise, RefusesNullPointers) {
  REQUIRE_GPU();
  EXPECT_THROW(cuda::residual_add({.h = nullptr, .x = nullptr, .n = 4}, nullptr), InvalidArgument);
  EXPECT_NO_THROW(cuda::residual_add({.h = nullptr, .x = nullptr, .n = 0}, nullptr));
  EXPECT_THROW(cuda::scale({.x = nullptr, .n = -1}, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
