// fp32 values as bf16 terms that sum to them: what lets a bf16 tensor-core product keep an
// fp32 activation (each bf16 x bf16 product is exact in fp32). Used by the MoE decode
// kernels (moe_decode.cuh) and the router's tensor-core logits (router.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace hyserve::cuda::moe_internal {

// v as kTerms bf16 bit patterns summing to v (exactly for kTerms = 3 and normal v; a
// non-finite v is its first term, the others 0).
template <int kTerms>
__device__ __forceinline__ void split_terms(float v, uint16_t (&out)[kTerms]) {
#pragma unroll
  for (int i = 0; i < kTerms; ++i) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    out[i] = __bfloat16_as_ushort(b);
    const float bv = __bfloat162float(b);
    v = isfinite(bv) ? v - bv : 0.0f;
  }
}

}  // namespace hyserve::cuda::moe_internal
