// The memory-bound core shared by the CUDA linear and MoE kernels: one warp streams
// one weight row once (16-byte loads when the row allows it), decodes it in
// registers and dots it with up to kGemvMaxTokens fp32 vectors, accumulating in fp32.
// Each output is a fixed-order sum over the row (lane-strided, then a butterfly
// reduction), so a token's result does not depend on the other tokens.
#pragma once

#include "kernels/linear/cuda/dequant.cuh"

namespace hyserve::cuda {

inline constexpr int kGemvMaxTokens = 16;

// True when row r of w can be read in 16-byte chunks and each xs[j] + chunk start
// is 16-byte aligned (x rows of `cols` floats starting at 16-byte aligned bases).
inline bool gemv_vectorizable(const WRef& w, WFmt f, const void* x_base) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(w.data) && row_bytes(f, w.cols) % 16 == 0 && w.cols % 4 == 0 && aligned(x_base);
}

// acc[j] += this lane's share of dot(row r of w, xs[j]) for j < n (n <= kMaxT, the
// same on every lane). xs points to n row pointers, each w.cols floats.
template <WFmt F, bool kVec, int kMaxT>
__device__ __forceinline__ void lane_row_dots(const WRef& w, int64_t r, const float* const* xs,
                                              int n, int lane, float (&acc)[kMaxT]) {
  if constexpr (kVec) {
    constexpr int kE = kChunkElems<F>;
    const int64_t num_chunks = w.cols / kE;
    const uint4* row = reinterpret_cast<const uint4*>(w.data) + r * num_chunks;
#pragma unroll 4
    for (int64_t c = lane; c < num_chunks; c += 32) {
      float wv[kE];
      decode_chunk<F>(__ldg(row + c), wv);
      if constexpr (F == WFmt::kFp8 || F == WFmt::kMxfp4) {
        const float s = element_scale<F>(w, r, c * kE);
#pragma unroll
        for (int i = 0; i < kE; ++i) wv[i] *= s;
      }
#pragma unroll
      for (int j = 0; j < kMaxT; ++j) {
        if (j < n) {
          const float4* xv = reinterpret_cast<const float4*>(xs[j] + c * kE);
          float sum = acc[j];
#pragma unroll
          for (int q = 0; q < kE / 4; ++q) {
            const float4 v = __ldg(xv + q);
            sum += wv[4 * q] * v.x;
            sum += wv[4 * q + 1] * v.y;
            sum += wv[4 * q + 2] * v.z;
            sum += wv[4 * q + 3] * v.w;
          }
          acc[j] = sum;
        }
      }
    }
  } else {
    for (int64_t k = lane; k < w.cols; k += 32) {
      const float wk = element<F>(w, r, k);
#pragma unroll
      for (int j = 0; j < kMaxT; ++j) {
        if (j < n) acc[j] += wk * xs[j][k];
      }
    }
  }
}

// Sums acc[j] (j < n) over the warp; every lane gets the totals.
template <int kMaxT>
__device__ __forceinline__ void warp_sum(float (&acc)[kMaxT], int n) {
#pragma unroll
  for (int j = 0; j < kMaxT; ++j) {
    if (j < n) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
    }
  }
}

}  // namespace hyserve::cuda
