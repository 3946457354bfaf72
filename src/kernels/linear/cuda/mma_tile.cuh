// The batch-invariant tensor-core tile shared by the CUDA MoE experts and the linear
// layers' batch-invariant path: C[tokens, kBN] = A W[n0 : n0 + kBN]^T, where the rows of A
// are gathered through row pointers (any token order, null = zero row) and W is any
// Weight format decoded into shared memory as bf16 (FP8: raw e4m3, each 128-wide k
// block's partial sum scaled on its own). fp32 accumulate.
//
// Why it is batch-invariant: every output element is built by the same sequence of
// wmma 16x16x16 steps over k = 0, 16, 32, ... (no split-K, no shape-dependent algorithm
// choice), in either tile shape, and an MMA's result for one element depends only on its
// own row of A and column of W. So a token's output bits do not depend on which tile or
// tile row it lands in, on how many other tokens share the tile, or on the number of
// tokens in the call. (Beyond K, tiles pad with zeros: adding +0 changes no value; only
// an exact -0 sum may become +0 when K is not a multiple of 128.)
#pragma once

#include <mma.h>

#include "kernels/linear/cuda/dequant.cuh"

namespace hyserve::cuda::tile {

constexpr int kMmaThreads = 128;  // 4 warps
constexpr int kBN = 64;           // weight rows (output features) per tile
constexpr int kLdC = kBN + 4;     // fp32 smem row stride
static_assert(kBN / 16 == kMmaThreads / 32, "the small tile gives each warp one 16-row n-slice");

// Two tile shapes with the same per-element MMA sequence (so the same bits):
//   Tile<64, 32>   64 tokens x 32 k per step; warp i owns tokens 16 i .. + 16, all kBN rows
//   Tile<16, 128>  16 tokens x 128 k per step (4x the bytes in flight per step, for the
//                  memory-bound small batches); warp i owns weight rows 16 i .. + 16
// Both walk k from 0 in wmma 16x16x16 steps into one fp32 accumulator per output (FP8:
// into a block accumulator per 128-wide scale block, then acc += scale * block).
template <int kM, int kK>
struct Tile {
  static_assert((kM == 64 && kK == 32) || (kM == 16 && kK == 128) || (kM == 128 && kK == 32),
                "the three tile shapes");
  static constexpr int kTokens = kM;
  static constexpr int kDepth = kK;
  static constexpr int kLdAB = kK + 8;  // bf16 smem row stride (multiple of 8, 32-byte rows)
};
using BigTile = Tile<64, 32>;
using SmallTile = Tile<16, 128>;
using LargeTile = Tile<128, 32>;       // mma_tile_large: 8 warps, two pipelined stages
constexpr int kBM = BigTile::kTokens;  // the most tokens a tile holds
static_assert(Weight::kFp8BlockSize % kBN == 0 && Weight::kFp8BlockSize % BigTile::kDepth == 0 &&
                  Weight::kFp8BlockSize % SmallTile::kDepth == 0,
              "an FP8 scale block must cover whole tiles");

// Two floats rounded to bf16 (as __float2bfloat16 rounds each), packed low half first.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <class T, int kNumW>
struct MmaSmem {
  union {
    struct {
      alignas(128) __nv_bfloat16 a[T::kTokens * T::kLdAB];  // [tokens, depth] activations
      alignas(128) __nv_bfloat16 b[kNumW][kBN * T::kLdAB];  // [kBN, depth] weight rows
    } in;
    alignas(128) float c[kNumW][T::kTokens * kLdC];  // [tokens, kBN] results, after the k loop
  };
  const float* rows[T::kTokens];  // activation row per tile row, or null
};

// A 16-byte chunk of weight row r at column k (zeros past the last row).
template <WFmt F>
__device__ __forceinline__ uint4 fetch_weight_chunk(const WRef& w, int64_t r, int64_t k) {
  constexpr int kE = kChunkElems<F>;
  return r < w.rows ? __ldg(reinterpret_cast<const uint4*>(w.data) + r * (w.cols / kE) + k / kE)
                    : make_uint4(0, 0, 0, 0);
}

// The chunk's scale as stash_weight_chunk applies it (0 past the last row; unused for
// BF16 and FP8), to be fetched with the chunk.
template <WFmt F>
__device__ __forceinline__ float chunk_scale(const WRef& w, int64_t r, int64_t k) {
  if constexpr (F == WFmt::kBF16 || F == WFmt::kFp8) {
    return 1.0f;
  } else {
    return r < w.rows ? element_scale<F>(w, r, k) : 0.0f;
  }
}

// Stores a chunk fetched at (r, k) with its chunk_scale as kChunkElems<F> bf16 values:
// element() values, except FP8: raw e4m3 (the block scale comes later). dst is 8-byte
// aligned (16 unless F32).
template <WFmt F>
__device__ __forceinline__ void stash_weight_chunk(const uint4& raw, float scale,
                                                   __nv_bfloat16* dst) {
  constexpr int kE = kChunkElems<F>;
  if constexpr (F == WFmt::kBF16) {
    *reinterpret_cast<uint4*>(dst) = raw;  // already the bf16 values
  } else {
    float v[kE];
    if constexpr (F == WFmt::kFp8) {
      decode_chunk<F>(raw, v);
    } else {
      decode_chunk_scaled<F>(raw, scale, v);
    }
    uint32_t packed[kE / 2];
#pragma unroll
    for (int e = 0; e < kE / 2; ++e) packed[e] = bf16x2_bits(v[2 * e], v[2 * e + 1]);
    if constexpr (kE == 4) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
    } else {
#pragma unroll
      for (int e = 0; e < kE / 2; e += 4) {
        *reinterpret_cast<uint4*>(dst + 2 * e) =
            make_uint4(packed[e], packed[e + 1], packed[e + 2], packed[e + 3]);
      }
    }
  }
}

template <WFmt F>
__device__ __forceinline__ void stash_weight_chunk(const WRef& w, int64_t r, int64_t k,
                                                   const uint4& raw, __nv_bfloat16* dst) {
  stash_weight_chunk<F>(raw, chunk_scale<F>(w, r, k), dst);
}

// Four activations as bf16 (8-byte aligned dst).
__device__ __forceinline__ void stash_x4(const float4& v, __nv_bfloat16* dst) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
}

// Stages k in [k0, k0 + kK) of kM activation rows into a [kM, kLd] and of weight rows
// [n0, n0 + kBN) of each matrix into b[w] [kBN, kLd], as bf16, with kThreads threads.
// kVec: 16-byte loads (aligned rows); else one element at a time; zeros past K.
template <int kM, int kK, int kLd, int kThreads, WFmt F, bool kVec, int kNumW>
__device__ __forceinline__ void stage_step(const WRef (&ws)[kNumW], int64_t n0, int64_t k0,
                                           const float* const* rows, __nv_bfloat16* a,
                                           __nv_bfloat16* const* b) {
  const int64_t k_total = ws[0].cols;
  if (kVec) {
    // Every load of the step is issued before the first store (fixed trip counts,
    // unrolled), so a step costs one memory latency, not one per loop iteration. A
    // partial last step (or K below the tile depth) zero-fills past K: K is a multiple of
    // the chunk and of 4 on this path.
    constexpr int kANum = kM * kK / 4;  // float4s of activations
    constexpr int kAIters = (kANum + kThreads - 1) / kThreads;
    constexpr int kE = kChunkElems<F>;
    static_assert(kK % kE == 0, "a k tile holds whole 16-byte chunks");
    constexpr int kChunksPerRow = kK / kE;
    constexpr int kBNum = kBN * kChunksPerRow;  // weight chunks per matrix
    constexpr int kBIters = (kBNum + kThreads - 1) / kThreads;
    float4 xv[kAIters];
    uint4 raw[kNumW][kBIters];
    float scale[kNumW][kBIters];
#pragma unroll
    for (int it = 0; it < kAIters; ++it) {
      const int i = threadIdx.x + it * kThreads;
      const int m = i / (kK / 4);
      const int kk = 4 * (i % (kK / 4));
      xv[it] = i < kANum && rows[m] != nullptr && k0 + kk < k_total
                   ? __ldg(reinterpret_cast<const float4*>(rows[m] + k0 + kk))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int w = 0; w < kNumW; ++w) {
#pragma unroll
      for (int it = 0; it < kBIters; ++it) {
        const int i = threadIdx.x + it * kThreads;
        const int64_t r = n0 + i / kChunksPerRow;
        const int64_t k = k0 + (i % kChunksPerRow) * kE;
        const bool in = i < kBNum && k < k_total;
        raw[w][it] = in ? fetch_weight_chunk<F>(ws[w], r, k) : make_uint4(0, 0, 0, 0);
        scale[w][it] = in ? chunk_scale<F>(ws[w], r, k) : 0.0f;
      }
    }
#pragma unroll
    for (int it = 0; it < kAIters; ++it) {
      const int i = threadIdx.x + it * kThreads;
      if (i < kANum) stash_x4(xv[it], a + (i / (kK / 4)) * kLd + 4 * (i % (kK / 4)));
    }
#pragma unroll
    for (int w = 0; w < kNumW; ++w) {
#pragma unroll
      for (int it = 0; it < kBIters; ++it) {
        const int i = threadIdx.x + it * kThreads;
        if (i < kBNum) {
          const int n = i / kChunksPerRow;
          const int kk = (i % kChunksPerRow) * kE;
          stash_weight_chunk<F>(raw[w][it], scale[w][it], b[w] + n * kLd + kk);
        }
      }
    }
    return;
  }
  // Element by element, kBatch loads in flight before their stores.
  constexpr int kBatch = 8;
  for (int i0 = threadIdx.x; i0 < kM * kK; i0 += kThreads * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      const int m = i / kK;
      const int64_t k = k0 + i % kK;
      v[u] = i < kM * kK && rows[m] != nullptr && k < k_total ? rows[m][k] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i < kM * kK) a[(i / kK) * kLd + i % kK] = __float2bfloat16(v[u]);
    }
  }
#pragma unroll
  for (int w = 0; w < kNumW; ++w) {
    for (int i0 = threadIdx.x; i0 < kBN * kK; i0 += kThreads * kBatch) {
      float v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * kThreads;
        const int64_t r = n0 + i / kK;
        const int64_t k = k0 + i % kK;
        v[u] = 0.0f;
        if (i < kBN * kK && r < ws[w].rows && k < k_total) {
          v[u] = F == WFmt::kFp8 ? element_raw<F>(ws[w], r, k) : element<F>(ws[w], r, k);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * kThreads;
        if (i < kBN * kK) b[w][(i / kK) * kLd + i % kK] = __float2bfloat16(v[u]);
      }
    }
  }
}

template <class T, WFmt F, bool kVec, int kNumW>
__device__ __forceinline__ void load_tiles(const WRef (&ws)[kNumW], int64_t n0, int64_t k0,
                                           MmaSmem<T, kNumW>& s) {
  __nv_bfloat16* b[kNumW];
#pragma unroll
  for (int w = 0; w < kNumW; ++w) b[w] = s.in.b[w];
  stage_step<T::kTokens, T::kDepth, T::kLdAB, kMmaThreads, F, kVec>(ws, n0, k0, s.rows, s.in.a, b);
}

// c[w] = A W_w[n0 : n0 + kBN]^T for the activation rows in s.rows (K = ws[0].cols), fp32
// accumulate, in the tile shape T (see Tile). For FP8 the tile holds raw e4m3 values and
// each 128-wide k block's sum is scaled on its own.
template <class T, WFmt F, bool kVec, int kNumW>
__device__ __forceinline__ void mma_tile(const WRef (&ws)[kNumW], int64_t n0,
                                         MmaSmem<T, kNumW>& s) {
  constexpr bool kSmall = T::kTokens == 16;
  constexpr int kFrags = kSmall ? 1 : kBN / 16;  // n-slices of 16 rows per warp
  constexpr int kK = T::kDepth;
  constexpr int kLd = T::kLdAB;
  const int64_t k_total = ws[0].cols;
  const int warp = threadIdx.x / 32;
  const int m_frag = kSmall ? 0 : warp;   // this warp's 16 tokens
  const int n_first = kSmall ? warp : 0;  // this warp's first 16-row n-slice
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
  for (int64_t k0 = 0; k0 < k_total; k0 += kK) {
    load_tiles<T, F, kVec>(ws, n0, k0, s);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kK; kk += 16) {
      FragA fa;
      wmma::load_matrix_sync(fa, s.in.a + (16 * m_frag) * kLd + kk, kLd);
#pragma unroll
      for (int w = 0; w < kNumW; ++w) {
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
          FragB fb;
          wmma::load_matrix_sync(fb, s.in.b[w] + (16 * (n_first + j)) * kLd + kk, kLd);
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
      const int64_t k_end = k0 + kK;
      if (k_end % Weight::kFp8BlockSize == 0 || k_end >= k_total) {
#pragma unroll
        for (int w = 0; w < kNumW; ++w) {
          const float scale = element_scale<F>(ws[w], n0, k0);
#pragma unroll
          for (int j = 0; j < kFrags; ++j) {
#pragma unroll
            for (int q = 0; q < acc[w][j].num_elements; ++q) {
              acc[w][j].x[q] = __fmaf_rn(scale, block_acc[w][j].x[q], acc[w][j].x[q]);
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
      wmma::store_matrix_sync(s.c[w] + (16 * m_frag) * kLdC + 16 * (n_first + j), acc[w][j], kLdC,
                              wmma::mem_row_major);
    }
  }
  __syncthreads();
}

// The large tile, for the linears of many tokens: 128 tokens x kBN rows per block of
// kLargeThreads (warp i owns tokens 16 i .. + 16 and all kBN rows, as in the big tile),
// k steps of 32 through two shared-memory stages: the next step's global loads are
// issued before this step's MMAs and stored to the other stage after them, so their
// latency hides behind the MMAs (one barrier per step). The MMA sequence per element is
// the other tiles' (so are the bits).
constexpr int kLargeThreads = 256;
static_assert(LargeTile::kTokens == 16 * (kLargeThreads / 32), "16 tokens per warp");

struct LargeSmem {
  static constexpr int kLd = LargeTile::kLdAB;
  union {
    struct {
      alignas(128) __nv_bfloat16 a[2][LargeTile::kTokens * kLd];  // [stage][tokens, 32]
      alignas(128) __nv_bfloat16 b[2][kBN * kLd];                 // [stage][kBN, 32]
    } in;
    alignas(128) float c[LargeTile::kTokens * kLdC];  // [tokens, kBN], after the k loop
  };
  const float* rows[LargeTile::kTokens];  // activation row per tile row, or null
};

// One k step's global data in registers between its fetch and its stash (full steps with
// 16-byte loads only).
template <WFmt F>
struct LargeStep {
  static constexpr int kK = LargeTile::kDepth;
  static constexpr int kE = kChunkElems<F>;
  static constexpr int kANum = LargeTile::kTokens * kK / 4 / kLargeThreads;  // float4s
  static constexpr int kBChunks = kBN * (kK / kE);
  static constexpr int kBNum = (kBChunks + kLargeThreads - 1) / kLargeThreads;
  static_assert(LargeTile::kTokens * kK / 4 % kLargeThreads == 0, "whole float4s per thread");
  float4 a[kANum];
  uint4 b[kBNum];
};

template <WFmt F>
__device__ __forceinline__ void large_fetch(const WRef& w, int64_t n0, int64_t k0,
                                            const LargeSmem& s, LargeStep<F>& r) {
  using S = LargeStep<F>;
#pragma unroll
  for (int j = 0; j < S::kANum; ++j) {
    const int i = threadIdx.x + j * kLargeThreads;
    const int m = i / (S::kK / 4);
    const int kk = 4 * (i % (S::kK / 4));
    r.a[j] = s.rows[m] != nullptr ? __ldg(reinterpret_cast<const float4*>(s.rows[m] + k0 + kk))
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int j = 0; j < S::kBNum; ++j) {
    const int i = threadIdx.x + j * kLargeThreads;
    const int n = i / (S::kK / S::kE);
    const int kk = (i % (S::kK / S::kE)) * S::kE;
    r.b[j] = i < S::kBChunks ? fetch_weight_chunk<F>(w, n0 + n, k0 + kk) : make_uint4(0, 0, 0, 0);
  }
}

template <WFmt F>
__device__ __forceinline__ void large_stash(const WRef& w, int64_t n0, int64_t k0,
                                            const LargeStep<F>& r, __nv_bfloat16* a,
                                            __nv_bfloat16* b) {
  using S = LargeStep<F>;
  constexpr int kLd = LargeSmem::kLd;
#pragma unroll
  for (int j = 0; j < S::kANum; ++j) {
    const int i = threadIdx.x + j * kLargeThreads;
    stash_x4(r.a[j], a + (i / (S::kK / 4)) * kLd + 4 * (i % (S::kK / 4)));
  }
#pragma unroll
  for (int j = 0; j < S::kBNum; ++j) {
    const int i = threadIdx.x + j * kLargeThreads;
    if (i < S::kBChunks) {
      const int n = i / (S::kK / S::kE);
      const int kk = (i % (S::kK / S::kE)) * S::kE;
      stash_weight_chunk<F>(w, n0 + n, k0 + kk, r.b[j], b + n * kLd + kk);
    }
  }
}

// c = A W[n0 : n0 + kBN]^T for the 128 activation rows in s.rows, by the large tile.
template <WFmt F, bool kVec>
__device__ __forceinline__ void mma_tile_large(const WRef& w, int64_t n0, LargeSmem& s) {
  constexpr int kK = LargeTile::kDepth;
  constexpr int kLd = LargeSmem::kLd;
  constexpr int kFrags = kBN / 16;
  const int64_t k_total = w.cols;
  const int warp = threadIdx.x / 32;
  const WRef ws[1] = {w};
  // A step into stage `stage` at once (the first step, and steps the pipeline cannot take:
  // a partial last step, or rows that are not 16-byte aligned).
  const auto stage_now = [&](int64_t k0, int stage) {
    __nv_bfloat16* const b[1] = {s.in.b[stage]};
    stage_step<LargeTile::kTokens, kK, kLd, kLargeThreads, F, kVec>(ws, n0, k0, s.rows,
                                                                    s.in.a[stage], b);
  };
  FragC acc[kFrags];
  FragC block_acc[F == WFmt::kFp8 ? kFrags : 1];
#pragma unroll
  for (int j = 0; j < kFrags; ++j) wmma::fill_fragment(acc[j], 0.0f);
  if constexpr (F == WFmt::kFp8) {
#pragma unroll
    for (int j = 0; j < kFrags; ++j) wmma::fill_fragment(block_acc[j], 0.0f);
  }
  stage_now(0, 0);
  __syncthreads();
  int stage = 0;
  for (int64_t k0 = 0; k0 < k_total; k0 += kK, stage ^= 1) {
    const int64_t k1 = k0 + kK;
    const bool pipelined = kVec && k1 + kK <= k_total;
    LargeStep<F> next;
    if (pipelined) large_fetch<F>(w, n0, k1, s, next);
#pragma unroll
    for (int kk = 0; kk < kK; kk += 16) {
      FragA fa;
      wmma::load_matrix_sync(fa, s.in.a[stage] + (16 * warp) * kLd + kk, kLd);
#pragma unroll
      for (int j = 0; j < kFrags; ++j) {
        FragB fb;
        wmma::load_matrix_sync(fb, s.in.b[stage] + (16 * j) * kLd + kk, kLd);
        if constexpr (F == WFmt::kFp8) {
          wmma::mma_sync(block_acc[j], fa, fb, block_acc[j]);
        } else {
          wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
      }
    }
    // The other stage was last read in the previous step, before its closing barrier.
    if (pipelined) {
      large_stash<F>(w, n0, k1, next, s.in.a[stage ^ 1], s.in.b[stage ^ 1]);
    } else if (k1 < k_total) {
      stage_now(k1, stage ^ 1);
    }
    if constexpr (F == WFmt::kFp8) {
      if (k1 % Weight::kFp8BlockSize == 0 || k1 >= k_total) {
        const float scale = element_scale<F>(w, n0, k0);
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
#pragma unroll
          for (int q = 0; q < acc[j].num_elements; ++q) {
            acc[j].x[q] = __fmaf_rn(scale, block_acc[j].x[q], acc[j].x[q]);
          }
          wmma::fill_fragment(block_acc[j], 0.0f);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kFrags; ++j) {
    wmma::store_matrix_sync(s.c + (16 * warp) * kLdC + 16 * j, acc[j], kLdC, wmma::mem_row_major);
  }
  __syncthreads();
}

}  // namespace hyserve::cuda::tile
