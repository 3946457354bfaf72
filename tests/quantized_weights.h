// Host weights in every storage format, built by quantizing random values (FP8: one
// scale per 128x128 block, amax / 448; MXFP4: one power of two per 32 values, the
// smallest with amax / scale <= 6; INT4: one bf16 scale per 32 values, bf16(amax / 7),
// q = clamp(round(v / scale), -8, 7)). Shared by the CPU and GPU op tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/weight.h"
#include "kernels/mlp/params.h"

namespace hyserve::test {

enum class Format { kF32, kBF16, kF16, kFp8F32Scales, kFp8Bf16Scales, kMxfp4, kInt4 };

inline constexpr Format kAllFormats[] = {
    Format::kF32,           Format::kBF16,  Format::kF16, Format::kFp8F32Scales,
    Format::kFp8Bf16Scales, Format::kMxfp4, Format::kInt4};

// n values drawn from N(0, stddev^2).
inline std::vector<float> random_vector(int64_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Formats that group 32 inputs per scale: their matrices need cols % 32 == 0.
inline bool needs_cols_of_32(Format f) {
  return f == Format::kMxfp4 || f == Format::kInt4;
}

inline std::string format_name(Format f) {
  switch (f) {
    case Format::kF32:
      return "F32";
    case Format::kBF16:
      return "BF16";
    case Format::kF16:
      return "F16";
    case Format::kFp8F32Scales:
      return "FP8/F32 scales";
    case Format::kFp8Bf16Scales:
      return "FP8/BF16 scales";
    case Format::kMxfp4:
      return "MXFP4";
    case Format::kInt4:
      return "INT4";
  }
  return "?";
}

// Owns the bytes its Weight points into. Move only: a copy would leave w dangling.
struct HostWeight {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
  Weight w;
  HostWeight() = default;
  HostWeight(HostWeight&&) = default;
  HostWeight& operator=(HostWeight&&) = default;
  HostWeight(const HostWeight&) = delete;
};

template <typename T>
void append_bytes(std::vector<uint8_t>& bytes, T v) {
  const size_t at = bytes.size();
  bytes.resize(at + sizeof(T));
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

inline HostWeight quantize(const std::vector<float>& v, int64_t rows, int64_t cols, Format f) {
  HostWeight t;
  t.w.rows = rows;
  t.w.cols = cols;
  switch (f) {
    case Format::kF32:
    case Format::kBF16:
    case Format::kF16:
      for (float x : v) {
        if (f == Format::kF32) append_bytes(t.data, x);
        if (f == Format::kBF16) append_bytes(t.data, f32_to_bf16(x));
        if (f == Format::kF16) append_bytes(t.data, f32_to_f16(x));
      }
      t.w.dtype = f == Format::kF32 ? DType::kF32 : f == Format::kBF16 ? DType::kBF16 : DType::kF16;
      break;
    case Format::kFp8F32Scales:
    case Format::kFp8Bf16Scales: {
      const int64_t grid_rows = (rows + 127) / 128, grid_cols = (cols + 127) / 128;
      std::vector<float> scale(grid_rows * grid_cols, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float& s = scale[(r / 128) * grid_cols + c / 128];
          s = std::max(s, std::fabs(v[r * cols + c]));
        }
      }
      for (float& s : scale) {
        s = s > 0.0f ? s / 448.0f : 1.0f;
        if (f == Format::kFp8Bf16Scales) {
          s = round_bf16(s);
          append_bytes(t.scales, f32_to_bf16(s));
        } else {
          append_bytes(t.scales, s);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          t.data.push_back(f32_to_e4m3(v[r * cols + c] / scale[(r / 128) * grid_cols + c / 128]));
        }
      }
      t.w.format = WeightFormat::kFp8Block;
      t.w.dtype = DType::kE4M3;
      t.w.scales_dtype = f == Format::kFp8Bf16Scales ? DType::kBF16 : DType::kF32;
      break;
    }
    case Format::kMxfp4: {
      t.data.assign(rows * cols / 2, 0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / 32; ++b) {
          float amax = 0.0f;
          for (int64_t c = b * 32; c < (b + 1) * 32; ++c) {
            amax = std::max(amax, std::fabs(v[r * cols + c]));
          }
          const int e = amax > 0.0f ? static_cast<int>(std::ceil(std::log2(amax / 6.0f))) : 0;
          t.scales.push_back(static_cast<uint8_t>(e + 127));
          for (int64_t c = b * 32; c < (b + 1) * 32; ++c) {
            const uint8_t code = f32_to_e2m1(std::ldexp(v[r * cols + c], -e));
            t.data[(r * cols + c) / 2] |= c % 2 == 0 ? code : static_cast<uint8_t>(code << 4);
          }
        }
      }
      t.w.format = WeightFormat::kMxfp4;
      t.w.dtype = DType::kU8;
      t.w.scales_dtype = DType::kE8M0;
      break;
    }
    case Format::kInt4: {
      t.data.assign(rows * cols / 2, 0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < cols / 32; ++g) {
          float amax = 0.0f;
          for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
            amax = std::max(amax, std::fabs(v[r * cols + c]));
          }
          const float scale = amax > 0.0f ? round_bf16(amax / 7.0f) : 1.0f;
          append_bytes(t.scales, f32_to_bf16(scale));
          for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
            const int q = std::clamp(static_cast<int>(std::lround(v[r * cols + c] / scale)), -8, 7);
            const auto code = static_cast<uint8_t>(q + 8);
            t.data[(r * cols + c) / 2] |= c % 2 == 0 ? code : static_cast<uint8_t>(code << 4);
          }
        }
      }
      t.w.format = WeightFormat::kInt4;
      t.w.dtype = DType::kU8;
      t.w.scales_dtype = DType::kBF16;
      break;
    }
  }
  t.w.data = t.data.data();
  t.w.scales = t.scales.empty() ? nullptr : t.scales.data();
  return t;
}

inline HostWeight random_weight(int64_t rows, int64_t cols, Format f, uint64_t seed,
                                float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = dist(rng);
  return quantize(v, rows, cols, f);
}

// The weight as the CPU decodes it, [rows, cols] fp32.
inline std::vector<float> decode(const Weight& w) {
  std::vector<float> out(w.rows * w.cols);
  for (int64_t r = 0; r < w.rows; ++r) w.dequantize_row(r, out.data() + r * w.cols);
  return out;
}

// A gated MLP's three host matrices: gate / up ~ N(0, 1/hidden), down ~ N(0, 1/inter).
struct HostMlp {
  HostWeight gate, up, down;
  MlpWeights w;
};

inline HostMlp random_mlp(int64_t hidden, int64_t inter, Format f, uint64_t seed) {
  HostMlp m;
  m.gate = random_weight(inter, hidden, f, seed, 1.0f / std::sqrt(static_cast<float>(hidden)));
  m.up = random_weight(inter, hidden, f, seed + 1, 1.0f / std::sqrt(static_cast<float>(hidden)));
  m.down = random_weight(hidden, inter, f, seed + 2, 1.0f / std::sqrt(static_cast<float>(inter)));
  m.w = MlpWeights{m.gate.w, m.up.w, m.down.w};
  return m;
}

}  // namespace hyserve::test
