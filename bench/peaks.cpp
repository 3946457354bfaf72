#include "peaks.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <vector>

#include "core/cuda/device_buffer.h"
#include "core/dtype.h"
#include "util/cuda_check.h"
#include "util/error.h"

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

namespace {
constexpr int kGemmN = 8192;

// Random operands (constant ones let the GPU run at clocks that real data does not reach):
// bf16 of N(0, 1) values, or e4m3 codes other than NaN.
cuda::DeviceBuffer random_gemm_operand(bool fp8, uint64_t seed) {
  const size_t n = size_t{kGemmN} * kGemmN;
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> host(fp8 ? n : 2 * n);
  if (fp8) {
    for (uint8_t& b : host) {
      b = static_cast<uint8_t>(rng());
      if ((b & 0x7fu) == 0x7fu) b ^= 1u;
    }
  } else {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      const float v = d(rng);
      std::memcpy(&bits, &v, 4);
      host[2 * i] = static_cast<uint8_t>(bits >> 16);
      host[2 * i + 1] = static_cast<uint8_t>(bits >> 24);
    }
  }
  cuda::DeviceBuffer out(host.size());
  CUDA_CHECK(cudaMemcpy(out.data(), host.data(), host.size(), cudaMemcpyHostToDevice));
  return out;
}
}  // namespace

double measure_bf16_gemm_rate() {
  const int n = kGemmN;
  const cuda::DeviceBuffer a = random_gemm_operand(false, 1), b = random_gemm_operand(false, 2);
  cuda::DeviceBuffer c(size_t{2} * n * n);
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  const float alpha = 1.0f, beta = 0.0f;
  const float ms = median_event_ms([&] {
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), CUDA_R_16BF,
                              n, b.data(), CUDA_R_16BF, n, &beta, c.data(), CUDA_R_16BF, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  return 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3);
}

double measure_fp8_gemm_rate() {
  const int n = kGemmN;
  const size_t ws_bytes = size_t{64} << 20;
  const cuda::DeviceBuffer a = random_gemm_operand(true, 3), b = random_gemm_operand(true, 4);
  cuda::DeviceBuffer c(size_t{2} * n * n), ws(ws_bytes);
  cublasLtHandle_t lt;
  CUBLAS_CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  cublasLtMatrixLayout_t la, lb, lc;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &algo, &found));
  CHECK(found > 0, "measure_fp8_gemm_rate: cuBLASLt has no e4m3 GEMM for this GPU");
  const float alpha = 1.0f, beta = 0.0f;
  const float ms = median_event_ms([&] {
    CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a.data(), la, b.data(), lb, &beta, c.data(), lc,
                                c.data(), lc, &algo.algo, ws.data(), ws_bytes, nullptr));
  });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3);
}

std::vector<float> random_normal_f32(int64_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> random_normal_bf16(int64_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = f32_to_bf16(d(rng));
  return v;
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
