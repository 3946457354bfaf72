// WeightFormat::kInt4 on the CPU (the fp32 reference every backend matches): the bytes of
// compressed-tensors' pack-quantized int32 words, decoded as (nibble - 8) * scale, exact.
// The words here are written by hand so the packing convention (value j of a word in
// bits 4j..4j+3, stored q + 8) is pinned independently of any packing helper.
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/weight.h"
#include "util/error.h"

namespace hyserve {
namespace {

// One row of 64 inputs: eight int32 words, two groups of 32.
//   word 0 0x76543210  nibble j = j          q = j - 8: -8 .. -1
//   word 1 0xFEDCBA98  nibble j = j + 8      q = 0 .. 7
//   word 2 0x0F0F0F0F  even j: 15, odd j: 0  q = 7, -8, 7, -8, ...
//   word 3 0xF0F0F0F0  even j: 0, odd j: 15  q = -8, 7, -8, 7, ...
//   word 4 0x88888888  q = 0
//   word 5 0x9A7B6C5D  q = 5, -3, 4, -2, 3, -1, 2, 1 (nibbles D, 5, C, 6, B, 7, A, 9)
//   word 6 0xFFFFFFFF  q = 7
//   word 7 0x00000000  q = -8
const uint32_t kWords[8] = {0x76543210u, 0xFEDCBA98u, 0x0F0F0F0Fu, 0xF0F0F0F0u,
                            0x88888888u, 0x9A7B6C5Du, 0xFFFFFFFFu, 0x00000000u};
const int kQ[64] = {
    -8, -7, -6, -5, -4, -3, -2, -1,  // word 0
    0,  1,  2,  3,  4,  5,  6,  7,   // word 1
    7,  -8, 7,  -8, 7,  -8, 7,  -8,  // word 2
    -8, 7,  -8, 7,  -8, 7,  -8, 7,   // word 3
    0,  0,  0,  0,  0,  0,  0,  0,   // word 4
    5,  -3, 4,  -2, 3,  -1, 2,  1,   // word 5
    7,  7,  7,  7,  7,  7,  7,  7,   // word 6
    -8, -8, -8, -8, -8, -8, -8, -8,  // word 7
};

// Group scales with full bf16 mantissas: q * scale needs up to 11 significant bits, so it
// is exact in fp32 (and in the double the expectation is computed in).
const float kScales[2] = {bf16_to_f32(0x3F81), bf16_to_f32(0xBC7F)};  // 1.0078125, -0.01556...

Weight int4_row(const void* words, const void* scales, DType scales_dtype, int64_t cols = 64) {
  return Weight{.format = WeightFormat::kInt4,
                .dtype = DType::kU8,
                .rows = 1,
                .cols = cols,
                .data = words,
                .scales = scales,
                .scales_dtype = scales_dtype};
}

TEST(Int4Weight, HandPackedWordsDecodeExactlyEveryNibbleAndScaleDtype) {
  static_assert(sizeof(kWords) == 32, "64 nibbles");
  const uint16_t bf16_scales[2] = {f32_to_bf16(kScales[0]), f32_to_bf16(kScales[1])};
  const uint16_t f16_scales[2] = {f32_to_f16(kScales[0]), f32_to_f16(kScales[1])};
  ASSERT_EQ(f16_to_f32(f16_scales[0]), kScales[0]);
  ASSERT_EQ(f16_to_f32(f16_scales[1]), kScales[1]);
  for (const auto& [scales, dtype] : {std::pair<const void*, DType>{bf16_scales, DType::kBF16},
                                      {f16_scales, DType::kF16},
                                      {kScales, DType::kF32}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<float> out(64);
    int4_row(kWords, scales, dtype).dequantize_row(0, out.data());
    for (int k = 0; k < 64; ++k) {
      const double want = static_cast<double>(kQ[k]) * kScales[k / 32];
      EXPECT_EQ(static_cast<double>(out[k]), want) << "element " << k;
    }
  }
}

// Row r starts at byte r * cols / 2 and scale r * cols / 32: two rows, each the other's
// words, decode independently.
TEST(Int4Weight, RowsAndGroupsIndexTheirOwnWordsAndScales) {
  uint32_t words[16];
  std::memcpy(words, kWords + 4, 16);
  std::memcpy(words + 4, kWords, 16);
  std::memcpy(words + 8, kWords, 32);
  const float scales[4] = {0.5f, 2.0f, kScales[0], kScales[1]};
  Weight w = int4_row(words, scales, DType::kF32);
  w.rows = 2;
  std::vector<float> out(64);
  w.dequantize_row(0, out.data());
  for (int k = 0; k < 64; ++k) {
    const int q = kQ[(k + 32) % 64];
    EXPECT_EQ(out[k], static_cast<float>(q) * (k < 32 ? 0.5f : 2.0f)) << "row 0 element " << k;
  }
  w.dequantize_row(1, out.data());
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(static_cast<double>(out[k]), static_cast<double>(kQ[k]) * kScales[k / 32])
        << "row 1 element " << k;
  }
  EXPECT_EQ(w.storage_bytes(), 2 * 32 + 4 * 4);
  w.scales_dtype = DType::kBF16;
  EXPECT_EQ(w.storage_bytes(), 2 * 32 + 4 * 2);
}

TEST(Int4Weight, RejectsBadLayouts) {
  const uint16_t scales[2] = {0x3F80, 0x3F80};
  float out[64];
  EXPECT_THROW(int4_row(kWords, scales, DType::kBF16, /*cols=*/48).dequantize_row(0, out),
               InvalidArgument);
  EXPECT_THROW(int4_row(kWords, nullptr, DType::kBF16).dequantize_row(0, out), InvalidArgument);
  EXPECT_THROW(int4_row(kWords, scales, DType::kE8M0).dequantize_row(0, out), InvalidArgument);
  Weight i32 = int4_row(kWords, scales, DType::kBF16);
  i32.dtype = DType::kI32;
  EXPECT_THROW(i32.dequantize_row(0, out), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
