// Weight::dequantize_row for dense, FP8-block and MXFP4 storage, against a decode
// written here from the layout in weight.h, on random codes (every non-NaN code
// occurs) and on hand-made bytes with known values.
#include "core/weight.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Random e4m3 bytes, NaN codes (S.1111.111) replaced by zero.
std::vector<uint8_t> random_e4m3(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    b = static_cast<uint8_t>(rng() & 0xff);
    if ((b & 0x7f) == 0x7f) b = 0;
  }
  return v;
}

std::vector<uint8_t> to_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Weight, DenseRowsDecodeEachDtype) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t rows : {1, 3, 65}) {
    for (int64_t cols : {1, 3, 63, 65}) {
      std::vector<float> f32(rows * cols);
      std::vector<uint16_t> bf16(rows * cols), f16(rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i) {
        f32[i] = dist(rng);
        bf16[i] = f32_to_bf16(f32[i]);
        f16[i] = f32_to_f16(f32[i]);
      }
      const Weight wf{.dtype = DType::kF32, .rows = rows, .cols = cols, .data = f32.data()};
      const Weight wb{.dtype = DType::kBF16, .rows = rows, .cols = cols, .data = bf16.data()};
      const Weight wh{.dtype = DType::kF16, .rows = rows, .cols = cols, .data = f16.data()};
      EXPECT_EQ(wf.storage_bytes(), rows * cols * 4);
      EXPECT_EQ(wb.storage_bytes(), rows * cols * 2);
      std::vector<float> out(cols);
      for (int64_t r = 0; r < rows; ++r) {
        wf.dequantize_row(r, out.data());
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(out[c], f32[r * cols + c]) << r << "," << c;
        wb.dequantize_row(r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(out[c], bf16_to_f32(bf16[r * cols + c])) << r << "," << c;
        }
        wh.dequantize_row(r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(out[c], f16_to_f32(f16[r * cols + c])) << r << "," << c;
        }
      }
    }
  }
}

TEST(Weight, Fp8BlockRowsMatchIndependentDecode) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> scale_dist(0.001f, 4.0f);
  for (DType scales_dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {1, 3, 65, 130, 257}) {
      for (int64_t cols : {1, 63, 128, 200, 300}) {
        const auto data = random_e4m3(rows * cols, rng);
        const int64_t grid_rows = ceil_div(rows, 128), grid_cols = ceil_div(cols, 128);
        std::vector<float> scale(grid_rows * grid_cols);
        std::vector<uint8_t> scale_bytes;
        if (scales_dtype == DType::kF32) {
          for (auto& s : scale) s = scale_dist(rng);
          scale_bytes = to_bytes(scale);
        } else {
          std::vector<uint16_t> bf(scale.size());
          for (size_t i = 0; i < scale.size(); ++i) {
            bf[i] = f32_to_bf16(scale_dist(rng));
            scale[i] = bf16_to_f32(bf[i]);
          }
          scale_bytes.resize(bf.size() * 2);
          std::memcpy(scale_bytes.data(), bf.data(), scale_bytes.size());
        }
        const Weight w{.format = WeightFormat::kFp8Block,
                       .dtype = DType::kE4M3,
                       .rows = rows,
                       .cols = cols,
                       .data = data.data(),
                       .scales = scale_bytes.data(),
                       .scales_dtype = scales_dtype};
        EXPECT_EQ(w.storage_bytes(),
                  rows * cols + grid_rows * grid_cols * dtype_size(scales_dtype));
        std::vector<float> out(cols);
        for (int64_t r = 0; r < rows; ++r) {
          w.dequantize_row(r, out.data());
          for (int64_t c = 0; c < cols; ++c) {
            const float want =
                e4m3_to_f32(data[r * cols + c]) * scale[(r / 128) * grid_cols + c / 128];
            ASSERT_EQ(out[c], want)
                << "rows " << rows << " cols " << cols << " at " << r << "," << c;
          }
        }
      }
    }
  }
}

TEST(Weight, Fp8BlockKnownValues) {
  // Row 0: 1.0, -1.0; row 1: 2.0, 0.0 (e4m3 0x38, 0xb8, 0x40, 0x00), scale 0.5.
  const uint8_t data[4] = {0x38, 0xb8, 0x40, 0x00};
  const float scale = 0.5f;
  const Weight w{.format = WeightFormat::kFp8Block,
                 .dtype = DType::kE4M3,
                 .rows = 2,
                 .cols = 2,
                 .data = data,
                 .scales = &scale};
  float out[2];
  w.dequantize_row(0, out);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -0.5f);
  w.dequantize_row(1, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(Weight, Mxfp4RowsMatchIndependentDecode) {
  std::mt19937 rng(3);
  for (int64_t rows : {1, 3, 63, 65}) {
    for (int64_t cols : {32, 64, 96}) {
      std::vector<uint8_t> data(rows * cols / 2), scales(rows * cols / 32);
      for (auto& b : data) b = static_cast<uint8_t>(rng() & 0xff);
      for (auto& s : scales) s = static_cast<uint8_t>(100 + rng() % 50);  // 2^-27 .. 2^22
      const Weight w{.format = WeightFormat::kMxfp4,
                     .dtype = DType::kU8,
                     .rows = rows,
                     .cols = cols,
                     .data = data.data(),
                     .scales = scales.data(),
                     .scales_dtype = DType::kE8M0};
      EXPECT_EQ(w.storage_bytes(), rows * cols / 2 + rows * cols / 32);
      std::vector<float> out(cols);
      for (int64_t r = 0; r < rows; ++r) {
        w.dequantize_row(r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t byte = data[r * (cols / 2) + c / 2];
          const uint8_t code = c % 2 == 0 ? (byte & 0xf) : (byte >> 4);
          const float want = std::ldexp(kE2M1Values[code], scales[r * (cols / 32) + c / 32] - 127);
          ASSERT_EQ(out[c], want) << "cols " << cols << " at " << r << "," << c;
        }
      }
    }
  }
}

TEST(Weight, Mxfp4KnownValues) {
  // Element 0 is the low nibble (code 1 = 0.5), element 1 the high nibble (code 0xA = -1.0);
  // the first 32 elements scale by 2^(128-127) = 2, the next 32 by 2^(125-127) = 1/4.
  std::vector<uint8_t> data(32, 0);
  data[0] = 0xA1;
  data[16] = 0x07;  // element 32: code 7 = 6.0
  const uint8_t scales[2] = {128, 125};
  const Weight w{.format = WeightFormat::kMxfp4,
                 .dtype = DType::kU8,
                 .rows = 1,
                 .cols = 64,
                 .data = data.data(),
                 .scales = scales,
                 .scales_dtype = DType::kE8M0};
  std::vector<float> out(64);
  w.dequantize_row(0, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[32], 1.5f);
  EXPECT_EQ(out[33], 0.0f);
}

TEST(Weight, RejectsBadRowsAndLayouts) {
  const float data[6] = {};
  float out[3];
  const Weight w{.dtype = DType::kF32, .rows = 2, .cols = 3, .data = data};
  EXPECT_THROW(w.dequantize_row(2, out), InvalidArgument);
  EXPECT_THROW(w.dequantize_row(-1, out), InvalidArgument);
  const Weight no_scales{
      .format = WeightFormat::kFp8Block, .dtype = DType::kE4M3, .rows = 2, .cols = 3, .data = data};
  EXPECT_THROW(no_scales.dequantize_row(0, out), InvalidArgument);
  const uint8_t scales[2] = {127, 127};
  const Weight odd_mxfp4{.format = WeightFormat::kMxfp4,
                         .dtype = DType::kU8,
                         .rows = 1,
                         .cols = 3,
                         .data = data,
                         .scales = scales,
                         .scales_dtype = DType::kE8M0};
  EXPECT_THROW(odd_mxfp4.dequantize_row(0, out), InvalidArgument);
  const Weight int_dense{.dtype = DType::kI32, .rows = 2, .cols = 3, .data = data};
  EXPECT_THROW(int_dense.dequantize_row(0, out), InvalidArgument);
}

}  // namespace
}  // namespace hyserve

namespace hyserve {
namespace {

// The bytes each format's matrix and scales take (what the backends copy).
TEST(Weight, DataAndScaleBytesPerFormat) {
  Weight w;
  w.rows = 300;
  w.cols = 256;
  w.dtype = DType::kBF16;
  EXPECT_EQ(w.data_bytes(), 300 * 256 * 2);
  EXPECT_EQ(w.scale_bytes(), 0);
  w.format = WeightFormat::kFp8Block;
  w.dtype = DType::kE4M3;
  w.scales_dtype = DType::kF32;
  EXPECT_EQ(w.data_bytes(), 300 * 256);
  EXPECT_EQ(w.scale_bytes(), 3 * 2 * 4);  // ceil(300 / 128) x 256 / 128 blocks
  w.format = WeightFormat::kMxfp4;
  w.scales_dtype = DType::kE8M0;
  EXPECT_EQ(w.data_bytes(), 300 * 128);
  EXPECT_EQ(w.scale_bytes(), 300 * 8);
  w.format = WeightFormat::kInt4;
  w.scales_dtype = DType::kBF16;
  EXPECT_EQ(w.data_bytes(), 300 * 128);
  EXPECT_EQ(w.scale_bytes(), 300 * 8 * 2);
  EXPECT_EQ(w.storage_bytes(), w.data_bytes() + w.scale_bytes());
}

}  // namespace
}  // namespace hyserve
