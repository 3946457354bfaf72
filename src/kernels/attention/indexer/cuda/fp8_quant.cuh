// Device side of the ue8m0 FP8 quantization (cpu.cpp quantize_fp8_ue8m0), shared by the
// indexer's quantize kernel and its scorers: the same fp32 operations in the same order
// (frexp/ldexp/rint, one division by a power of two), so codes and scales are bitwise
// equal to the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/dtype.cuh"
#include "kernels/attention/indexer/params.h"

namespace hyserve::cuda::indexer {

constexpr float kMinAmax = 1e-4f;

// cpu.cpp pow2_ceil: 2^ceil(log2(v)) for v > 0, exactly.
__device__ __forceinline__ float pow2_ceil(float v) {
  int exponent = 0;
  const float mantissa = frexpf(v, &exponent);
  return ldexpf(1.0f, mantissa == 0.5f ? exponent - 1 : exponent);
}

// std::clamp(v, -448, 448), NaN passing through as on the CPU.
__device__ __forceinline__ float clamp_e4m3(float v) {
  return v < -kE4m3Max ? -kE4m3Max : (kE4m3Max < v ? kE4m3Max : v);
}

// std::max(a, b) = a < b ? b : a (keeps a when b is NaN).
__device__ __forceinline__ float max_like_std(float a, float b) {
  return a < b ? b : a;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = max_like_std(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float ue8m0_scale(float amax) {
  return pow2_ceil(max_like_std(amax, kMinAmax) / kE4m3Max);
}

// Four values' e4m3 codes at `scale` (a ue8m0 scale of their row), the first in the low byte.
__device__ __forceinline__ uint32_t quantize4(float4 x, float scale) {
  return uint32_t{f32_to_e4m3(clamp_e4m3(x.x / scale))} |
         uint32_t{f32_to_e4m3(clamp_e4m3(x.y / scale))} << 8 |
         uint32_t{f32_to_e4m3(clamp_e4m3(x.z / scale))} << 16 |
         uint32_t{f32_to_e4m3(clamp_e4m3(x.w / scale))} << 24;
}

}  // namespace hyserve::cuda::indexer
