// CUDA attention merge: one block per row, the part weights computed once per row in
// shared memory, the width strided over the threads (each column summed in part order).
#include <cmath>

#include "kernels/attention/merge/check.h"
#include "kernels/attention/merge/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxParts = 64;

__global__ void merge_kernel(AttentionMergeParams p) {
  __shared__ float weight[kMaxParts];
  __shared__ float inv_sum;
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int64_t j = 0; j < p.num_parts; ++j) m = fmaxf(m, p.lses[j * p.rows + r]);
    float sum = 0.0f;
    for (int64_t j = 0; j < p.num_parts; ++j) {
      const float w = m == -INFINITY ? 0.0f : expf(p.lses[j * p.rows + r] - m);
      weight[j] = w;
      sum += w;
    }
    inv_sum = m == -INFINITY ? 0.0f : 1.0f / sum;
    if (p.lse != nullptr) p.lse[r] = m == -INFINITY ? -INFINITY : m + logf(sum);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < p.num_parts; ++j) {
      acc += weight[j] * p.parts[(j * p.rows + r) * p.width + c];
    }
    p.out[r * p.width + c] = acc * inv_sum;
  }
}

}  // namespace

void attention_merge(const AttentionMergeParams& p, cudaStream_t stream) {
  validate(p);
  // CUDA-only limits: the part weights live in a fixed shared array; one block per row.
  CHECK(p.num_parts <= kMaxParts, "attention_merge: num_parts ", p.num_parts, " above ", kMaxParts);
  if (p.rows == 0) return;
  CHECK(p.rows <= 0x7fffffff, "attention_merge: rows ", p.rows, " above 2^31 - 1");
  merge_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hyserve::cuda
