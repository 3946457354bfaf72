// CUDA row normalizations: one 256-thread block per row, statistics in double
// (cub block reductions), per-element scaling in fp32 in the CPU op's order.
// attn_res_norm reads each candidate twice: pass 1 sums v_i^2 and v_i . query for every
// candidate (eight candidates' loads in flight, warp shuffles, then per-warp partials in
// shared memory summed in warp order, one thread per candidate), the scores become
// softmax weights in shared memory (exp and divide one thread per candidate, the total
// in candidate order); pass 2 mixes the raw candidates into y (as scratch) while summing
// m^2; pass 3 scales y.
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

__device__ double warp_sum(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

constexpr int kWarps = kThreads / 32;

// Candidates whose loads are issued together (their sums stay separate, in d order).
constexpr int kCandidateGroup = 8;

__global__ void __launch_bounds__(kThreads) attn_res_norm_kernel(AttnResNormParams p) {
  __shared__ typename BlockSum::TempStorage tmp;
  __shared__ double result;
  __shared__ double partial[kMaxAttnResCandidates][kWarps][2];  // sum v^2, v . query
  __shared__ float score[kMaxAttnResCandidates];
  __shared__ float weight[kMaxAttnResCandidates];  // exp(score - max), then the softmax
  __shared__ double total_s;
  const int n = static_cast<int>(p.num_snapshots) + 1;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * p.dim;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const auto candidate = [&](int i) {
    return i < p.num_snapshots ? p.snapshots + i * p.snapshot_stride + row : p.current + row;
  };
  // Pass 1: s_i = (v_i . query) / sqrt(mean(v_i^2) + res_eps), kCandidateGroup
  // candidates' loads in flight at a time.
  for (int i0 = 0; i0 < n; i0 += kCandidateGroup) {
    const float* v[kCandidateGroup];
#pragma unroll
    for (int u = 0; u < kCandidateGroup; ++u) v[u] = candidate(i0 + u < n ? i0 + u : n - 1);
    double sum_sq[kCandidateGroup] = {}, dot[kCandidateGroup] = {};
    for (int64_t d = threadIdx.x; d < p.dim; d += kThreads) {
      float x[kCandidateGroup];
#pragma unroll
      for (int u = 0; u < kCandidateGroup; ++u) x[u] = __ldg(v[u] + d);
      const float qd = __ldg(p.query + d);
#pragma unroll
      for (int u = 0; u < kCandidateGroup; ++u) {
        sum_sq[u] += static_cast<double>(x[u]) * x[u];
        dot[u] += static_cast<double>(x[u]) * qd;
      }
    }
#pragma unroll
    for (int u = 0; u < kCandidateGroup; ++u) {
      if (i0 + u < n) {
        const double ss = warp_sum(sum_sq[u]);
        const double dt = warp_sum(dot[u]);
        if (lane == 0) {
          partial[i0 + u][warp][0] = ss;
          partial[i0 + u][warp][1] = dt;
        }
      }
    }
  }
  __syncthreads();
  // The scores, one thread per candidate (its warp partials summed in warp order).
  if (threadIdx.x < n) {
    const int i = threadIdx.x;
    double sum_sq = 0.0, dot = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      sum_sq += partial[i][w][0];
      dot += partial[i][w][1];
    }
    score[i] = static_cast<float>(dot / sqrt(sum_sq / p.dim + p.res_eps));
  }
  __syncthreads();
  // Softmax over the candidates in the CPU op's precision: the max and the double total
  // in candidate order, the exponentials and the divisions one thread per candidate.
  if (threadIdx.x < n) {
    float max_score = -INFINITY;
    for (int i = 0; i < n; ++i) max_score = fmaxf(max_score, score[i]);
    weight[threadIdx.x] = expf(score[threadIdx.x] - max_score);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += weight[i];
    total_s = total;
  }
  __syncthreads();
  if (threadIdx.x < n) weight[threadIdx.x] = static_cast<float>(weight[threadIdx.x] / total_s);
  __syncthreads();
  // Pass 2: m = sum_i alpha_i v_i in candidate order, one rounding per step as on the
  // CPU; m goes to y (each thread reads back only its own elements).
  float* y = p.y + row;
  double sum_sq = 0.0;
  for (int64_t d = threadIdx.x; d < p.dim; d += kThreads) {
    float m = 0.0f;
    for (int i0 = 0; i0 < n; i0 += kCandidateGroup) {
      float x[kCandidateGroup];
#pragma unroll
      for (int u = 0; u < kCandidateGroup; ++u)
        x[u] = i0 + u < n ? __ldg(candidate(i0 + u) + d) : 0.0f;
#pragma unroll
      for (int u = 0; u < kCandidateGroup; ++u) {
        if (i0 + u < n) m = __fadd_rn(m, __fmul_rn(weight[i0 + u], x[u]));
      }
    }
    y[d] = m;
    sum_sq += static_cast<double>(m) * m;
  }
  sum_sq = block_sum(sum_sq, tmp, result);
  // Pass 3: y = m / sqrt(mean(m^2) + norm_eps) * norm_weight.
  const float inv_rms = static_cast<float>(1.0 / sqrt(sum_sq / p.dim + p.norm_eps));
  for (int64_t d = threadIdx.x; d < p.dim; d += kThreads)
    y[d] = __fmul_rn(__fmul_rn(y[d], inv_rms), p.norm_weight[d]);
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

void attn_res_norm(const AttnResNormParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0 && p.num_snapshots >= 0, "attn_res_norm: num_tokens ", p.num_tokens,
        ", num_snapshots ", p.num_snapshots);
  CHECK(p.num_snapshots < kMaxAttnResCandidates, "attn_res_norm: num_snapshots ", p.num_snapshots,
        " (the CUDA kernel takes 0..", kMaxAttnResCandidates - 1, ")");
  if (p.num_tokens == 0) return;
  CHECK(p.current != nullptr && p.query != nullptr && p.norm_weight != nullptr && p.y != nullptr &&
            (p.num_snapshots == 0 || p.snapshots != nullptr),
        "attn_res_norm: null pointer");
  check_rows(p.num_tokens, p.dim, p.res_eps, "attn_res_norm");
  CHECK(p.norm_eps >= 0.0f, "attn_res_norm: norm_eps ", p.norm_eps);
  const int64_t n = p.num_tokens * p.dim;
  CHECK(p.num_snapshots == 0 || p.snapshot_stride >= n, "attn_res_norm: snapshot_stride ",
        p.snapshot_stride, " < num_tokens * dim = ", n);
  // y is scratch for the mix while candidates are still read: it must not overlap them.
  const auto overlaps = [&](const float* v) { return p.y < v + n && v < p.y + n; };
  bool aliased = overlaps(p.current);
  for (int64_t i = 0; i < p.num_snapshots; ++i)
    aliased = aliased || overlaps(p.snapshots + i * p.snapshot_stride);
  CHECK(!aliased, "attn_res_norm: y overlaps a candidate");
  attn_res_norm_kernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
