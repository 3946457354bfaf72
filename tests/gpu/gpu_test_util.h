// Helpers for GPU tests: skip without a GPU, random inputs, and a comparator that
// names the worst element.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include "core/cuda/device_buffer.h"
#include "util/cuda_check.h"

// Skips the test when this machine has no usable GPU.
#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    if (::hyserve::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

namespace hyserve::test {

// A CUDA stream of a test, destroyed with it.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Passes when |got - want| <= abs_tol + rel_tol * |want| everywhere; on failure the
// message names the worst element (index, got, want).
inline testing::AssertionResult all_close(const std::vector<float>& got,
                                          const std::vector<float>& want, float abs_tol,
                                          float rel_tol) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double worst = -1.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::fabs(static_cast<double>(got[i]) - want[i]) -
                          (abs_tol + rel_tol * std::fabs(static_cast<double>(want[i])));
    if (std::isnan(got[i]) != std::isnan(want[i]) || excess > worst) {
      worst = std::isnan(got[i]) != std::isnan(want[i]) ? INFINITY : excess;
      at = i;
    }
  }
  if (worst <= 0.0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << "worst element " << at << ": got " << got[at] << ", want " << want[at] << " (abs_tol "
         << abs_tol << ", rel_tol " << rel_tol << ")";
}

}  // namespace hyserve::test
