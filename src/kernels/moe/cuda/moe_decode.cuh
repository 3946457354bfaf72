// The MoE's decode experts on tensor cores: experts with 1..16 tokens (every expert of a
// decode step, but for the rare crowded one), BF16, FP8 (128x128 block scales) and MXFP4
// weights. These calls are bound by reading the experts' weights once, so the kernels are
// built around the weight stream; the math goes to mma.sync m16n8k16 (bf16 in, fp32
// accumulate), which leaves the issue slots to the loads and the e2m1 / e4m3 decode.
//
// Work. A unit is a 16-row tile of gate with the same rows of up (gate/up kernel), or two
// 16-row tiles of down (down kernel), of one expert, with all of the expert's tokens, over
// the whole k. The kernels are persistent: warp w of the grid takes units w, w + W, ...
// (W warps in all) and streams their weight rows as one sequence of stages (128 contiguous
// bytes of each of the unit's 32 rows) through its own ring of kRing stages in shared
// memory, filled by cp.async (no registers hold bytes in flight; kRing - 1 stages are in
// flight across unit boundaries); a unit's result is written as soon as its last stage is
// multiplied. The units of one kernel
// are the experts of one token-count class (DecodeUnit lists, made once per call after the
// bucketing, each entry the expert's pointers and its tokens: one load finds a unit).
//
// Fragments. Lane (g = lane / 4, t = lane % 4) reads, in iteration i, chunk 4i + t of its
// rows g and g + 8 of each tile from the ring: 8 BF16, 16 FP8 or 32 MXFP4 consecutive elements of a
// row (one MXFP4 scale group). The chunk is decoded into bf16 pairs R[0 .. E/2): BF16 and FP8 in
// element order (R[r] = elements 2r, 2r + 1), MXFP4 in the order its bit trick gives (word j,
// shifted by 4p: R[4j + p] = elements 8j + 3 - p, 8j + 7 - p). k-step s of the iteration uses
// R[2s], R[2s + 1] as the A fragment's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9): a permutation of
// k inside the iteration, applied to the activations alike. So the activations are stored
// pre-permuted (split_offset): the 8 bf16 values a lane needs for two k-steps are one 16-byte load,
// and the 4 lanes of a column read 64 contiguous bytes.
//
// Precision. The weights are exact in bf16 (BF16; e4m3 values; e2m1 times the e8m0 scale,
// by a bf16 multiply of powers of two). The activations are fp32; with
// MoeDecodeInput::kFp32 each is split into three bf16 terms x = b1 + b2 + b3 (exact for
// normal floats: each term takes the next 8 significant bits), every product is exact, and
// only the tensor cores' fp32 adds and the order of the sum differ from the CPU op's fp32
// dot. The terms are columns of the B operand: an n-tile holds 2 tokens x 3 terms (columns
// 2j + e: term j of token e; 6 and 7 zero), so a token alone costs one MMA per k-step, and
// the epilogue adds a token's three columns (lanes t = 0, 1, 2 of a row) with two shuffles,
// in a fixed order. kBf16 uses b1 only, 8 tokens per n-tile (the prefill tiles'
// precision). FP8 sums each iteration's 64 k (half a scale block) in its own accumulator,
// scaled by the block scale into the total.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/moe/cuda/moe_common.cuh"
#include "kernels/moe/cuda/split_terms.cuh"

namespace hyserve::cuda::moe_internal::decode {

constexpr int kWarps = 4;  // per block
constexpr int kThreads = 32 * kWarps;
constexpr int kGateUpRows = 16;  // gate rows (and the same up rows) per unit
constexpr int kDownRows = 32;    // down rows per unit: two 16-row tiles
constexpr int kMaxTerms = 3;
constexpr int kClasses = 4;  // token-count classes: n-tiles 1, 2, 4, 8

// Tokens per n-tile with `terms` bf16 terms per activation (columns 8 / terms, rounded
// down: 2 with three terms, 8 with one).
HYSERVE_HOST_DEVICE constexpr int tokens_per_tile(int terms) {
  return 8 / terms;
}

// The class (log2 of the n-tiles, rounded up to a power of two) of an expert with n tokens,
// 1 <= n <= 16; the kernel of class c runs 1 << c n-tiles.
HYSERVE_HOST_DEVICE constexpr int token_class(int n, int terms) {
  const int tiles = (n + tokens_per_tile(terms) - 1) / tokens_per_tile(terms);
  return tiles <= 1 ? 0 : tiles <= 2 ? 1 : tiles <= 4 ? 2 : 3;
}

// The fewest tokens an expert of class c has.
HYSERVE_HOST_DEVICE constexpr int class_min_tokens(int c, int terms) {
  return c == 0 ? 1 : ((1 << (c - 1)) * tokens_per_tile(terms)) + 1;
}

// One unit list entry: an expert of the class, its matrices and its tokens.
struct DecodeUnit {
  ExpertPtrs w;
  int32_t begin;  // first sorted position
  int32_t count;
};

// The formats these kernels take (others run the GEMV kernels).
constexpr bool supported(WFmt f) {
  return f == WFmt::kBF16 || f == WFmt::kFp8 || f == WFmt::kMxfp4;
}

// Elements per 16-byte chunk and per iteration (4 chunks: the 4 lanes of a row).
constexpr int chunk_elems(WFmt f) {
  return f == WFmt::kMxfp4 ? 32 : f == WFmt::kFp8 ? 16 : 8;
}
constexpr int64_t iteration_elems(WFmt f) {
  return 4 * chunk_elems(f);
}

// Columns of a split activation row: cols rounded up to whole iterations (zeros beyond).
constexpr int64_t split_cols(WFmt f, int64_t cols) {
  return (cols + iteration_elems(f) - 1) / iteration_elems(f) * iteration_elems(f);
}

// Where column k of an activation row is stored in its split row (see the top).
template <WFmt F>
__device__ __forceinline__ int64_t split_offset(int64_t k) {
  constexpr int kE = chunk_elems(F);
  const int64_t it = k / (4 * kE);
  const int within = static_cast<int>(k - it * 4 * kE);
  const int t = within / kE;
  const int e = within % kE;
  int r, half;
  if constexpr (F == WFmt::kMxfp4) {
    const int m = e % 8;
    half = m >= 4 ? 1 : 0;
    r = (e / 8) * 4 + (half != 0 ? 7 - m : 3 - m);
  } else {
    r = e / 2;
    half = e % 2;
  }
  return it * 4 * kE + (r / 4) * 32 + t * 8 + (r % 4) * 2 + half;
}

using moe_internal::split_terms;

// Rows of activations (fp32 [rows, cols]) into split rows: dst[term][row][split_cols].
template <WFmt F, int kTerms>
__global__ void split_kernel(const float* __restrict__ src, int64_t rows, int64_t cols,
                             uint16_t* __restrict__ dst) {
  const int64_t padded = split_cols(F, cols);
  const int64_t plane = rows * padded;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < plane;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / padded;
    const int64_t k = i - r * padded;
    uint16_t terms[kTerms];
    split_terms<kTerms>(k < cols ? src[r * cols + k] : 0.0f, terms);
    const int64_t at = r * padded + split_offset<F>(k);
#pragma unroll
    for (int j = 0; j < kTerms; ++j) dst[j * plane + at] = terms[j];
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a constant after unrolling
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The unit lists: lists[c][0 .. counts[c]) = the active experts of class c (at most
// decode_max tokens), in any order (a unit's result does not depend on it). One block.
__global__ void __launch_bounds__(1024)
    units_kernel(const int4* __restrict__ active, const ExpertPtrs* __restrict__ table,
                 int64_t num_experts, int32_t decode_max, int terms, DecodeUnit* __restrict__ lists,
                 int32_t* __restrict__ counts) {
  __shared__ int32_t n_class[kClasses];
  if (threadIdx.x < kClasses) n_class[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < num_experts; i += blockDim.x) {
    const int4 rec = active[i];
    if (rec.x < 0) break;  // the active records end here
    if (rec.z > decode_max) continue;
    const int c = token_class(rec.z, terms);
    const int32_t at = atomicAdd(&n_class[c], 1);
    lists[c * num_experts + at] = DecodeUnit{table[rec.x], rec.y, rec.z};
  }
  __syncthreads();
  if (threadIdx.x < kClasses) counts[threadIdx.x] = n_class[threadIdx.x];
}

// The weight chunks of one iteration for this lane: [tile][row g, row g + 8].
struct Stage {
  uint4 raw[2][2];
  uint32_t scale[2][2];  // MXFP4: the chunks' e8m0 bytes
  float block_scale[2];  // FP8: each tile's 128x128 block scale (0 for a tile past the rows)
};

// The shared-memory ring. A stage is kIterations iterations of a unit's 32 rows (2 tiles x
// 16 rows): data [row][chunk] (16-byte chunks; an odd row's chunks swapped in halves, c ^ 4,
// so that the 8 lanes of one shared load, rows g and g + 1, hit distinct banks), then meta:
// MXFP4 the chunks' scale bytes [row][chunk], FP8 the tiles' block scales [tile][iteration]
// (one 32-bit word each; BF16 scales as the aligned word that holds them).
constexpr int kIterations = 2;   // per stage: 128 contiguous bytes of each row
constexpr int kDefaultRing = 3;  // stages per warp, kRing - 1 of them in flight
constexpr int kRows = 32;
constexpr int kStageChunks = 4 * kIterations;                       // per row
constexpr int kMetaWords = kRows * kStageChunks / 4;                // 64
constexpr int kSlotChunks = kRows * kStageChunks + kMetaWords / 4;  // 16-byte units
static_assert(kStageChunks >= 8, "the bank swizzle swaps halves of 8 chunks");
static_assert(2 * kIterations <= kMetaWords, "FP8 block scales fit the meta words");

// Stages of a unit over k columns.
constexpr int64_t num_stages(WFmt f, int64_t k) {
  return (k + kIterations * iteration_elems(f) - 1) / (kIterations * iteration_elems(f));
}

// The k split (DecodeArgs::parts) of class 0: at most kMaxParts parts of at least 2 stages,
// at most kMaxItems work items; more parts only where they fill the rounds of work over the
// resident warps 5% better.
constexpr int64_t kMaxParts = 8;
constexpr int64_t kMaxItems = 16384;
constexpr size_t kPartialBytes = 32 * 2 * 4 * sizeof(float);  // one class-0 item's sums
inline int64_t choose_parts(int64_t units, int64_t warps, int64_t stages) {
  int64_t best = 1;
  double best_fill = 0.0;
  for (int64_t parts = 1; parts <= kMaxParts; parts *= 2) {
    if (parts > 1 && (units * parts > kMaxItems || 2 * parts > stages)) break;
    const auto items = static_cast<double>(units * parts);
    const double rounds = static_cast<double>((units * parts + warps - 1) / warps);
    const double fill = items / (rounds * static_cast<double>(warps));
    if (fill > best_fill * 1.05) {
      best = parts;
      best_fill = fill;
    }
  }
  return best;
}

// Dynamic shared memory of one experts_kernel block.
constexpr size_t smem_bytes(int ring = kDefaultRing) {
  return static_cast<size_t>(kWarps) * ring * kSlotChunks * 16;
}

// Asynchronous copies into shared memory; ok = false fills zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool ok) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// FP8 block scale index of (row r, column k).
__device__ __forceinline__ int64_t block_scale_index(const WRef& w, int64_t r, int64_t k) {
  const int64_t scale_cols = (w.cols + Weight::kFp8BlockSize - 1) / Weight::kFp8BlockSize;
  return (r / Weight::kFp8BlockSize) * scale_cols + k / Weight::kFp8BlockSize;
}

// Issues stage `stage` of a unit (matrices w, first rows rbase) into `slot`. scale_words:
// MXFP4 scale rows are whole 4-byte words (cols / 32 a multiple of 4, 4-byte aligned);
// otherwise the scale bytes are loaded and stored synchronously (slow, correct).
template <WFmt F>
__device__ __forceinline__ void copy_stage(const WRef (&w)[2], const int64_t (&rbase)[2],
                                           int64_t stage, int lane, bool scale_words, uint4* slot) {
  constexpr int kE = chunk_elems(F);
  constexpr int kRowsPerCopy = 32 / kStageChunks;  // rows one warp-wide copy covers
  const int64_t chunks = w[0].cols / kE;
  const int64_t c0 = stage * kStageChunks;
  const int c = lane % kStageChunks;
  const int lrow = lane / kStageChunks;
  const bool col_ok = c0 + c < chunks;
  // Lane (lrow, c) copies chunk c of rows lrow, lrow + 4, ... of each tile: 8 lanes read a
  // row's 128 contiguous bytes. The rows of one lane have one parity (one swizzle).
  uint4* const dst = slot + lrow * kStageChunks + (c ^ ((lrow & 1) << 2));
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const auto* base = reinterpret_cast<const uint4*>(w[m].data);
    const int64_t r0 = rbase[m] + lrow;
    const uint4* src = base + r0 * chunks + c0 + c;
#pragma unroll
    for (int i = 0; i < 16 / kRowsPerCopy; ++i) {
      const bool ok = col_ok && r0 + i * kRowsPerCopy < w[m].rows;
      cp_async16(dst + (m * 16 + i * kRowsPerCopy) * kStageChunks, ok ? src : base, ok);
      src += kRowsPerCopy * chunks;
    }
  }
  auto* meta = reinterpret_cast<uint32_t*>(slot + kRows * kStageChunks);
  if constexpr (F == WFmt::kMxfp4) {
    // Word (row, q) holds the scale bytes of chunks 4q .. 4q + 3 of the stage: lane
    // (row % 16, q) of copy m.
    static_assert(kStageChunks / 4 == 2, "two scale words per row");
    const int q = lane % 2;
    const int64_t cc = c0 + 4 * q;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int64_t r = rbase[m] + lane / 2;
      const bool ok = r < w[m].rows && cc < chunks;
      const auto* scales = static_cast<const uint8_t*>(w[m].scales);
      uint32_t* to = meta + (m * 16 + lane / 2) * 2 + q;
      if (scale_words) {
        cp_async4(to, scales + (ok ? r * chunks + cc : 0), ok);
      } else {
        uint32_t v = 0;
        for (int b = 0; b < 4; ++b) {
          if (ok && cc + b < chunks) {
            v |= static_cast<uint32_t>(__ldg(scales + r * chunks + cc + b)) << (8 * b);
          }
        }
        *to = v;
      }
    }
  } else if constexpr (F == WFmt::kFp8) {
    // A bf16 scale's aligned word: the scales of a matrix start on an allocation of at
    // least 256 bytes or inside one, so the word is always inside it.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      if (lane / kIterations != m) continue;  // lanes 0 .. 2 kIterations - 1
      const int64_t k = (stage * kIterations + lane % kIterations) * 4 * kE;
      const bool ok = rbase[m] < w[m].rows && k < w[m].cols;
      const int64_t i = ok ? block_scale_index(w[m], rbase[m], k) : 0;
      const void* src =
          w[m].scales_bf16
              ? reinterpret_cast<const void*>(
                    reinterpret_cast<uintptr_t>(static_cast<const uint16_t*>(w[m].scales) + i) &
                    ~uintptr_t{3})
              : static_cast<const float*>(w[m].scales) + i;
      cp_async4(meta + lane, src, ok);
    }
  }
}

// Some MXFP4 scale of this lane's iteration is 2^2 or more (e8m0 129 .. 254).
__device__ __forceinline__ bool wide_scale(const Stage& s) {
  bool wide = false;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) wide = wide || (s.scale[m][h] > 128u && s.scale[m][h] != 255u);
  return wide;
}

// Iteration j of a stage in `slot`, this lane's part (see Stage).
template <WFmt F>
__device__ __forceinline__ void read_stage(const uint4* slot, int j, int lane, const WRef (&w)[2],
                                           const int64_t (&rbase)[2], int64_t it, Stage& s) {
  const int g = lane / 4;
  const int c = 4 * j + lane % 4;
  const auto* meta = reinterpret_cast<const uint32_t*>(slot + kRows * kStageChunks);
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m * 16 + h * 8 + g;
      s.raw[m][h] = slot[row * kStageChunks + (c ^ ((g & 1) << 2))];
      if constexpr (F == WFmt::kMxfp4) {
        s.scale[m][h] = reinterpret_cast<const uint8_t*>(meta)[row * kStageChunks + c];
      }
    }
    if constexpr (F == WFmt::kFp8) {
      const uint32_t word = meta[m * kIterations + j];
      if (w[m].scales_bf16) {
        const int64_t i = block_scale_index(w[m], rbase[m], it * 4 * chunk_elems(F));
        const auto at = reinterpret_cast<uintptr_t>(static_cast<const uint16_t*>(w[m].scales) + i);
        s.block_scale[m] = __uint_as_float(((at & 2) != 0 ? word >> 16 : word & 0xffffu) << 16);
      } else {
        s.block_scale[m] = __uint_as_float(word);
      }
    }
  }
}

// The bf16 pairs R[4j .. 4j + 3] of a chunk (piece j: the pairs two k-steps use). kWide:
// some MXFP4 scale of the warp's iteration is above 2^1 (see below; trained weights have
// none, so the second multiply is a separate, warp-uniform path).
template <WFmt F, bool kWide>
__device__ __forceinline__ void decode_piece(const uint4& raw, uint32_t scale, int j,
                                             uint32_t (&out)[4]) {
  if constexpr (F == WFmt::kBF16) {
    out[0] = raw.x;
    out[1] = raw.y;
    out[2] = raw.z;
    out[3] = raw.w;
  } else if constexpr (F == WFmt::kFp8) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t word = word_of(raw, 2 * j + q / 2);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((word >> (16 * (q % 2))) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));  // e4m3 -> f16 -> f32 -> bf16: exact
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      out[q] = *reinterpret_cast<const uint32_t*>(&b);
    }
  } else {
    // e2m1 nibble S.EEM at bits 12..15 (and 28..31) -> bf16 S at 15, EEM at 8..6: the value
    // times 2^-126 (E = 0 a bf16 subnormal). The scale 2^(s - 127) times 2^126 = 2^(s - 1)
    // is one bf16 power of two for s <= 128; above, two multiplies (2^127, 2^(s - 128));
    // s = 255 is NaN as on the CPU.
    const bool nan = scale == 255u;
    const bool big = scale > 128u && !nan;
    const uint32_t e1 = (big ? 128u : scale) + 126u;
    const uint32_t m1 = nan ? 0x7fc07fc0u : (e1 << 7) | (e1 << 23);
    const uint32_t e2 = scale - 1u;  // 2^(s - 128) for big
    const uint32_t m2 = (e2 << 7) | (e2 << 23);
    const uint32_t word = word_of(raw, j);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t q = word << (4 * p);
      uint32_t v = (q & 0x80008000u) | ((q >> 6) & 0x01c001c0u);
      v = bf16x2_mul(v, m1);
      if (kWide && big) v = bf16x2_mul(v, m2);
      out[p] = v;
    }
  }
}

// The MMAs of one iteration: acc[m][n] += tile m's 16 rows x n-tile n's 8 columns over this
// iteration's k. bcol[n]: the lane's column of n-tile n (a split row, its term's plane) or
// null (a zero column).
// The activations of iteration it: bv[j][n] = the 8 bf16 values of n-tile n that k-steps
// 2j, 2j + 1 use.
template <WFmt F, int kNT>
struct Columns {
  uint4 bv[chunk_elems(F) / 8][kNT];
};

template <WFmt F, int kNT>
__device__ __forceinline__ void load_columns(const uint16_t* const (&bcol)[kNT], int64_t it,
                                             int lane, Columns<F, kNT>& c) {
  constexpr int kE = chunk_elems(F);
  const int64_t col = it * 4 * kE + (lane % 4) * 8;
#pragma unroll
  for (int j = 0; j < kE / 8; ++j) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      c.bv[j][n] = bcol[n] != nullptr
                       ? __ldg(reinterpret_cast<const uint4*>(bcol[n] + col + j * 32))
                       : make_uint4(0, 0, 0, 0);
    }
  }
}

template <WFmt F, int kNT, bool kWide>
__device__ __forceinline__ void mma_stage(const Stage& s, const Columns<F, kNT>& c,
                                          float (&acc)[2][kNT][4]) {
  constexpr int kE = chunk_elems(F);
  constexpr bool kFp8 = F == WFmt::kFp8;
  float part[2][kNT][4];
  if constexpr (kFp8) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[m][n][e] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kE / 8; ++j) {
    const uint4(&bv)[kNT] = c.bv[j];
    uint32_t a[2][2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) decode_piece<F, kWide>(s.raw[m][h], s.scale[m][h], j, a[m][h]);
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          float(&d)[4] = kFp8 ? part[m][n] : acc[m][n];
          mma_bf16(d, a[m][0][2 * ks], a[m][1][2 * ks], a[m][0][2 * ks + 1], a[m][1][2 * ks + 1],
                   word_of(bv[n], 2 * ks), word_of(bv[n], 2 * ks + 1));
        }
      }
    }
  }
  if constexpr (kFp8) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] += s.block_scale[m] * part[m][n][e];
  }
}

// Split activation rows: term j of row r at data + j * plane + r * cols (cols = split_cols).
struct SplitRows {
  uint16_t* data;
  int64_t plane;
  int64_t cols;
};

// What a kernel's units read and write.
struct DecodeArgs {
  Geometry g;
  const DecodeUnit* units;  // the class's list
  const int32_t* count;     // its length
  const int32_t* sorted_slots;
  SplitRows in;      // gate/up: x by token; down: h by sorted position
  SplitRows h;       // gate/up's output (down's layout)
  float* slot_out;   // down's output
  bool scale_words;  // MXFP4: this kernel's scale rows are whole aligned words (copy_stage)
  // k split: each unit's stages are cut into `parts` runs of (nearly) equal length, taken by
  // different warps; a part's accumulators go to partials, and the last part of a unit to
  // arrive (arrivals, zero before the kernel and after it) adds them in part order and
  // finishes the unit, so the result does not depend on which warp finishes last.
  int32_t parts;
  float* partials;    // [units * parts][32 lanes][2 * kNT * 4]
  int32_t* arrivals;  // [units]
};

// Units of class log2(kNT): gate/up (kGateUp) or down, kTerms bf16 terms per activation.
template <WFmt F, int kTerms, int kNT, bool kGateUp, int kRing = kDefaultRing>
__global__ void __launch_bounds__(kThreads) experts_kernel(DecodeArgs args) {
  constexpr int kP = tokens_per_tile(kTerms);
  const Geometry& g = args.g;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int gq = lane / 4;
  const int t = lane % 4;
  const int64_t tiles = kGateUp ? (args.h.cols + kGateUpRows - 1) / kGateUpRows
                                : (g.hidden + kDownRows - 1) / kDownRows;
  const int64_t parts = args.parts;
  const int64_t total = static_cast<int64_t>(*args.count) * tiles * parts;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (first >= total) return;
  const int64_t k = kGateUp ? g.hidden : g.inter;
  const int64_t num_iters = (k + iteration_elems(F) - 1) / iteration_elems(F);

  // Work item u is part u % parts of unit u / parts: its matrices and first rows.
  const auto unit_weights = [&](int64_t u, WRef(&w)[2], int64_t(&rbase)[2]) {
    const DecodeUnit& d = args.units[u / parts / tiles];
    const int64_t tile = u / parts % tiles;
    if constexpr (kGateUp) {
      w[0] = with_expert(g.gate, d.w, 0);
      w[1] = with_expert(g.up, d.w, 1);
      rbase[0] = rbase[1] = tile * kGateUpRows;
    } else {
      w[0] = w[1] = with_expert(g.down, d.w, 2);
      rbase[0] = tile * kDownRows;
      rbase[1] = rbase[0] + 16;
    }
  };

  // Loader: the next stage to copy (unit lu, stage ls) into ring slot lslot.
  extern __shared__ uint4 smem[];
  uint4* const ring = smem + (threadIdx.x / 32) * kRing * kSlotChunks;
  const int64_t num_stages = (num_iters + kIterations - 1) / kIterations;
  // The stages [first, end) of work item u.
  const auto stage_begin = [&](int64_t u) { return u % parts * num_stages / parts; };
  const auto stage_end = [&](int64_t u) { return (u % parts + 1) * num_stages / parts; };
  int64_t lu = first, ls = stage_begin(first), lend = stage_end(first);
  WRef lw[2];
  int64_t lrb[2];
  unit_weights(lu, lw, lrb);
  const auto copy_next = [&](int slot) {
    if (lu < total) {
      copy_stage<F>(lw, lrb, ls, lane, args.scale_words, ring + slot * kSlotChunks);
      if (++ls == lend) {
        lu += stride;
        if (lu < total) {
          unit_weights(lu, lw, lrb);
          ls = stage_begin(lu);
          lend = stage_end(lu);
        }
      }
    }
    cp_async_commit();  // an empty group past the last unit keeps the count uniform
  };
#pragma unroll
  for (int slot = 0; slot < kRing - 1; ++slot) copy_next(slot);

  // Compute: unit cu, stage cs, its columns and sums.
  int64_t cu = first, cs = 0, cend = 0;
  WRef cw[2];
  int64_t crb[2];
  int32_t begin = 0, count = 0;
  const uint16_t* bcol[kNT];
  float acc[2][kNT][4];
  // The next iteration's activations are loaded while this one is multiplied, where the
  // registers allow (at most 4 16-byte loads per lane).
  constexpr bool kPrefetch = chunk_elems(F) / 8 * kNT <= 4;
  Columns<F, kNT> next_cols;
  const auto start_unit = [&]() {
    const DecodeUnit& d = args.units[cu / parts / tiles];
    begin = d.begin;
    count = d.count;
    unit_weights(cu, cw, crb);
    cs = stage_begin(cu);
    cend = stage_end(cu);
    const int term = gq / kP;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const int m = n * kP + gq % kP;
      const int64_t row =
          kGateUp ? (m < count ? args.sorted_slots[begin + m] / g.top_k : 0) : begin + m;
      bcol[n] = term < kTerms && m < count
                    ? args.in.data + term * args.in.plane + row * args.in.cols
                    : nullptr;
#pragma unroll
      for (int mm = 0; mm < 2; ++mm)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mm][n][e] = 0.0f;
    }
    if constexpr (kPrefetch) load_columns<F, kNT>(bcol, cs * kIterations, lane, next_cols);
  };
  start_unit();

  // A finished unit: each lane's accumulator e is (row g + 8 (e / 2), column 2t + e % 2);
  // with three terms, column 2j + e is term j of token e: the lanes t = 0, 1, 2 of a row
  // are added ((b1 + b2) + (b3 + 0)), and lane t writes value e = t.
  const auto finish_unit = [&]() {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int mm = 0; mm < 2; ++mm) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kTerms > 1) {
            float v = acc[mm][n][e];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            acc[mm][n][e] = v;
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (kTerms > 1 && e != t) continue;
        const int m = kTerms > 1 ? n * kP + e % 2 : n * kP + 2 * t + e % 2;
        if (m >= count) continue;
        const int64_t dr = gq + (e >= 2 ? 8 : 0);
        if constexpr (kGateUp) {
          const int64_t row = crb[0] + dr;
          if (row >= args.h.cols) continue;
          uint16_t terms[kTerms];
          split_terms<kTerms>(
              row < g.inter ? gated_activation(acc[0][n][e], acc[1][n][e], g.act) : 0.0f, terms);
          const int64_t at = (begin + m) * args.h.cols + split_offset<F>(row);
#pragma unroll
          for (int j = 0; j < kTerms; ++j) args.h.data[j * args.h.plane + at] = terms[j];
        } else {
          const int64_t out = static_cast<int64_t>(args.sorted_slots[begin + m]) * g.hidden;
#pragma unroll
          for (int mm = 0; mm < 2; ++mm) {
            const int64_t row = crb[mm] + dr;
            if (row < g.hidden) args.slot_out[out + row] = acc[mm][n][e];
          }
        }
      }
    }
  };

  // A k-split part done: its accumulators stored; true (with acc = the unit's sums) in the
  // unit's last part to arrive.
  const auto last_part = [&]() {
    constexpr int kAcc = 2 * kNT * 4;
    float* mine = args.partials + (cu * 32 + lane) * kAcc;
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
        __stcg(reinterpret_cast<float4*>(mine + (mm * kNT + n) * 4),
               make_float4(acc[mm][n][0], acc[mm][n][1], acc[mm][n][2], acc[mm][n][3]));
    __threadfence();
    __syncwarp();
    const int64_t unit = cu / parts;
    int last = 0;
    if (lane == 0) last = atomicAdd(args.arrivals + unit, 1) == parts - 1 ? 1 : 0;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (last == 0) return false;
    __threadfence();
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mm][n][e] = 0.0f;
    for (int64_t p = 0; p < parts; ++p) {
      const float* part = args.partials + ((unit * parts + p) * 32 + lane) * kAcc;
#pragma unroll
      for (int mm = 0; mm < 2; ++mm)
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(part + (mm * kNT + n) * 4));
          acc[mm][n][0] += v.x;
          acc[mm][n][1] += v.y;
          acc[mm][n][2] += v.z;
          acc[mm][n][3] += v.w;
        }
    }
    if (lane == 0) args.arrivals[unit] = 0;  // for the next kernel
    return true;
  };

  // One sequence over this warp's units: slot (i mod kRing) holds the i-th stage; when
  // stage i is computed, stages i + 1 .. i + kRing - 2 are in flight and i + kRing - 1 is
  // issued into the slot stage i - 1 left (every lane is past it: the __syncwarp).
  for (int slot = 0;; slot = slot + 1 == kRing ? 0 : slot + 1) {
    cp_async_wait<kRing - 2>();
    __syncwarp();
    copy_next(slot == 0 ? kRing - 1 : slot - 1);
    const uint4* here = ring + slot * kSlotChunks;
#pragma unroll
    for (int j = 0; j < kIterations; ++j) {
      const int64_t it = cs * kIterations + j;
      if (it < num_iters) {
        Columns<F, kNT> cols;
        if constexpr (kPrefetch) {
          cols = next_cols;
          if (it + 1 < num_iters) load_columns<F, kNT>(bcol, it + 1, lane, next_cols);
        } else {
          load_columns<F, kNT>(bcol, it, lane, cols);
        }
        Stage st;
        read_stage<F>(here, j, lane, cw, crb, it, st);
        bool wide = false;
        if constexpr (F == WFmt::kMxfp4) wide = __any_sync(0xffffffffu, wide_scale(st));
        if (wide) {
          mma_stage<F, kNT, true>(st, cols, acc);
        } else {
          mma_stage<F, kNT, false>(st, cols, acc);
        }
      }
    }
    if (++cs == cend) {
      if (parts == 1 || last_part()) finish_unit();
      cu += stride;
      if (cu >= total) break;
      start_unit();
    }
  }
  cp_async_wait<0>();
}

}  // namespace hyserve::cuda::moe_internal::decode
