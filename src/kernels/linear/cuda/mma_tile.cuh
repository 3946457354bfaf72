// The batch-invariant tensor-core tile shared by the CUDA MoE experts and the linear
// layers' batch-invariant path: C[kBM, kBN] = A W[n0 : n0 + kBN]^T, where the kBM rows of
// A are gathered through row pointers (any token order, null = zero row) and W is any
// Weight format decoded into shared memory as bf16 (FP8: raw e4m3, each 128-wide k
// block's partial sum scaled on its own). fp32 accumulate.
//
// Why it is batch-invariant: every output element is built by the same sequence of
// wmma 16x16x16 steps over k = 0, kBK, 2 kBK, ... (no split-K, no shape-dependent
// algorithm choice), and an MMA's result for one element depends only on its own row of
// A and column of W. So a token's output bits do not depend on which tile row it lands
// in, on how many other tokens share the tile, or on the number of tokens in the call.
#pragma once

#include <mma.h>

#include "kernels/linear/cuda/dequant.cuh"

namespace hyserve::cuda::tile {

constexpr int kMmaThreads = 128;
constexpr int kBM = 64;         // tokens (16 per warp)
constexpr int kBN = 64;         // weight rows (output features)
constexpr int kBK = 32;         // reduction
constexpr int kLdAB = kBK + 8;  // bf16 smem row stride (multiple of 8, 32-byte aligned rows)
constexpr int kLdC = kBN + 4;   // fp32 smem row stride
static_assert(Weight::kFp8BlockSize % kBN == 0 && Weight::kFp8BlockSize % kBK == 0,
              "an FP8 scale block must cover whole tiles");

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int kNumW>
struct MmaSmem {
  union {
    struct {
      alignas(128) __nv_bfloat16 a[kBM * kLdAB];         // [kBM, kBK] activations
      alignas(128) __nv_bfloat16 b[kNumW][kBN * kLdAB];  // [kBN, kBK] weight rows per matrix
    } in;
    alignas(128) float c[kNumW][kBM * kLdC];  // [kBM, kBN] results per matrix, after the k loop
  };
  const float* rows[kBM];  // activation row per tile row, or null
};

// Stages k in [k0, k0 + kBK) of the activations and of weight rows [n0, n0 + kBN) as bf16.
// Weights hold element() values, except FP8: raw e4m3 (the block scale comes later).
// kVec: 16-byte loads (full k tile, aligned rows); else one element at a time.
template <WFmt F, bool kVec, int kNumW>
__device__ __forceinline__ void load_tiles(const WRef (&ws)[kNumW], int64_t n0, int64_t k0,
                                           MmaSmem<kNumW>& s) {
  const int64_t k_total = ws[0].cols;
  if (kVec && k0 + kBK <= k_total) {
    for (int i = threadIdx.x; i < kBM * kBK / 4; i += kMmaThreads) {
      const int m = i / (kBK / 4);
      const int kk = 4 * (i % (kBK / 4));
      const float4 v = s.rows[m] != nullptr
                           ? __ldg(reinterpret_cast<const float4*>(s.rows[m] + k0 + kk))
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      __nv_bfloat16* dst = s.in.a + m * kLdAB + kk;
      dst[0] = __float2bfloat16(v.x);
      dst[1] = __float2bfloat16(v.y);
      dst[2] = __float2bfloat16(v.z);
      dst[3] = __float2bfloat16(v.w);
    }
    constexpr int kE = kChunkElems<F>;
    static_assert(kBK % kE == 0, "a k tile holds whole 16-byte chunks");
    constexpr int kChunksPerRow = kBK / kE;
#pragma unroll
    for (int w = 0; w < kNumW; ++w) {
      for (int i = threadIdx.x; i < kBN * kChunksPerRow; i += kMmaThreads) {
        const int n = i / kChunksPerRow;
        const int kk = (i % kChunksPerRow) * kE;
        const int64_t r = n0 + n;
        float v[kE];
        if (r < ws[w].rows) {
          const int64_t num_chunks = k_total / kE;
          const int64_t k = k0 + kk;
          const uint4 raw =
              __ldg(reinterpret_cast<const uint4*>(ws[w].data) + r * num_chunks + k / kE);
          if constexpr (F == WFmt::kFp8) {
            decode_chunk<F>(raw, v);
          } else {
            decode_chunk_scaled<F>(raw, element_scale<F>(ws[w], r, k), v);
          }
        } else {
#pragma unroll
          for (int e = 0; e < kE; ++e) v[e] = 0.0f;
        }
        __nv_bfloat16* dst = s.in.b[w] + n * kLdAB + kk;
#pragma unroll
        for (int e = 0; e < kE; ++e) dst[e] = __float2bfloat16(v[e]);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < kBM * kBK; i += kMmaThreads) {
    const int m = i / kBK;
    const int64_t k = k0 + i % kBK;
    const float v = s.rows[m] != nullptr && k < k_total ? s.rows[m][k] : 0.0f;
    s.in.a[m * kLdAB + i % kBK] = __float2bfloat16(v);
  }
#pragma unroll
  for (int w = 0; w < kNumW; ++w) {
    for (int i = threadIdx.x; i < kBN * kBK; i += kMmaThreads) {
      const int64_t r = n0 + i / kBK;
      const int64_t k = k0 + i % kBK;
      float v = 0.0f;
      if (r < ws[w].rows && k < k_total) {
        v = F == WFmt::kFp8 ? element_raw<F>(ws[w], r, k) : element<F>(ws[w], r, k);
      }
      s.in.b[w][(i / kBK) * kLdAB + i % kBK] = __float2bfloat16(v);
    }
  }
}

// c[w] = A W_w[n0 : n0 + kBN]^T for the kBM activation rows in s.rows (K = ws[0].cols),
// fp32 accumulate. Warp i owns rows 16 i .. + 16 and all kBN columns. For FP8 the tile
// holds raw e4m3 values and each 128-wide k block's sum is scaled on its own.
template <WFmt F, bool kVec, int kNumW>
__device__ __forceinline__ void mma_tile(const WRef (&ws)[kNumW], int64_t n0, MmaSmem<kNumW>& s) {
  constexpr int kFrags = kBN / 16;
  const int64_t k_total = ws[0].cols;
  const int warp = threadIdx.x / 32;
  FragC acc[kNumW][kFrags];
  FragC block_acc[kNumW][F == WFmt::kFp8 ? kFrags : 1];
#pragma unroll
  for (int w = 0; w < kNumW; ++w) {
#pragma unroll
    for (int j = 0; j < kFrags; ++j) wmma::fill_fragment(acc[w][j], 0.0f);
    if constexpr (F == WFmt::kFp8) {
#pragma unroll
      for (int j = 0; j < kFrags; ++j) wmma::fill_fragment(block_acc[w][j], 0.0f);
    }
  }
  for (int64_t k0 = 0; k0 < k_total; k0 += kBK) {
    load_tiles<F, kVec>(ws, n0, k0, s);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      FragA fa;
      wmma::load_matrix_sync(fa, s.in.a + (16 * warp) * kLdAB + kk, kLdAB);
#pragma unroll
      for (int w = 0; w < kNumW; ++w) {
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
          FragB fb;
          wmma::load_matrix_sync(fb, s.in.b[w] + (16 * j) * kLdAB + kk, kLdAB);
          if constexpr (F == WFmt::kFp8) {
            wmma::mma_sync(block_acc[w][j], fa, fb, block_acc[w][j]);
          } else {
            wmma::mma_sync(acc[w][j], fa, fb, acc[w][j]);
          }
        }
      }
    }
    __syncthreads();
    if constexpr (F == WFmt::kFp8) {
      const int64_t k_end = k0 + kBK;
      if (k_end % Weight::kFp8BlockSize == 0 || k_end >= k_total) {
#pragma unroll
        for (int w = 0; w < kNumW; ++w) {
          const float scale = element_scale<F>(ws[w], n0, k0);
#pragma unroll
          for (int j = 0; j < kFrags; ++j) {
#pragma unroll
            for (int q = 0; q < acc[w][j].num_elements; ++q) {
              acc[w][j].x[q] += scale * block_acc[w][j].x[q];
            }
            wmma::fill_fragment(block_acc[w][j], 0.0f);
          }
        }
      }
    }
  }
#pragma unroll
  for (int w = 0; w < kNumW; ++w) {
#pragma unroll
    for (int j = 0; j < kFrags; ++j) {
      wmma::store_matrix_sync(s.c[w] + (16 * warp) * kLdC + 16 * j, acc[w][j], kLdC,
                              wmma::mem_row_major);
    }
  }
  __syncthreads();
}

}  // namespace hyserve::cuda::tile
