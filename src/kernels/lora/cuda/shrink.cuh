// The LoRA shrink both CUDA LoRA paths share (lora.cu's per-token op, moe_lora.cuh's routed
// experts): u[r] = A[r] . x for r < rank, one warp per rank entry (lane-strided fma sums, a
// butterfly), kWarps warps of the block striding over the rank. A fixed order per vector, so
// a token's bits never depend on its batch.
#pragma once

#include <cstdint>

#include "kernels/lora/params.h"

namespace hyserve::cuda {

template <int kWarps>
__device__ __forceinline__ void lora_shrink(const LoraMatrices& m, const float* __restrict__ x,
                                            int64_t in, float* __restrict__ u) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int64_t r = warp; r < m.rank; r += kWarps) {
    const float* a = m.a + r * in;
    float acc = 0.0f;
    for (int64_t i = lane; i < in; i += 32) acc = fmaf(x[i], a[i], acc);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) u[r] = acc;
  }
}

}  // namespace hyserve::cuda
