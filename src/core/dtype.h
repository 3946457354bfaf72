// Element types and the scalar codecs between them and fp32.
//
// Storage formats (MODEL.md §5, §6):
//   bf16, fp16, fp32      plain IEEE-style floats
//   e4m3 (FP8)            1-4-3, bias 7, no infinities, max 448, S.1111.111 is NaN
//   e8m0 (UE8M0)          an unsigned power-of-two exponent: 2^(x-127), 0xFF is NaN
//   e2m1 (FP4)            1-2-1, values {0, .5, 1, 1.5, 2, 3, 4, 6} and negatives;
//                         packed two per byte, element 2i in the low nibble
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace hyserve {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kE4M3,  // safetensors "F8_E4M3"
  kE8M0,  // safetensors "F8_E8M0"
  kU8,
  kI8,
  kI32,
  kI64,
  kBool,
};

// Bytes per element.
int dtype_size(DType t);
// Safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view name);
// True for types that hold real numbers convertible with to_f32().
bool is_float(DType t);

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) {
  return bits_to_f32(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds an fp32 value through bf16 (what storing an activation in bf16 does).
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

float e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448; NaN maps to NaN (0x7f).
uint8_t f32_to_e4m3(float f);

inline float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return bits_to_f32(0x7fc00000u);
  if (v == 0) return bits_to_f32(0x00400000u);  // 2^-127, a subnormal
  return bits_to_f32(static_cast<uint32_t>(v) << 23);
}

// The 16 values of e2m1 indexed by the 4-bit code.
extern const float kE2M1Values[16];
inline float e2m1_to_f32(uint8_t nibble) {
  return kE2M1Values[nibble & 0xf];
}
// Round to nearest (ties to even code), saturating to +-6.
uint8_t f32_to_e2m1(float f);

// Reads element i of a buffer of type t as fp32. For kU8/kI8/kI32/kI64/kBool
// returns the integer value; for kE8M0 the power of two.
float load_as_f32(const void* data, DType t, int64_t i);

// Converts n elements of type t to fp32 (float types only).
void convert_to_f32(const void* src, DType t, float* dst, int64_t n);

}  // namespace hyserve
