// CUDA row normalizations: one 256-thread block per row, statistics in double
// (cub block reductions), per-element scaling in fp32 in the CPU op's order.
#include <cub/block/block_reduce.cuh>

#include "kernels/norm/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
using BlockSum = cub::BlockReduce<double, kThreads>;

// Sum of v over the block, returned to every thread.
__device__ double block_sum(double v, typename BlockSum::TempStorage& tmp, double& result) {
  const double s = BlockSum(tmp).Sum(v);
  if (threadIdx.x == 0) result = s;
  __syncthreads();
  const double out = result;
  __syncthreads();
  return out;
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ typename BlockSum::TempStorage tmp;
  __shared__ double result;
  const float* x = p.x + blockIdx.x * p.dim;
  float* y = p.y + blockIdx.x * p.dim;
  double sum_sq = 0.0;
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    sum_sq += static_cast<double>(x[i]) * x[i];
  }
  sum_sq = block_sum(sum_sq, tmp, result);
  const float inv_rms = static_cast<float>(1.0 / sqrt(sum_sq / p.dim + p.eps));
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads)
    y[i] = __fmul_rn(x[i], inv_rms) * p.weight[i];
}

__global__ void __launch_bounds__(kThreads) layer_norm_kernel(LayerNormParams p) {
  __shared__ typename BlockSum::TempStorage tmp;
  __shared__ double result;
  const float* x = p.x + blockIdx.x * p.dim;
  float* y = p.y + blockIdx.x * p.dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) sum += x[i];
  const double mean = block_sum(sum, tmp, result) / p.dim;
  double sum_sq = 0.0;
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    const double d = x[i] - mean;
    sum_sq += d * d;
  }
  sum_sq = block_sum(sum_sq, tmp, result);
  const float inv_std = static_cast<float>(1.0 / sqrt(sum_sq / p.dim + p.eps));
  const float mean_f = static_cast<float>(mean);
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    y[i] =
        __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[i], mean_f), inv_std), p.weight[i]), p.bias[i]);
  }
}

void check_rows(int64_t num_rows, int64_t dim, float eps, const char* op) {
  CHECK(num_rows >= 0, op, ": num_rows ", num_rows);
  CHECK(dim > 0, op, ": dim ", dim);
  CHECK(eps >= 0.0f, op, ": eps ", eps);
  CHECK(num_rows <= INT32_MAX, op, ": num_rows ", num_rows, " over 2^31");
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  CHECK(p.x != nullptr && p.weight != nullptr && p.y != nullptr, "rms_norm: null pointer");
  check_rows(p.num_rows, p.dim, p.eps, "rms_norm");
  if (p.num_rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  CHECK(p.x != nullptr && p.weight != nullptr && p.bias != nullptr && p.y != nullptr,
        "layer_norm: null pointer");
  check_rows(p.num_rows, p.dim, p.eps, "layer_norm");
  if (p.num_rows == 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
