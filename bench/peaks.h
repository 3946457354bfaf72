// The rooflines the benchmarks report against, measured in the same run: the
// device-to-device copy bandwidth and dense GEMM rates. And the medians they time with, and
// the random inputs several of them fill.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/cuda/device_buffer.h"

namespace hyserve::bench {

// Median of v (0 when empty).
float median(std::vector<float> v);

// Median milliseconds of fn's work on the default stream (CUDA events), over 20 runs
// after 5 warm-ups.
float median_event_ms(const std::function<void()>& fn);

// Times work on the default stream with CUDA events, L2 flushed before each run (a 256 MiB
// memset outside the timed interval) unless flush is false, so that a kernel's inputs
// come from HBM as in a model step.
class FlushedTimer {
 public:
  FlushedTimer(int iters, bool flush = true);
  ~FlushedTimer();
  FlushedTimer(const FlushedTimer&) = delete;
  FlushedTimer& operator=(const FlushedTimer&) = delete;

  // Median microseconds of fn over iters runs after 3 warm-ups.
  float time_us(const std::function<void()>& fn);

 private:
  int iters_;
  cuda::DeviceBuffer flush_;
  cudaEvent_t e0_, e1_;
};

// Device-to-device copy bandwidth of the current GPU, bytes read + written per second
// (2 GiB copies, median of 20 after 5 warm-ups).
double measure_copy_bandwidth();

// Dense 8192^3 GEMM rates of the current GPU on random operands, FLOP/s (median of 20
// after 5 warm-ups), fp32 accumulation, bf16 output: bf16 inputs (cuBLAS), and e4m3 inputs
// (cuBLASLt, A transposed as FP8 requires, unit scales, no fast accumulation).
double measure_bf16_gemm_rate();
double measure_fp8_gemm_rate();

// n normal values of mean 0 and the given standard deviation from a seeded generator: fp32,
// or rounded to bf16 bits.
std::vector<float> random_normal_f32(int64_t n, uint32_t seed, float stddev = 1.0f);
std::vector<uint16_t> random_normal_bf16(int64_t n, uint32_t seed, float stddev = 1.0f);

// A benchmark's main: run(argc, argv), or its exception's message after `name: ` on
// stderr and exit status 1.
int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv);

}  // namespace hyserve::bench
