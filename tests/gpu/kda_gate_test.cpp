// CUDA kda_gate in both forms against the CPU op: Kimi K3's bounded gate
// (lower_bound * sigmoid(exp(a_log) * (f + dt_bias)), lower_bound -5, K3.md §3.3) on
// strongly negative and strongly positive pre-activations (the sigmoid saturates to 0 and
// to 1: g -> -0 and g -> lower_bound), and the softplus form (lower_bound 0) unchanged.
// Both are a few fp32 operations with expf / log1pf, which differ from the host's
// std::exp / std::log1p by an ulp or two: abs 1e-6, rel 1e-5 (|g| <= 5 here, and the
// softplus gates are O(1..100)). The only GPU test of kda_gate (both forms).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/kda/cpu.h"
#include "kernels/kda/cuda.h"
#include "util/error.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

// g from both ops for f uniform in [-f_range, f_range].
void expect_gate_matches(float lower_bound, float f_range, uint64_t seed) {
  for (const int64_t num_tokens : {0, 1, 3, 65}) {
    for (const int64_t num_heads : {1, 3}) {
      for (const int64_t head_dim : {32, 128}) {
        SCOPED_TRACE("lower_bound " + std::to_string(lower_bound) + ", f range " +
                     std::to_string(f_range) + ", T " + std::to_string(num_tokens) + ", H " +
                     std::to_string(num_heads) + ", K " + std::to_string(head_dim));
        const int64_t n = num_tokens * num_heads * head_dim;
        // At least one element each, so that the CPU op gets non-null pointers for T = 0.
        const std::vector<float> f =
            test::random_floats(std::max<int64_t>(n, 1), ++seed, -f_range, f_range);
        const std::vector<float> bias = test::random_floats(num_heads * head_dim, ++seed);
        const std::vector<float> a_log = test::random_floats(num_heads, ++seed, -1.0f, 2.0f);
        std::vector<float> g(f.size());
        DeviceBuffer d_f = to_device(f), d_b = to_device(bias), d_a = to_device(a_log),
                     d_g(sizeof(float) * f.size());
        KdaGateParams p{.f = f.data(),
                        .dt_bias = bias.data(),
                        .a_log = a_log.data(),
                        .g = g.data(),
                        .num_tokens = num_tokens,
                        .num_heads = num_heads,
                        .head_dim = head_dim,
                        .lower_bound = lower_bound};
        cpu::kda_gate(p);
        p.f = d_f.as<float>();
        p.dt_bias = d_b.as<float>();
        p.a_log = d_a.as<float>();
        p.g = d_g.as<float>();
        cuda::kda_gate(p, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        g.resize(n);
        const std::vector<float> got = to_host<float>(d_g, n);
        EXPECT_TRUE(test::all_close(got, g, 1e-6f, 1e-5f));
        if (lower_bound < 0.0f) {
          for (float v : got) {
            ASSERT_TRUE(v <= 0.0f && v >= lower_bound) << "g " << v << " outside [lower_bound, 0]";
          }
        }
      }
    }
  }
}

TEST(GpuKdaGate, BoundedMatchesCpuModerateAndSaturated) {
  REQUIRE_GPU();
  expect_gate_matches(-5.0f, 3.0f, 10);    // the sigmoid's curved part
  expect_gate_matches(-5.0f, 200.0f, 20);  // saturated both ways: g -> -0 and g -> -5
  expect_gate_matches(-0.5f, 30.0f, 30);
}

TEST(GpuKdaGate, SoftplusFormUnchanged) {
  REQUIRE_GPU();
  expect_gate_matches(0.0f, 30.0f, 40);  // across the softplus threshold 20
}

TEST(GpuKdaGate, RefusesBadLowerBound) {
  REQUIRE_GPU();
  DeviceBuffer buf(1 << 12);
  KdaGateParams p{.f = buf.as<float>(),
                  .dt_bias = buf.as<float>(),
                  .a_log = buf.as<float>(),
                  .g = buf.as<float>(),
                  .num_tokens = 1,
                  .num_heads = 1,
                  .head_dim = 8};
  for (float bad : {1.0f, NAN, -INFINITY}) {
    p.lower_bound = bad;
    EXPECT_THROW(cuda::kda_gate(p, nullptr), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace hyserve
