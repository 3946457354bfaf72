#include "core/dtype.h"

#include <array>
#include <cmath>

#include "util/error.h"

namespace hyserve {

int dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kE4M3:
      return 1;
    case DType::kE8M0:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kE4M3:
      return "F8_E4M3";
    case DType::kE8M0:
      return "F8_E8M0";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE8M0, DType::kU8,
                  DType::kI8, DType::kI32, DType::kI64, DType::kBool}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kE4M3;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal: multiples of 2^-24, round half to even.
    const float q = std::nearbyint(a * std::ldexp(1.0f, 24));
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t v = u & 0x7fffffffu;
  v += 0xfffu + ((v >> 13) & 1u);
  const uint32_t exp = (v >> 23) - 112;
  return sign | static_cast<uint16_t>((exp << 10) | ((v >> 13) & 0x3ff));
}

namespace {

float e4m3_to_f32_from_bits(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float r;
  if (exp == 0xf && man == 0x7) {
    r = bits_to_f32(0x7fc00000u);
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(man), -9);  // man/8 * 2^-6
  } else {
    r = std::ldexp(1.0f + man / 8.0f, exp - 7);
  }
  return neg ? -r : r;
}

}  // namespace

// Every code's value, decoded once (a function-local table: no static initialization order to
// depend on): the FP8 caches and weights decode millions of codes per step on the CPU, and an
// ldexp per code was a fifth of a decode step.
float e4m3_to_f32(uint8_t v) {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32_from_bits(static_cast<uint8_t>(c));
    return t;
  }();
  return values[v];
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to 448
  // Smallest normal is 2^-6; below it the step is 2^-9.
  int exp;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1)
  int e = exp - 1;      // a = 1.x * 2^e
  if (e < -6) e = -6;
  const float step = std::ldexp(1.0f, e - 3);
  const float q = std::nearbyint(a / step) * step;  // round half to even on the grid
  if (q == 0.0f) return sign;
  int qexp;
  std::frexp(q, &qexp);
  int qe = qexp - 1;
  if (qe < -6) {
    const int man = static_cast<int>(q / std::ldexp(1.0f, -9));
    return sign | static_cast<uint8_t>(man);
  }
  if (q >= 448.0f) return sign | 0x7e;
  const int man = static_cast<int>(std::ldexp(q, -qe) * 8.0f) - 8;
  return sign | static_cast<uint8_t>(((qe + 7) << 3) | man);
}

const float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t f32_to_e2m1(float f) {
  if (std::isnan(f)) return 0x7;
  const uint8_t sign = std::signbit(f) ? 0x8 : 0;
  const float a = std::fabs(f);
  // Midpoints between the representable magnitudes; ties go to the even code.
  static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 7;
  for (uint8_t i = 0; i < 7; ++i) {
    if (a < kMid[i] || (a == kMid[i] && (i % 2 == 0))) {
      code = i;
      break;
    }
  }
  return sign | code;
}

float load_as_f32(const void* data, DType t, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, b + 4 * i, 4);
      return v;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kE4M3:
      return e4m3_to_f32(b[i]);
    case DType::kE8M0:
      return e8m0_to_f32(b[i]);
    case DType::kU8:
      return static_cast<float>(b[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<int8_t>(b[i]));
    case DType::kBool:
      return b[i] ? 1.0f : 0.0f;
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, b + 4 * i, 4);
      return static_cast<float>(v);
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, b + 8 * i, 8);
      return static_cast<float>(v);
    }
  }
  return 0.0f;
}

void convert_to_f32(const void* src, DType t, float* dst, int64_t n) {
  CHECK(is_float(t), "convert_to_f32: not a float dtype: ", dtype_name(t));
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  const auto* b = static_cast<const uint8_t*>(src);
  if (t == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      dst[i] = bf16_to_f32(h);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, i);
}

}  // namespace hyserve
