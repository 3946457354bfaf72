// Scalar codecs: exhaustive round trips where the format is small enough.
#include "core/dtype.h"

#include <cmath>

#include <gtest/gtest.h>

namespace hyserve {
namespace {

TEST(DType, E4M3DecodeKnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);          // exp 7, man 0
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);        // largest finite
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
}

TEST(DType, E4M3RoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    const uint8_t back = f32_to_e4m3(v);
    if (v == 0.0f) {
      EXPECT_EQ(e4m3_to_f32(back), 0.0f);
    } else {
      EXPECT_EQ(back, c) << "value " << v;
    }
  }
}

TEST(DType, E4M3RoundsToNearestAndSaturates) {
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(-1000.0f)), -448.0f);
  // 1.0625 is halfway between 1 and 1.125: ties to even (1.0).
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.07f)), 1.125f);
  // Every float in range maps to the nearest code.
  for (float x = -460.0f; x <= 460.0f; x += 0.173f) {
    const float q = e4m3_to_f32(f32_to_e4m3(x));
    float best = 0.0f, best_err = INFINITY;
    for (int c = 0; c < 256; ++c) {
      const float v = e4m3_to_f32(static_cast<uint8_t>(c));
      if (!std::isnan(v) && std::fabs(v - x) < best_err) {
        best_err = std::fabs(v - x);
        best = v;
      }
    }
    EXPECT_EQ(std::fabs(q - x), std::fabs(best - x)) << "x=" << x;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    const float v = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_bf16(v), h);
  }
}

TEST(DType, F16RoundTripsEveryFiniteCode) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float v = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(v)) continue;
    if (v == 0.0f) continue;
    EXPECT_EQ(f32_to_f16(v), h) << "code " << h;
  }
}

TEST(DType, E2M1AndE8M0) {
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(static_cast<uint8_t>(c));
    if (c == 8) continue;  // -0 encodes as 8 or 0
    EXPECT_EQ(f32_to_e2m1(v), c);
  }
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(100.0f)), 6.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.4f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.6f)), 3.0f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, ParsesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kE4M3);
  EXPECT_EQ(parse_dtype("F8_E8M0"), DType::kE8M0);
  EXPECT_FALSE(parse_dtype("F128").has_value());
  EXPECT_EQ(dtype_size(DType::kI64), 8);
}

}  // namespace
}  // namespace hyserve
