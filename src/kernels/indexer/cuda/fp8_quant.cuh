// Device side of the ue8m0 FP8 quantization (cpu.cpp quantize_fp8_ue8m0), shared by the
// indexer's quantize kernel and its scorers: the same fp32 operations in the same order
// (frexp/ldexp/rint, one division by a power of two), so codes and scales are bitwise
// equal to the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/indexer/params.h"

namespace hyserve::cuda::indexer {

constexpr float kMinAmax = 1e-4f;

// cpu.cpp pow2_ceil: 2^ceil(log2(v)) for v > 0, exactly.
__device__ __forceinline__ float pow2_ceil(float v) {
  int exponent = 0;
  const float mantissa = frexpf(v, &exponent);
  return ldexpf(1.0f, mantissa == 0.5f ? exponent - 1 : exponent);
}

// core/dtype.cpp f32_to_e4m3: round half to even on the e4m3 grid, saturating to 448.
__device__ __forceinline__ uint8_t f32_to_e4m3(float f) {
  if (isnan(f)) return 0x7f;
  const uint8_t sign = signbit(f) ? 0x80 : 0;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7e;
  int exp;
  frexpf(a, &exp);
  int e = exp - 1;
  if (e < -6) e = -6;
  const float step = ldexpf(1.0f, e - 3);
  const float q = rintf(a / step) * step;
  if (q == 0.0f) return sign;
  int qexp;
  frexpf(q, &qexp);
  const int qe = qexp - 1;
  if (qe < -6) return sign | static_cast<uint8_t>(static_cast<int>(q / ldexpf(1.0f, -9)));
  if (q >= 448.0f) return sign | 0x7e;
  const int man = static_cast<int>(ldexpf(q, -qe) * 8.0f) - 8;
  return sign | static_cast<uint8_t>(((qe + 7) << 3) | man);
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

}  // namespace hyserve::cuda::indexer
