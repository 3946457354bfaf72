// The memory-bound core shared by the CUDA linear and MoE kernels: one warp streams
// kGemvRows weight rows once (16-byte loads when the rows allow it, kGemvDepth chunks
// per row in flight per lane), decodes them in registers and dots them with up to
// kGemvMaxTokens fp32 vectors, accumulating in fp32; each x load serves kGemvRows rows.
// Each output is a fixed-order sum over its row (lane-strided, then a butterfly
// reduction), so a token's result does not depend on the other tokens or rows.
#pragma once

#include "kernels/linear/cuda/dequant.cuh"

namespace hyserve::cuda {

inline constexpr int kGemvMaxTokens = 16;
inline constexpr int kGemvRows = 2;   // weight rows per warp
inline constexpr int kGemvDepth = 2;  // 16-byte chunks per row a lane loads before using them

// The 16-byte path gives each lane whole chunks of a row: it pays only when a row has a
// chunk for every lane. A narrower row (e.g. 32 MXFP4 columns: one chunk) would leave
// all lanes but a few idle, so it goes element by element, 32 lanes across k.
inline bool gemv_row_fills_warp(WFmt f, int64_t cols) {
  return row_bytes(f, cols) / 16 >= 32;
}

// True when rows of w can be read in 16-byte chunks, every lane gets one, and x rows of
// w.cols floats starting at the 16-byte aligned x_base can be read in float4s.
inline bool gemv_vectorizable(const WRef& w, WFmt f, const void* x_base) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(w.data) && row_bytes(f, w.cols) % 16 == 0 && gemv_row_fills_warp(f, w.cols) &&
         w.cols % 4 == 0 && aligned(x_base);
}

// acc[q][j] += this lane's share of dot(row r0 + q of w, xs[j]) for q < num_rows and
// j < n (both the same on every lane; num_rows <= kGemvRows, n <= kMaxT). xs points to
// n row pointers of w.cols floats.
template <WFmt F, bool kVec, int kMaxT>
__device__ __forceinline__ void lane_row_dots(const WRef& w, int64_t r0, int num_rows,
                                              const float* const* xs, int n, int lane,
                                              float (&acc)[kGemvRows][kMaxT]) {
  if constexpr (kVec) {
    constexpr int kE = kChunkElems<F>;
    const int64_t num_chunks = w.cols / kE;
    const uint4* rows[kGemvRows];
#pragma unroll
    for (int q = 0; q < kGemvRows; ++q) {
      rows[q] = reinterpret_cast<const uint4*>(w.data) + (r0 + (q < num_rows ? q : 0)) * num_chunks;
    }
    for (int64_t c0 = lane; c0 < num_chunks; c0 += 32 * kGemvDepth) {
      uint4 raw[kGemvDepth][kGemvRows];
#pragma unroll
      for (int d = 0; d < kGemvDepth; ++d) {
#pragma unroll
        for (int q = 0; q < kGemvRows; ++q) {
          const int64_t c = c0 + 32 * d;
          raw[d][q] = c < num_chunks && q < num_rows ? __ldcs(rows[q] + c) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int d = 0; d < kGemvDepth; ++d) {
        const int64_t c = c0 + 32 * d;
        if (c >= num_chunks) break;
        float wv[kGemvRows][kE];
#pragma unroll
        for (int q = 0; q < kGemvRows; ++q) {
          const float s = q < num_rows ? element_scale<F>(w, r0 + q, c * kE) : 0.0f;
          decode_chunk_scaled<F>(raw[d][q], s, wv[q]);
        }
#pragma unroll
        for (int j = 0; j < kMaxT; ++j) {
          if (j < n) {
            const float4* xv = reinterpret_cast<const float4*>(xs[j] + c * kE);
#pragma unroll
            for (int i = 0; i < kE / 4; ++i) {
              const float4 v = __ldg(xv + i);
#pragma unroll
              for (int q = 0; q < kGemvRows; ++q) {
                float sum = acc[q][j];
                sum += wv[q][4 * i] * v.x;
                sum += wv[q][4 * i + 1] * v.y;
                sum += wv[q][4 * i + 2] * v.z;
                sum += wv[q][4 * i + 3] * v.w;
                acc[q][j] = sum;
              }
            }
          }
        }
      }
    }
  } else {
    // Narrow rows (a few k steps per lane): the loads of one step are predicated, not
    // branched over, so they are all in flight at once; a token j >= n reads 0 and its
    // accumulators are never used.
    for (int64_t k = lane; k < w.cols; k += 32) {
      float wk[kGemvRows];
#pragma unroll
      for (int q = 0; q < kGemvRows; ++q) wk[q] = q < num_rows ? element<F>(w, r0 + q, k) : 0.0f;
      float xk[kMaxT];
#pragma unroll
      for (int j = 0; j < kMaxT; ++j) xk[j] = j < n ? __ldg(xs[j] + k) : 0.0f;
#pragma unroll
      for (int q = 0; q < kGemvRows; ++q) {
#pragma unroll
        for (int j = 0; j < kMaxT; ++j) acc[q][j] += wk[q] * xk[j];
      }
    }
  }
}

// Sums every acc[q][j] over the warp (those past num_rows or n are sums of zeros); every
// lane gets the totals. Level by level over all accumulators, without branches, so the
// shuffles of one level are independent and issue back to back: a short row's GEMV is
// bound by this latency, not by its loads.
template <int kMaxT>
__device__ __forceinline__ void warp_sum(float (&acc)[kGemvRows][kMaxT], int num_rows, int n) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
#pragma unroll
    for (int q = 0; q < kGemvRows; ++q) {
#pragma unroll
      for (int j = 0; j < kMaxT; ++j) acc[q][j] += __shfl_xor_sync(0xffffffffu, acc[q][j], off);
    }
  }
}

}  // namespace hyserve::cuda
