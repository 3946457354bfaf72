// CUDA KDA delta-rule recurrence, token by token (cuda.h kda_recurrent; the chunked
// prefill is in kda_chunked.cu). The grid is heads x V-slices of kSlice columns: column e
// of S only needs k, q, g, beta and v[e], so a block owns S[:, slice] in shared memory for
// the whole call.
#include <cuda_runtime.h>

#include "kernels/kda/cuda.h"
#include "kernels/kda/cuda/check_params.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kSlice = 32;  // V columns per block

struct HeadIndex {
  int64_t num_heads, dim, h;
  __device__ int64_t row(int64_t t) const { return (t * num_heads + h) * dim; }
};

// One warp: lane = column of the slice. q, k, exp(g) of the token are staged in shared.
__global__ void recurrent_kernel(KdaParams p) {
  extern __shared__ float smem[];
  const int64_t dk = p.head_dim;
  const int64_t dv = p.head_dim;
  const HeadIndex hi{p.num_heads, p.head_dim, blockIdx.x};
  const int lane = threadIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kSlice + lane;
  float* s_col = smem;               // [K, kSlice]
  float* q_s = s_col + dk * kSlice;  // [K]
  float* k_s = q_s + dk;             // [K]
  float* decay_s = k_s + dk;         // [K]
  float* state = p.state + blockIdx.x * dk * dv;
  const bool active = e < dv;
  if (active) {
    for (int64_t d = 0; d < dk; ++d) s_col[d * kSlice + lane] = state[d * dv + e];
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t row = hi.row(t);
    for (int64_t d = lane; d < dk; d += kSlice) {
      q_s[d] = p.q[row + d];
      k_s[d] = p.k[row + d];
      decay_s[d] = expf(p.g[row + d]);
    }
    __syncwarp();
    if (active) {
      float kv = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = s_col[d * kSlice + lane] * decay_s[d];
        s_col[d * kSlice + lane] = s;
        kv += k_s[d] * s;
      }
      kv = p.beta[t * p.num_heads + blockIdx.x] * (p.v[row + e] - kv);
      float o = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = s_col[d * kSlice + lane] + k_s[d] * kv;
        s_col[d * kSlice + lane] = s;
        o += q_s[d] * s;
      }
      p.o[row + e] = o;
    }
    __syncwarp();
  }
  if (active) {
    for (int64_t d = 0; d < dk; ++d) state[d * dv + e] = s_col[d * kSlice + lane];
  }
}

dim3 head_slice_grid(const KdaParams& p) {
  return dim3(static_cast<unsigned>(p.num_heads),
              static_cast<unsigned>((p.head_dim + kSlice - 1) / kSlice));
}

}  // namespace

void kda_recurrent(const KdaParams& p, cudaStream_t stream) {
  check_cuda_kda_params(p, "kda_recurrent");
  if (p.num_tokens == 0) return;
  const size_t smem = sizeof(float) * (p.head_dim * kSlice + 3 * p.head_dim);
  recurrent_kernel<<<head_slice_grid(p), kSlice, smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
