#include "peaks.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>

#include "core/cuda/device_buffer.h"
#include "util/cuda_check.h"

namespace hyserve::bench {

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

float median_event_ms(const std::function<void()>& fn) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 25; ++i) {
    CUDA_CHECK(cudaEventRecord(e0));
    fn();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float t;
    CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 5) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return median(ms);
}

FlushedTimer::FlushedTimer(int iters, bool flush)
    : iters_(iters), flush_(flush ? size_t{256} << 20 : 0) {
  CUDA_CHECK(cudaEventCreate(&e0_));
  CUDA_CHECK(cudaEventCreate(&e1_));
}

FlushedTimer::~FlushedTimer() {
  cudaEventDestroy(e0_);
  cudaEventDestroy(e1_);
}

float FlushedTimer::time_us(const std::function<void()>& fn) {
  std::vector<float> us;
  for (int i = 0; i < iters_ + 3; ++i) {
    if (flush_.size() > 0) CUDA_CHECK(cudaMemsetAsync(flush_.data(), i & 0xff, flush_.size()));
    CUDA_CHECK(cudaEventRecord(e0_));
    fn();
    CUDA_CHECK(cudaEventRecord(e1_));
    CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    if (i >= 3) us.push_back(ms * 1e3f);
  }
  return median(us);
}

double measure_copy_bandwidth() {
  const size_t n = size_t{2} << 30;
  cuda::DeviceBuffer a(n), b(n);
  const float ms = median_event_ms(
      [&] { CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice)); });
  return 2.0 * n / (ms * 1e-3);
}

int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace hyserve::bench
