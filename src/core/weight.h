// Weight: a read-only view of one linear layer's matrix [rows = out, cols = in],
// in whichever storage format the checkpoint uses. It points into checkpoint
// memory (mmap) or into a buffer the model owns; it owns nothing.
//
//   kDense     data: rows x cols elements of dtype F32 / F16 / BF16
//   kFp8Block  data: rows x cols e4m3 bytes;
//              scales: [ceil(rows/128), ceil(cols/128)] of scales_dtype (F32 or BF16),
//              the "weight_scale_inv" of the checkpoint: w = e4m3(data) * scale
//   kMxfp4     data: rows x cols/2 bytes, e2m1 pairs, element 2i in the low nibble;
//              scales: [rows, cols/32] e8m0 bytes: w = e2m1 * 2^(scale-127)
//   kInt4      data: rows x cols/2 bytes, element 2i in the low nibble; a nibble is the
//              offset code n = q + 8 of a signed q in [-8, 7] (compressed-tensors
//              pack-quantized: the little-endian bytes of its int32 words);
//              scales: [rows, cols/32] of scales_dtype (F32, F16 or BF16): w = (n - 8) * scale
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace hyserve {

enum class WeightFormat : uint8_t { kDense, kFp8Block, kMxfp4, kInt4 };

struct Weight {
  WeightFormat format = WeightFormat::kDense;
  DType dtype = DType::kF32;  // element type of data (E4M3 for kFp8Block, U8 for kMxfp4 / kInt4)
  int64_t rows = 0;           // output features
  int64_t cols = 0;           // input features
  const void* data = nullptr;
  const void* scales = nullptr;      // kFp8Block / kMxfp4 / kInt4 only
  DType scales_dtype = DType::kF32;  // F32 or BF16 for kFp8Block; E8M0 or U8 for kMxfp4;
                                     // F32, F16 or BF16 for kInt4
  static constexpr int64_t kFp8BlockSize = 128;
  static constexpr int64_t kMxfp4BlockSize = 32;
  static constexpr int64_t kInt4GroupSize = 32;

  bool empty() const { return data == nullptr; }
  // Decodes row r (cols values) into out, in fp32.
  // Throws naming what is wrong unless data, dtype, scales and shape fit the format.
  void check_layout() const;
  void dequantize_row(int64_t r, float* out) const;
  // Bytes the matrix and its scales occupy: data_bytes() + scale_bytes() (0 for dense).
  int64_t data_bytes() const;
  int64_t scale_bytes() const;
  int64_t storage_bytes() const { return data_bytes() + scale_bytes(); }
};

}  // namespace hyserve
