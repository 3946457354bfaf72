// The MoE prefill experts: grouped GEMMs on Hopper warpgroup MMAs for the experts with more
// than kMoeDecodeMaxTokens tokens (BF16, FP8 and MXFP4 weights; moe.cu launches them).
//
// Work: a unit is one expert's tile of up to kBM = 128 sorted positions (scan_kernel lists
// them, an expert's tiles adjacent); an item is (unit, n-tile). A persistent grid walks the
// items in order, so the blocks running at once share the unit's activation rows and the
// expert's weight tiles in L2.
//   gate/up  A = x[token of each position] as bf16 (x rounded once per call), B = kBN / 2
//            gate rows and the same up rows: a thread holds gate and up of one column in
//            its own accumulators, so act(gate, up) is applied there and h (bf16, sorted
//            position order) written directly
//   down     A = h rows of the positions, B = kBN down rows; slot_out[slot] (fp32) written
//            directly, combined later in slot order (deterministic; no atomics)
// Numerics as the tensor-core tiles of mma_tile.cuh: x and act(gate, up) rounded to bf16,
// BF16 and MXFP4 weights exact in bf16, FP8 weights the exact e4m3 values with each
// 128-wide k block's fp32 partial sum times its block scale; fp32 accumulate.
//
// Block: 256 threads = two warpgroups, each the MMAs of 64 of the tile's 128 rows. Shared
// memory: kStages stages of A [128 rows][64 k] and B [kBN rows][64 k] bf16, 128-byte rows,
// 128-byte swizzled (wgmma.cuh). Every thread loads (Loader: a warp's loads cover whole
// sectors): A and BF16 B by cp.async, FP8 / MXFP4 B into registers one iteration ahead, decoded to
// bf16 and stored while the MMAs of the current stage run. Iteration kt: wait for stage kt,
// barrier, issue its MMAs, load stage kt + kStages - 2 into the slot of stage kt - 2 (both
// warpgroups finished it before the barrier), wait until at most the current MMAs are in flight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/cuda/cp_async.cuh"
#include "core/cuda/wgmma.cuh"
#include "kernels/moe/cuda/moe_common.cuh"

namespace hyserve::cuda::moe_internal::prefill {

constexpr int kBM = 128;  // positions per tile: two warpgroups of 64
constexpr int kBK = 64;   // k per stage: one 128-byte row of bf16
constexpr int kThreads = 256;
constexpr int kRowBytes = 128;

constexpr bool supported(WFmt f) {
  return f == WFmt::kBF16 || f == WFmt::kFp8 || f == WFmt::kMxfp4;
}

// Weight rows per tile: 256 (128 accumulators per thread); FP8 128, its k blocks' partial
// sums needing a second set.
constexpr int tile_n(WFmt f) {
  return f == WFmt::kFp8 ? 128 : 256;
}
constexpr int stages(WFmt f) {
  return f == WFmt::kFp8 ? 6 : 4;
}
constexpr size_t stage_bytes(WFmt f) {
  return static_cast<size_t>(kBM + tile_n(f)) * kRowBytes;
}
// Dynamic shared memory: the stages, plus room to align them to 1,024 bytes.
constexpr size_t smem_bytes(WFmt f) {
  return stages(f) * stage_bytes(f) + 1024;
}

// n-tiles of one GEMM: gate/up tiles cover tile_n / 2 columns of h.
inline int64_t n_tiles(WFmt f, bool gate_up, int64_t inter, int64_t hidden) {
  return gate_up ? (inter + tile_n(f) / 2 - 1) / (tile_n(f) / 2)
                 : (hidden + tile_n(f) - 1) / tile_n(f);
}

struct PrefillArgs {
  Geometry g;
  const ExpertPtrs* table = nullptr;
  const int4* units = nullptr;  // {expert, first sorted position, rows, 0}
  const int32_t* count = nullptr;
  const int32_t* sorted_slots = nullptr;
  const uint16_t* a = nullptr;  // gate/up: x as bf16 [tokens, hidden]; down: h
  uint16_t* h = nullptr;        // bf16 [sorted positions, inter]
  float* slot_out = nullptr;    // [slots, hidden]
};

// x rounded to bf16 (as the tensor-core tiles round it).
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

// 2^e as bf16 bits, -126 <= e <= 127.
__device__ __forceinline__ uint32_t bf16_pow2(int e) {
  return static_cast<uint32_t>(e + 127) << 7;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Byte i of w (two e2m1 codes, the lower k first) as bf16x2 of the codes' values times
// 2^-126: sign to bit 15, exponent and mantissa to bits 8..6 (an e2m1 subnormal becomes
// the bf16 subnormal of the same value times 2^-126).
__device__ __forceinline__ uint32_t e2m1x2_scaled_bits(uint32_t w, int i) {
  const uint32_t b = w >> (8 * i);
  return ((b & 0x8u) << 12) | ((b & 0x7u) << 6) | ((b & 0x80u) << 24) | ((b & 0x70u) << 18);
}

// One 16-byte chunk (8 bf16) of MXFP4 values: the 8 codes of word w times 2^(s - 127) for
// the e8m0 scale byte s, exact (one or two power-of-two multiplies; s = 255 is NaN).
__device__ __forceinline__ uint4 mxfp4_chunk(uint32_t w, uint32_t s) {
  // codes * 2^-126 * 2^(min(s, 128) - 1) = codes * 2^(min(s, 128) - 127).
  const uint32_t f1 = bf16_pow2(static_cast<int>(s < 128u ? s : 128u) - 1) * 0x10001u;
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = bf16x2_mul(e2m1x2_scaled_bits(w, i), f1);
  if (s > 128u) {
    const uint32_t f2 = s == 255u ? 0x7fc07fc0u : bf16_pow2(static_cast<int>(s) - 128) * 0x10001u;
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = s == 255u ? f2 : bf16x2_mul(v[i], f2);
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// Two e4m3 codes (the lower k in the low byte) as bf16x2, exact (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_bf16(uint32_t pair) {
  const __half2 h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(h);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Element size in bytes times 2 (MXFP4: half a byte).
constexpr int64_t twice_elem_bytes(WFmt f) {
  return f == WFmt::kBF16 ? 4 : f == WFmt::kFp8 ? 2 : 1;
}

// One work item's loads of its stages by the block's kLoaders threads, so that a warp's loads cover
// whole 32-byte sectors (A and BF16 B go by cp.async past L1, where a half-used sector
// would cost a second L2 request).
//   A: 8 threads per 128-byte row: loader t copies chunk t % 8 of rows t / 8 + kARowStep j.
//   B: kTpr threads per row: loader t takes raw bytes [16 (t % kTpr), +16) of the stage's
//      k range of rows t / kTpr + kStep j (j < kRows; the first half of the j the gate
//      rows of a gate/up tile, the second the up rows); 16 raw bytes become kChunks
//      16-byte chunks of bf16 in shared memory. All of a loader's rows have one swizzle
//      phase (the steps are multiples of 8).
template <WFmt F, bool kGateUp>
struct Loader {
  static constexpr int kLoaders = kThreads;
  static constexpr int kBN = tile_n(F);
  static constexpr int kARows = kBM * 8 / kLoaders;
  static constexpr int kARowStep = kLoaders / 8;
  static constexpr int kRawRowBytes = static_cast<int>(kBK * twice_elem_bytes(F) / 2);
  static constexpr int kTpr = kRawRowBytes / 16;
  static constexpr int kRows = kBN * kTpr / kLoaders;
  static constexpr int kStep = kLoaders / kTpr;
  static constexpr int kHalf = kRows / 2;
  static constexpr int kChunks = 8 / kTpr;
  static_assert(kRows % 2 == 0 && kStep % 8 == 0 && kARowStep % 8 == 0, "one swizzle phase");

  const uint16_t* a_src[kARows];  // null beyond the unit's rows: zeros
  const uint16_t* a_any;          // a valid address for the zero-filling copies
  const uint8_t* b_lo;            // raw bytes of the first row of each half
  const uint8_t* b_hi;
  const uint8_t* s_lo = nullptr;  // MXFP4: the halves' first scale bytes
  const uint8_t* s_hi = nullptr;
  int64_t lo_rows, hi_rows;  // rows of each half from this loader's first one
  int64_t b_row_bytes, scale_cols;
  int a_chunk, a_row0, b_part, b_row0;
  uint4 raw[kRows];
  uint32_t raw_scale = 0;  // MXFP4: byte j the scale of row j's raw bytes

  __device__ __forceinline__ Loader(const PrefillArgs& args, const int4& unit, int64_t nt, int t) {
    const Geometry& g = args.g;
    const int64_t K = kGateUp ? g.hidden : g.inter;
    const int64_t N = kGateUp ? g.inter : g.hidden;
    const ExpertPtrs e = args.table[unit.x];
    a_chunk = t % 8;
    a_row0 = t / 8;
    b_part = t % kTpr;
    b_row0 = t / kTpr;
    a_any = args.a;
#pragma unroll
    for (int j = 0; j < kARows; ++j) {
      const int r = a_row0 + kARowStep * j;
      a_src[j] = nullptr;
      if (r < unit.z) {
        const int64_t pos = unit.y + r;
        const int64_t row = kGateUp ? args.sorted_slots[pos] / g.top_k : pos;
        a_src[j] = args.a + row * K + a_chunk * 8;
      }
    }
    WRef w_lo, w_hi;
    int64_t first_lo, first_hi;
    if constexpr (kGateUp) {
      w_lo = with_expert(g.gate, e, 0);
      w_hi = with_expert(g.up, e, 1);
      first_lo = first_hi = nt * (kBN / 2) + b_row0;
    } else {
      w_lo = w_hi = with_expert(g.down, e, 2);
      first_lo = nt * kBN + b_row0;
      first_hi = first_lo + kHalf * kStep;
    }
    lo_rows = N - first_lo;
    hi_rows = N - first_hi;
    b_row_bytes = K * twice_elem_bytes(F) / 2;
    scale_cols = K / 32;
    b_lo = w_lo.data + (lo_rows > 0 ? first_lo : 0) * b_row_bytes + b_part * 16;
    b_hi = w_hi.data + (hi_rows > 0 ? first_hi : 0) * b_row_bytes + b_part * 16;
    if constexpr (F == WFmt::kMxfp4) {
      s_lo = static_cast<const uint8_t*>(w_lo.scales) + (lo_rows > 0 ? first_lo : 0) * scale_cols +
             b_part;
      s_hi = static_cast<const uint8_t*>(w_hi.scales) + (hi_rows > 0 ? first_hi : 0) * scale_cols +
             b_part;
    }
  }

  __device__ __forceinline__ bool b_valid(int j) const {
    return static_cast<int64_t>(j % kHalf) * kStep < (j < kHalf ? lo_rows : hi_rows);
  }
  __device__ __forceinline__ int64_t b_offset(int j) const {
    return static_cast<int64_t>(j % kHalf) * kStep * b_row_bytes;
  }
  // Shared-memory chunk c of this loader's B row j in the stage's B at `b`.
  __device__ __forceinline__ uint8_t* b_dst(uint8_t* b, int j, int c) const {
    return b + (b_row0 + kStep * j) * kRowBytes + ((c ^ (b_row0 & 7)) << 4);
  }

  // A of stage s (k-step s) into `a` by cp.async.
  __device__ __forceinline__ void load_a(uint8_t* a, int s) const {
    uint8_t* dst = a + a_row0 * kRowBytes + ((a_chunk ^ (a_row0 & 7)) << 4);
#pragma unroll
    for (int j = 0; j < kARows; ++j) {
      cp_async_16(dst + kARowStep * j * kRowBytes, a_src[j] != nullptr ? a_src[j] + s * kBK : a_any,
                  a_src[j] != nullptr ? 16 : 0);
    }
  }
  // BF16 B of stage s straight into `b` by cp.async.
  __device__ __forceinline__ void load_b_async(uint8_t* b, int s) const {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool v = b_valid(j);
      cp_async_16(b_dst(b, j, b_part),
                  v ? (j < kHalf ? b_lo : b_hi) + b_offset(j) + s * kRawRowBytes : b_lo,
                  v ? 16 : 0);
    }
  }
  // FP8 / MXFP4 B of stage s: raw bytes into registers...
  __device__ __forceinline__ void fetch_b(int s) {
    raw_scale = 0;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool v = b_valid(j);
      raw[j] = v ? __ldg(reinterpret_cast<const uint4*>((j < kHalf ? b_lo : b_hi) + b_offset(j) +
                                                        s * kRawRowBytes))
                 : make_uint4(0, 0, 0, 0);
      if constexpr (F == WFmt::kMxfp4) {
        // Byte 2 s + b_part of the row's scales: one per 32 k.
        const uint8_t* sc = (j < kHalf ? s_lo : s_hi) +
                            static_cast<int64_t>(j % kHalf) * kStep * scale_cols + 2 * s;
        raw_scale |= (v ? static_cast<uint32_t>(__ldg(sc)) : 127u) << (8 * j);
      }
    }
  }
  // ...then decoded into `b`.
  __device__ __forceinline__ void store_b(uint8_t* b) const {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const uint4& r = raw[j];
      if constexpr (F == WFmt::kMxfp4) {
        // 32 codes: word i is chunk kChunks b_part + i.
        const uint32_t sc = (raw_scale >> (8 * j)) & 0xffu;
        const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          *reinterpret_cast<uint4*>(b_dst(b, j, kChunks * b_part + i)) = mxfp4_chunk(words[i], sc);
        }
      } else if constexpr (F == WFmt::kFp8) {
        // 16 codes: words x, y are chunk kChunks b_part, z, w the next.
        *reinterpret_cast<uint4*>(b_dst(b, j, kChunks * b_part)) = make_uint4(
            e4m3x2_bf16(r.x), e4m3x2_bf16(r.x >> 16), e4m3x2_bf16(r.y), e4m3x2_bf16(r.y >> 16));
        *reinterpret_cast<uint4*>(b_dst(b, j, kChunks * b_part + 1)) = make_uint4(
            e4m3x2_bf16(r.z), e4m3x2_bf16(r.z >> 16), e4m3x2_bf16(r.w), e4m3x2_bf16(r.w >> 16));
      }
    }
  }
};

// FP8: the block scale of a tile's rows from first_row (within one 128-row block), k block kb.
__device__ __forceinline__ float fp8_block_scale(const WRef& m, int64_t K, int64_t first_row,
                                                 int64_t kb) {
  const int64_t scale_cols = (K + Weight::kFp8BlockSize - 1) / Weight::kFp8BlockSize;
  const int64_t i = (first_row / Weight::kFp8BlockSize) * scale_cols + kb;
  return m.scales_bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(m.scales)[i])
                       : static_cast<const float*>(m.scales)[i];
}

// FP8: acc += scale * blk for the 128-wide k block kb (gate and up halves their own scales).
template <bool kGateUp, int kAcc>
__device__ __forceinline__ void fp8_promote(const PrefillArgs& args, const int4& unit, int64_t nt,
                                            int64_t kb, float (&acc)[kAcc],
                                            const float (&blk)[kAcc]) {
  const Geometry& g = args.g;
  const ExpertPtrs e = args.table[unit.x];
  constexpr int kBN = 2 * kAcc;
  float s_lo, s_hi;
  if constexpr (kGateUp) {
    s_lo = fp8_block_scale(with_expert(g.gate, e, 0), g.hidden, nt * (kBN / 2), kb);
    s_hi = fp8_block_scale(with_expert(g.up, e, 1), g.hidden, nt * (kBN / 2), kb);
  } else {
    s_lo = s_hi = fp8_block_scale(with_expert(g.down, e, 2), g.inter, nt * kBN, kb);
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] += (i < kAcc / 2 ? s_lo : s_hi) * blk[i];
}

// A warpgroup's 64 rows (from row `first` of the tile) of the finished tile: gate/up
// writes act(gate, up) as bf16 h, down writes fp32 slot_out. Accumulator d[4n + 0, 1] = row
// 16 w + lane / 4, columns 8 n + 2 (lane % 4), + 1; d[4n + 2, 3] = row + 8 (w the warp
// within the warpgroup).
template <bool kGateUp, int kAcc>
__device__ __forceinline__ void store_tile(const PrefillArgs& args, const int4& unit, int64_t nt,
                                           int first, int wg_thread, const float (&acc)[kAcc]) {
  constexpr int kBN = 2 * kAcc;
  const Geometry& g = args.g;
  const int lane = wg_thread % 32;
  const int row0 = first + (wg_thread / 32) * 16 + lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= unit.z) continue;
    const int64_t pos = unit.y + row;
    if constexpr (kGateUp) {
      uint16_t* out = args.h + pos * g.inter;
#pragma unroll
      for (int n = 0; n < kBN / 16; ++n) {
        const int64_t col = nt * (kBN / 2) + 8 * n + 2 * (lane % 4);
        if (col >= g.inter) continue;
        const float* gt = acc + 4 * n + 2 * half;
        const float* up = acc + 4 * (n + kBN / 16) + 2 * half;
        const __nv_bfloat162 v = __floats2bfloat162_rn(gated_activation(gt[0], up[0], g.act),
                                                       gated_activation(gt[1], up[1], g.act));
        *reinterpret_cast<__nv_bfloat162*>(out + col) = v;
      }
    } else {
      float* out = args.slot_out + static_cast<int64_t>(args.sorted_slots[pos]) * g.hidden;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        const int64_t col = nt * kBN + 8 * n + 2 * (lane % 4);
        if (col >= g.hidden) continue;
        *reinterpret_cast<float2*>(out + col) =
            make_float2(acc[4 * n + 2 * half], acc[4 * n + 2 * half + 1]);
      }
    }
  }
}

// The k-step's MMAs of one warpgroup: its 64 rows of A times the stage's B.
template <WFmt F, int kAcc>
__device__ __forceinline__ void stage_mmas(float (&d)[kAcc], uint64_t desc_a, uint64_t desc_b,
                                           bool accumulate) {
#pragma unroll
  for (int ks = 0; ks < kBK / 16; ++ks) {
    wgmma_bf16<2 * kAcc>(d, desc_a + 2 * ks, desc_b + 2 * ks, (accumulate || ks > 0) ? 1 : 0);
  }
}

template <WFmt F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) experts_kernel(const PrefillArgs args) {
  constexpr int kBN = tile_n(F);
  constexpr int kS = stages(F);
  constexpr int kD = kS - 2;  // stages loaded ahead
  constexpr int kAcc = kBN / 2;
  constexpr bool kFp8 = F == WFmt::kFp8;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const auto slot_a = [&](int s) { return smem + (s % kS) * stage_bytes(F); };
  const auto slot_b = [&](int s) { return slot_a(s) + kBM * kRowBytes; };

  const Geometry& g = args.g;
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;
  const int64_t K = kGateUp ? g.hidden : g.inter;
  const int64_t N = kGateUp ? g.inter : g.hidden;
  const int kt_total = static_cast<int>(K / kBK);
  const int64_t tiles = (N + (kGateUp ? kBN / 2 : kBN) - 1) / (kGateUp ? kBN / 2 : kBN);
  const int64_t items = static_cast<int64_t>(*args.count) * tiles;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int4 unit = args.units[item / tiles];
    const int64_t nt = item % tiles;
    Loader<F, kGateUp> ld(args, unit, nt, tid);

    float acc[kAcc];
    float blk[kFp8 ? kAcc : 1];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

      // Prologue: stages 0 .. kD - 1 (the last one's FP8 / MXFP4 B left in registers).
#pragma unroll
    for (int s = 0; s < kD; ++s) {
      if (s < kt_total) {
        ld.load_a(slot_a(s), s);
        if constexpr (F == WFmt::kBF16) {
          ld.load_b_async(slot_b(s), s);
        } else {
          ld.fetch_b(s);
          if (s < kD - 1) ld.store_b(slot_b(s));
        }
      }
      cp_async_commit();
    }

    const uint64_t desc_a = wgmma_desc_sw128(slot_a(0) + wg * 64 * kRowBytes);
    const uint64_t desc_b = wgmma_desc_sw128(slot_b(0));
    constexpr uint64_t kStageDesc = stage_bytes(F) >> 4;
    for (int kt = 0; kt < kt_total; ++kt) {
      cp_async_wait<kD - 1>();
      fence_proxy_async();
      __syncthreads();
      wgmma_fence();
      const uint64_t stage = static_cast<uint64_t>(kt % kS) * kStageDesc;
      if constexpr (kFp8) {
        stage_mmas<F>(blk, desc_a + stage, desc_b + stage, kt % 2 == 1);
      } else {
        stage_mmas<F>(acc, desc_a + stage, desc_b + stage, kt > 0);
      }
      wgmma_commit();
      const int next = kt + kD;
      if constexpr (F != WFmt::kBF16) {
        if (next - 1 < kt_total) ld.store_b(slot_b(next - 1));
        if (next < kt_total) ld.fetch_b(next);
      }
      if (next < kt_total) {
        ld.load_a(slot_a(next), next);
        if constexpr (F == WFmt::kBF16) ld.load_b_async(slot_b(next), next);
      }
      cp_async_commit();
      if constexpr (kFp8) {
        if (kt % 2 == 1 || kt == kt_total - 1) {
          wgmma_wait<0>(blk);
          fp8_promote<kGateUp>(args, unit, nt, kt / 2, acc, blk);
        } else {
          wgmma_wait<1>(blk);
        }
      } else {
        wgmma_wait<1>(acc);
      }
    }
    wgmma_wait<0>(acc);
    cp_async_wait<0>();
    store_tile<kGateUp>(args, unit, nt, wg * 64, tid % 128, acc);
    __syncthreads();  // the next item's prologue overwrites the stages
  }
}

}  // namespace hyserve::cuda::moe_internal::prefill
