// CUDA KDA ops around the recurrence (cuda.h): the short conv, the gate (softplus or
// bounded sigmoid form, params.h), the l2norm and the gated output RMSNorm. The conv
// runs one thread per channel through the tokens, as the CPU does; the norms run one
// warp per row.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/kda/check.h"
#include "kernels/kda/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr float kSoftplusThreshold = 20.0f;
constexpr float kL2NormEps = 1e-6f;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  CHECK(blocks < (int64_t{1} << 31), "too many rows or elements: ", n);
  return static_cast<unsigned>(blocks);
}

__global__ void short_conv_kernel(ShortConvParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.channels) return;
  const int64_t num_channels = p.channels;
  const int64_t width = p.kernel_size;
  const int64_t num_state = width - 1;
  const float* w = p.weight + c * width;
  float* state = p.conv_state == nullptr ? nullptr : p.conv_state + c;
  auto input = [&](int64_t src) {
    return src < 0 ? state[(num_state + src) * num_channels] : p.x[src * num_channels + c];
  };
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    float acc = 0.0f;
    for (int64_t i = 0; i < width; ++i) acc += w[i] * input(t - num_state + i);
    p.y[t * num_channels + c] = acc * sigmoid(acc);
  }
  // Ascending r reads rows not yet rewritten (source row T + r >= r), as on the CPU.
  for (int64_t r = 0; r < num_state; ++r) {
    state[r * num_channels] = input(p.num_tokens - num_state + r);
  }
}

__global__ void gate_kernel(KdaGateParams p) {
  const int64_t width = p.num_heads * p.head_dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.num_tokens * width) return;
  const int64_t col = i % width;
  const float x = p.f[i] + p.dt_bias[col];
  if (p.lower_bound < 0.0f) {  // bounded: lower_bound * sigmoid(exp(a_log) * x)
    p.g[i] = p.lower_bound / (1.0f + expf(-expf(p.a_log[col / p.head_dim]) * x));
    return;
  }
  const float rate = -expf(p.a_log[col / p.head_dim]);
  p.g[i] = rate * (x > kSoftplusThreshold ? x : log1pf(expf(x)));
}

__global__ void l2norm_kernel(float* x, int64_t rows, int64_t dim, float scale) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float* row = x + r * dim;
  float sum_sq = 0.0f;
  for (int64_t d = lane; d < dim; d += 32) sum_sq += row[d] * row[d];
  const float factor = scale / sqrtf(warp_sum(sum_sq) + kL2NormEps);
  for (int64_t d = lane; d < dim; d += 32) row[d] *= factor;
}

__global__ void gated_rms_norm_kernel(GatedRmsNormParams p) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= p.num_tokens * p.num_heads) return;
  const int64_t dim = p.head_dim;
  const float* o = p.o + r * dim;
  const float* gate = p.gate + r * dim;
  float* y = p.y + r * dim;
  float sum_sq = 0.0f;
  for (int64_t e = lane; e < dim; e += 32) sum_sq += o[e] * o[e];
  const float inv_rms = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(dim) + p.eps);
  for (int64_t e = lane; e < dim; e += 32) {
    y[e] = o[e] * inv_rms * p.weight[e] * sigmoid(gate[e]);
  }
}

}  // namespace

void short_conv_silu(const ShortConvParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0, "short_conv_silu: num_tokens = ", p.num_tokens);
  CHECK(p.channels > 0, "short_conv_silu: channels = ", p.channels);
  CHECK(p.kernel_size > 0, "short_conv_silu: kernel_size = ", p.kernel_size);
  CHECK(p.kernel_size == 1 || p.conv_state != nullptr, "short_conv_silu: null conv_state");
  if (p.num_tokens == 0) return;
  CHECK(p.x != nullptr && p.weight != nullptr && p.y != nullptr,
        "short_conv_silu: null x, weight or y");
  CHECK(p.x != p.y, "short_conv_silu: y must not alias x");
  short_conv_kernel<<<blocks_for(p.channels, kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void kda_gate(const KdaGateParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0, "kda_gate: num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, "kda_gate: num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, "kda_gate: head_dim = ", p.head_dim);
  if (p.num_tokens == 0) return;
  CHECK(p.f != nullptr && p.dt_bias != nullptr && p.a_log != nullptr && p.g != nullptr,
        "kda_gate: null f, dt_bias, a_log or g");
  CHECK(p.lower_bound <= 0.0f && std::isfinite(p.lower_bound),
        "kda_gate: lower_bound = ", p.lower_bound,
        " (0: the softplus gate; < 0: the bounded gate)");
  const int64_t n = p.num_tokens * p.num_heads * p.head_dim;
  gate_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void l2norm_rows(float* x, int64_t rows, int64_t dim, float scale, cudaStream_t stream) {
  CHECK(rows >= 0, "l2norm_rows: rows = ", rows);
  CHECK(dim > 0, "l2norm_rows: dim = ", dim);
  if (rows == 0) return;
  CHECK(x != nullptr, "l2norm_rows: null x");
  l2norm_kernel<<<blocks_for(rows, kWarpsPerBlock), kThreads, 0, stream>>>(x, rows, dim, scale);
  CUDA_CHECK_LAUNCH();
}

void gated_rms_norm(const GatedRmsNormParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0, "gated_rms_norm: num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, "gated_rms_norm: num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, "gated_rms_norm: head_dim = ", p.head_dim);
  CHECK(p.eps >= 0.0f, "gated_rms_norm: eps = ", p.eps);
  if (p.num_tokens == 0) return;
  CHECK(p.o != nullptr && p.weight != nullptr && p.gate != nullptr && p.y != nullptr,
        "gated_rms_norm: null o, weight, gate or y");
  gated_rms_norm_kernel<<<blocks_for(p.num_tokens * p.num_heads, kWarpsPerBlock), kThreads, 0,
                          stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
