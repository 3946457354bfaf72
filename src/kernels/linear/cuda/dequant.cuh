// Device-side decoding of Weight matrices (core/weight.h), shared by the CUDA linear,
// MLP and MoE kernels. Every decode here reproduces Weight::dequantize_row exactly:
// the element codecs are bit manipulations with exact fp32 results, and a quantized
// element is (raw value) * (its block scale), one fp32 multiply as on the CPU.
//
// Two ways in:
//   element(w, r, k)            one element, any alignment (awkward shapes, tile loads)
//   decode_chunk<F>(bytes, out) 16 bytes of a row: 4 F32, 8 F16/BF16, 16 FP8, 32 MXFP4
//                               or INT4 raw values (before the block scale);
//                               element_scale() at the chunk's first element is the
//                               scale shared by that chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "core/cuda/dtype.cuh"

#include <cstdint>

#include "core/weight.h"
#include "util/error.h"

namespace hyserve::cuda {

// Storage formats the kernels are templated on.
enum class WFmt : int { kF32, kF16, kBF16, kFp8, kMxfp4, kInt4 };

// One matrix as the kernels see it: [rows, cols] in format F, device pointers.
struct WRef {
  const uint8_t* data = nullptr;
  // FP8: [ceil(rows/128), ceil(cols/128)]; MXFP4, INT4: [rows, cols/32]
  const void* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool scales_bf16 = false;  // FP8 / INT4 scales stored as BF16 (else F32, or F16 below)
  bool scales_f16 = false;   // INT4 scales stored as F16
};

inline WFmt weight_wfmt(const Weight& w) {
  w.check_layout();
  switch (w.format) {
    case WeightFormat::kFp8Block:
      return WFmt::kFp8;
    case WeightFormat::kMxfp4:
      return WFmt::kMxfp4;
    case WeightFormat::kInt4:
      return WFmt::kInt4;
    case WeightFormat::kDense:
      break;
  }
  return w.dtype == DType::kF16 ? WFmt::kF16 : w.dtype == DType::kBF16 ? WFmt::kBF16 : WFmt::kF32;
}

// Calls fn.template operator()<F>() with the format as a compile-time constant.
template <typename Fn>
void dispatch_format(WFmt f, Fn&& fn) {
  switch (f) {
    case WFmt::kF32:
      return fn.template operator()<WFmt::kF32>();
    case WFmt::kF16:
      return fn.template operator()<WFmt::kF16>();
    case WFmt::kBF16:
      return fn.template operator()<WFmt::kBF16>();
    case WFmt::kFp8:
      return fn.template operator()<WFmt::kFp8>();
    case WFmt::kMxfp4:
      return fn.template operator()<WFmt::kMxfp4>();
    case WFmt::kInt4:
      return fn.template operator()<WFmt::kInt4>();
  }
}

inline WRef make_wref(const Weight& w) {
  CHECK(!w.empty() && w.rows > 0 && w.cols > 0, "weight shape [", w.rows, ", ", w.cols, "]");
  weight_wfmt(w);
  const bool scaled = w.format == WeightFormat::kFp8Block || w.format == WeightFormat::kInt4;
  return WRef{static_cast<const uint8_t*>(w.data),
              w.scales,
              w.rows,
              w.cols,
              scaled && w.scales_dtype == DType::kBF16,
              w.format == WeightFormat::kInt4 && w.scales_dtype == DType::kF16};
}

// Bytes of one stored row.
inline int64_t row_bytes(WFmt f, int64_t cols) {
  switch (f) {
    case WFmt::kF32:
      return cols * 4;
    case WFmt::kF16:
    case WFmt::kBF16:
      return cols * 2;
    case WFmt::kFp8:
      return cols;
    case WFmt::kMxfp4:
    case WFmt::kInt4:
      return cols / 2;
  }
  return 0;
}

// Elements per 16-byte chunk.
template <WFmt F>
inline constexpr int kChunkElems = F == WFmt::kF32     ? 4
                                   : F == WFmt::kFp8   ? 16
                                   : F == WFmt::kMxfp4 ? 32
                                   : F == WFmt::kInt4  ? 32
                                                       : 8;

// Scale of element (r, k): the FP8 128x128 block scale, the MXFP4 / INT4 per-32 scale,
// else 1.
template <WFmt F>
__device__ __forceinline__ float element_scale(const WRef& w, int64_t r, int64_t k) {
  if constexpr (F == WFmt::kFp8) {
    const int64_t scale_cols = (w.cols + Weight::kFp8BlockSize - 1) / Weight::kFp8BlockSize;
    const int64_t i = (r / Weight::kFp8BlockSize) * scale_cols + k / Weight::kFp8BlockSize;
    return w.scales_bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(w.scales)[i])
                         : static_cast<const float*>(w.scales)[i];
  } else if constexpr (F == WFmt::kMxfp4) {
    const auto* s = static_cast<const uint8_t*>(w.scales);
    return e8m0_to_f32(s[r * (w.cols / Weight::kMxfp4BlockSize) + k / Weight::kMxfp4BlockSize]);
  } else if constexpr (F == WFmt::kInt4) {
    const int64_t i = r * (w.cols / Weight::kInt4GroupSize) + k / Weight::kInt4GroupSize;
    const auto* s = static_cast<const uint16_t*>(w.scales);
    return w.scales_bf16  ? bf16_bits_to_f32(s[i])
           : w.scales_f16 ? __half2float(__ushort_as_half(s[i]))
                          : static_cast<const float*>(w.scales)[i];
  } else {
    return 1.0f;
  }
}

// Element (r, k) before its scale: the dense value, the e4m3 value, the e2m1 value, the
// signed integer nibble - 8.
template <WFmt F>
__device__ __forceinline__ float element_raw(const WRef& w, int64_t r, int64_t k) {
  if constexpr (F == WFmt::kF32) {
    return reinterpret_cast<const float*>(w.data)[r * w.cols + k];
  } else if constexpr (F == WFmt::kF16) {
    return __half2float(reinterpret_cast<const __half*>(w.data)[r * w.cols + k]);
  } else if constexpr (F == WFmt::kBF16) {
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.data)[r * w.cols + k]);
  } else if constexpr (F == WFmt::kFp8) {
    return e4m3_to_f32(w.data[r * w.cols + k]);
  } else {
    const uint8_t pair = w.data[r * (w.cols / 2) + k / 2];
    const uint32_t nibble = (k & 1) ? (pair >> 4) : (pair & 0xfu);
    if constexpr (F == WFmt::kInt4) {
      return static_cast<float>(static_cast<int>(nibble) - 8);
    } else {
      return e2m1_to_f32(nibble);
    }
  }
}

// Element (r, k) as Weight::dequantize_row gives it.
template <WFmt F>
__device__ __forceinline__ float element(const WRef& w, int64_t r, int64_t k) {
  if constexpr (F == WFmt::kFp8 || F == WFmt::kMxfp4 || F == WFmt::kInt4) {
    return element_raw<F>(w, r, k) * element_scale<F>(w, r, k);
  } else {
    return element_raw<F>(w, r, k);
  }
}

// Decodes the 16 bytes `b` of a row into kChunkElems<F> raw values.
template <WFmt F>
__device__ __forceinline__ void decode_chunk(const uint4& b, float* out) {
  const uint32_t words[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = words[i];
    if constexpr (F == WFmt::kF32) {
      out[i] = __uint_as_float(u);
    } else if constexpr (F == WFmt::kF16) {
      const __half2 h = *reinterpret_cast<const __half2*>(&u);
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    } else if constexpr (F == WFmt::kBF16) {
      out[2 * i] = __uint_as_float(u << 16);
      out[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
    } else if constexpr (F == WFmt::kFp8) {
      // e4m3 -> f16 is exact (and NaN stays NaN): one conversion per pair.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __half2 h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>((u >> (16 * j)) & 0xffffu), __NV_E4M3);
        const float2 f = __half22float2(h);
        out[4 * i + 2 * j] = f.x;
        out[4 * i + 2 * j + 1] = f.y;
      }
    } else if constexpr (F == WFmt::kInt4) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        out[8 * i + j] = static_cast<float>(static_cast<int>((u >> (4 * j)) & 0xfu) - 8);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * i + j] = e2m1_to_f32((u >> (4 * j)) & 0xfu);
    }
  }
}

// decode_chunk<F> times the chunk's scale: the values element() gives (one fp32 multiply
// per element, as on the CPU). MXFP4 folds the 2^126 of the e2m1 trick into the scale
// (both exact powers of two), saving a multiply.
template <WFmt F>
__device__ __forceinline__ void decode_chunk_scaled(const uint4& b, float scale, float* out) {
  if constexpr (F == WFmt::kMxfp4) {
    const float s = scale * 0x1p126f;
    const uint32_t words[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t nibble = words[i] >> (4 * j);
        out[8 * i + j] = __uint_as_float(((nibble & 0x8u) << 28) | ((nibble & 0x7u) << 22)) * s;
      }
    }
  } else {
    decode_chunk<F>(b, out);
    if constexpr (F == WFmt::kFp8 || F == WFmt::kInt4) {
#pragma unroll
      for (int i = 0; i < kChunkElems<F>; ++i) out[i] *= scale;
    }
  }
}

}  // namespace hyserve::cuda
