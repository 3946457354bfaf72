// Device versions of the scalar codecs of core/dtype.h, bit-exact with them: the bf16,
// e4m3 (FP8), e2m1 (FP4) and e8m0 (power-of-two scale) decoders and the e4m3 encoder.
// Shared by every kernel that reads stored weights or reads or writes quantized caches;
// the GPU linear, MLA, indexer and latent tests compare them with the CPU codecs.
#pragma once

#include <cstdint>

namespace hyserve::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) {
  return __uint_as_float(h << 16);
}

// e4m3 -> fp32, exact: the 7 magnitude bits placed at the top of an fp32 exponent /
// mantissa and rescaled by 2^(127-7) (also right for subnormals); S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_f32(uint32_t v) {
  const uint32_t mag = v & 0x7fu;
  const float r =
      mag == 0x7fu ? __uint_as_float(0x7fc00000u) : __uint_as_float(mag << 20) * 0x1p120f;
  return (v & 0x80u) ? -r : r;
}

// e2m1 -> fp32, exact: {0, .5, 1, 1.5, 2, 3, 4, 6} by the same trick with 2^(127-1).
__device__ __forceinline__ float e2m1_to_f32(uint32_t nibble) {
  const float r = __uint_as_float((nibble & 0x7u) << 22) * 0x1p126f;
  return (nibble & 0x8u) ? -r : r;
}

// e8m0 -> fp32: 2^(v-127); 0 is 2^-127 (subnormal), 0xff is NaN.
__device__ __forceinline__ float e8m0_to_f32(uint32_t v) {
  if (v == 0xffu) return __uint_as_float(0x7fc00000u);
  if (v == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(v << 23);
}

// core/dtype.cpp f32_to_e4m3, step for step: round half to even on the e4m3 grid,
// saturating to 448, NaN -> 0x7f.
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

}  // namespace hyserve::cuda
