// Weight row decoding for the four storage formats (see weight.h). Every CPU
// kernel that reads a matrix goes through dequantize_row, so this is the one
// place that defines what a stored FP8, MXFP4 or INT4 weight means.
#include "core/weight.h"

#include <algorithm>
#include <array>

#include "util/error.h"

namespace hyserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// e4m3 has 256 codes: decode through a table instead of ldexp per element.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace

void Weight::check_layout() const {
  const Weight& w = *this;
  CHECK(w.data != nullptr, "weight has no data");
  CHECK(w.rows > 0 && w.cols > 0, "weight shape [", w.rows, ", ", w.cols, "]");
  switch (w.format) {
    case WeightFormat::kDense:
      CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
            "dense weight dtype must be F32, F16 or BF16, got ", dtype_name(w.dtype));
      break;
    case WeightFormat::kFp8Block:
      CHECK(w.dtype == DType::kE4M3, "FP8 weight dtype must be F8_E4M3, got ", dtype_name(w.dtype));
      CHECK(w.scales != nullptr, "FP8 weight has no scales");
      CHECK(w.scales_dtype == DType::kF32 || w.scales_dtype == DType::kBF16,
            "FP8 weight scales must be F32 or BF16, got ", dtype_name(w.scales_dtype));
      break;
    case WeightFormat::kMxfp4:
      CHECK(w.dtype == DType::kU8, "MXFP4 weight dtype must be U8, got ", dtype_name(w.dtype));
      CHECK(w.scales != nullptr, "MXFP4 weight has no scales");
      CHECK(w.scales_dtype == DType::kE8M0 || w.scales_dtype == DType::kU8,
            "MXFP4 weight scales must be F8_E8M0 or U8, got ", dtype_name(w.scales_dtype));
      CHECK(w.cols % Weight::kMxfp4BlockSize == 0, "MXFP4 weight cols (", w.cols,
            ") must be a multiple of ", Weight::kMxfp4BlockSize);
      break;
    case WeightFormat::kInt4:
      CHECK(w.dtype == DType::kU8, "INT4 weight dtype must be U8, got ", dtype_name(w.dtype));
      CHECK(w.scales != nullptr, "INT4 weight has no scales");
      CHECK(w.scales_dtype == DType::kF32 || w.scales_dtype == DType::kF16 ||
                w.scales_dtype == DType::kBF16,
            "INT4 weight scales must be F32, F16 or BF16, got ", dtype_name(w.scales_dtype));
      CHECK(w.cols % Weight::kInt4GroupSize == 0, "INT4 weight cols (", w.cols,
            ") must be a multiple of ", Weight::kInt4GroupSize);
      break;
  }
}

void Weight::dequantize_row(int64_t r, float* out) const {
  check_layout();
  CHECK(r >= 0 && r < rows, "row ", r, " out of range [0, ", rows, ")");
  CHECK(out != nullptr, "dequantize_row: null output");
  switch (format) {
    case WeightFormat::kDense: {
      const auto* base = static_cast<const uint8_t*>(data) + r * cols * dtype_size(dtype);
      convert_to_f32(base, dtype, out, cols);
      return;
    }
    case WeightFormat::kFp8Block: {
      const auto& table = e4m3_table();
      const auto* row = static_cast<const uint8_t*>(data) + r * cols;
      const int64_t num_col_blocks = ceil_div(cols, kFp8BlockSize);
      const int64_t scale_row = (r / kFp8BlockSize) * num_col_blocks;
      for (int64_t cb = 0; cb < num_col_blocks; ++cb) {
        const float scale = load_as_f32(scales, scales_dtype, scale_row + cb);
        const int64_t end = std::min(cols, (cb + 1) * kFp8BlockSize);
        for (int64_t c = cb * kFp8BlockSize; c < end; ++c) out[c] = table[row[c]] * scale;
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const auto* row = static_cast<const uint8_t*>(data) + r * (cols / 2);
      const auto* row_scales = static_cast<const uint8_t*>(scales) + r * (cols / kMxfp4BlockSize);
      for (int64_t c = 0; c < cols; c += 2) {
        const float scale = e8m0_to_f32(row_scales[c / kMxfp4BlockSize]);
        const uint8_t pair = row[c / 2];
        out[c] = e2m1_to_f32(pair & 0xf) * scale;
        out[c + 1] = e2m1_to_f32(pair >> 4) * scale;
      }
      return;
    }
    case WeightFormat::kInt4: {
      const auto* row = static_cast<const uint8_t*>(data) + r * (cols / 2);
      const int64_t num_groups = cols / kInt4GroupSize;
      for (int64_t g = 0; g < num_groups; ++g) {
        const float scale = load_as_f32(scales, scales_dtype, r * num_groups + g);
        for (int64_t c = g * kInt4GroupSize; c < (g + 1) * kInt4GroupSize; c += 2) {
          const uint8_t pair = row[c / 2];
          out[c] = static_cast<float>(static_cast<int>(pair & 0xf) - 8) * scale;
          out[c + 1] = static_cast<float>(static_cast<int>(pair >> 4) - 8) * scale;
        }
      }
      return;
    }
  }
}

int64_t Weight::data_bytes() const {
  switch (format) {
    case WeightFormat::kDense:
      return rows * cols * dtype_size(dtype);
    case WeightFormat::kFp8Block:
      return rows * cols;
    case WeightFormat::kMxfp4:
    case WeightFormat::kInt4:
      return rows * cols / 2;
  }
  return 0;
}

int64_t Weight::scale_bytes() const {
  switch (format) {
    case WeightFormat::kDense:
      return 0;
    case WeightFormat::kFp8Block:
      return ceil_div(rows, kFp8BlockSize) * ceil_div(cols, kFp8BlockSize) *
             dtype_size(scales_dtype);
    case WeightFormat::kMxfp4:
      return rows * ceil_div(cols, kMxfp4BlockSize);
    case WeightFormat::kInt4:
      return rows * (cols / kInt4GroupSize) * dtype_size(scales_dtype);
  }
  return 0;
}

}  // namespace hyserve
