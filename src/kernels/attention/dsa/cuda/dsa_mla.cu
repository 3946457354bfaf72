// Sparse and dense MLA decode over the FP8 latent of the packed cache (cuda.h). From 48
// heads on warpgroup MMAs in groups of 64 (dsa_mla_wgmma.cu; dsa_mla_uses_wgmma below:
// sparse batches of fewer than 8 (query, group) pairs excepted); other head counts on the
// mma.sync kernel below. Both write the same partials, merged by the combine here.
//
// Block (head group, split, (b, i)): 32 heads of one query token (two MMA m-tiles; 16 with
// one m-tile when H <= 16; missing heads are zero-padded) against its keys in tiles of 64,
// triple-buffered in shared memory by cp.async (576 B per key). The head group is the
// fastest grid index, so the groups of one split run side by side and all but the first
// find the latents in L2: DRAM sees each latent about once per (request, query token).
// Sparse: the split's range of the query's slot list; dense: its range of positions
// 0..position. Per tile, 8 warps:
//
//   QK   warp (m-tile w % 2, keys 16 * (w / 2) ..+16; with one m-tile: keys 8w ..+8):
//        logits = q . latent over 576 dims,
//        fp16 x fp16 -> fp32 (m16n8k16). The dims are permuted identically for A and B
//        so that a lane's operands are contiguous: lane (g, t) of k-step s in dim group S
//        (64 dims) uses dims 64S + 16t + 4s + {0, 1} (regs a0/a1, b0) and + {2, 3}
//        (a2/a3, b1): one 16-byte load of latent codes per key covers 4 k-steps.
//   softmax  8 threads per head row, online in base 2 (running max m, sum l kept in the
//        row's threads); probabilities stored as fp16 P, the rescale factor per row.
//   PV   warp (m-tile w % 2, 128 output columns 128 * (w / 2); with one m-tile: 64
//        columns 64w): o += P . latent[:, :512].
//        The 32 columns of 4 n-tiles are permuted so that a lane's 4 columns are one
//        4-byte word: n-tile 4q + r, column g <-> column 32q + 4g + r; four words (keys
//        2t, 2t+1, 2t+8, 2t+9) are byte-transposed with prmt into 4 B fragments.
//
// Latent codes go to fp16 exactly (cvt.f16x2.e4m3x2); latent_scale is applied to the
// logits and in the combine. q is rounded to fp16 with a power-of-two scale per row
// (max |q| -> [2^13, 2^14)), undone on the logits. The key pitch of 592 bytes keeps the
// PV loads free of bank conflicts.
//
// Each block writes its unnormalized o (relative to its max m), m and l; the combine
// kernel merges the splits: o_lat = sum_s 2^(m_s - M) o_s / L * latent_scale,
// lse = (M + log2 L) ln 2. A head with no key gets o_lat = 0, lse = -inf.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "kernels/attention/dsa/cuda/dsa_mla_args.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using dsa::mma_f16;

constexpr int kThreads = 256;
constexpr int kRows = 32;  // heads per block
constexpr int kKeys = dsa::kMlaTileKeys;
constexpr int kStages = 3;        // latent tiles in shared memory (two in flight)
constexpr int kLatPitch = 592;    // bytes per key in shared memory
constexpr int kQPitch = 584;      // halves per q row (1168 B: conflict-free A loads)
constexpr int kLogitPitch = 68;   // floats
constexpr int kPPitch = 72;       // halves
constexpr int kStagePitch = 516;  // floats per row of the partial o staged for its stores
constexpr int kChunksPerKey = kDsaLatentDim / 16;                   // 36
constexpr int kChunksPerThread = kKeys * kChunksPerKey / kThreads;  // 9
static_assert(kKeys * kChunksPerKey % kThreads == 0);
constexpr int kCombineThreads = kDsaLoraDim / 4;  // a float4 of columns each
constexpr int kCombineBatch = 16;                 // splits' loads in flight per thread
constexpr int64_t kMaxSplits = 256;
// Blocks resident per SM: the shared memory of two exceeds the SM's 228 KiB.
constexpr int64_t kCtasPerSm = 1;
// Cost of a block's prologue (q conversion, first tile's latency) and partial writes,
// in tile times, for the split plan.
constexpr int64_t kOverheadTiles = 2;
constexpr double kSplitSlack = 1.05;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct SmemLayout {
  static constexpr int kLat = 0;                                 // [3][64][592] B
  static constexpr int kQ = kLat + kStages * kKeys * kLatPitch;  // [32][584] half
  static constexpr int kLogits = kQ + kRows * kQPitch * 2;       // [32][68] float
  static constexpr int kP = kLogits + kRows * kLogitPitch * 4;   // [32][72] half
  static constexpr int kValid = kP + kRows * kPPitch * 2;        // [3][64] int
  static constexpr int kCorr = kValid + kStages * kKeys * 4;     // [32] float
  static constexpr int kRowFactor = kCorr + kRows * 4;           // [32] float
  static constexpr int kBytes = kRowFactor + kRows * 4;
};
static_assert(kRows * kStagePitch * 4 <= kStages * kKeys * kLatPitch, "o staging fits the stages");
static_assert(2 * SmemLayout::kBytes > 228 * 1024, "kCtasPerSm assumes one block per SM");
static_assert(SmemLayout::kBytes <= 227 * 1024, "above the H100/H200 block limit");

using dsa::MlaArgs;
using dsa::MlaSplit;

// kMTiles = 2: 32 heads per block (warps split over the two m-tiles); kMTiles = 1 (H <= 16):
// 16 heads, every warp on the one m-tile with half the keys (QK) or columns (PV) each.
template <int kMTiles>
__global__ void __launch_bounds__(kThreads, 1) mla_kernel(MlaArgs a) {
  constexpr int kGroupRows = 16 * kMTiles;
  constexpr int kQkNTiles = kMTiles;      // n-tiles of 8 keys per warp in QK
  constexpr int kPvGroups = 2 * kMTiles;  // groups of 32 output columns per warp in PV
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* lat_s = smem + SmemLayout::kLat;
  __half* q_s = reinterpret_cast<__half*>(smem + SmemLayout::kQ);
  float* logit_s = reinterpret_cast<float*>(smem + SmemLayout::kLogits);
  __half* p_s = reinterpret_cast<__half*>(smem + SmemLayout::kP);
  int* valid_s = reinterpret_cast<int*>(smem + SmemLayout::kValid);
  float* corr_s = reinterpret_cast<float*>(smem + SmemLayout::kCorr);
  float* factor_s = reinterpret_cast<float*>(smem + SmemLayout::kRowFactor);
  dsa::start_next_grid();  // the combine's blocks may become resident (no wait: launched plainly)

  const DsaMlaParams& p = a.p;
  const int64_t group = blockIdx.x;  // fastest: a split's head groups run side by side
  const int64_t split = blockIdx.y;
  const int64_t row = blockIdx.z;  // b * n_q + i
  const int num_heads = static_cast<int>(p.num_heads);
  const int head0 = static_cast<int>(group) * kGroupRows;
  const int rows_here = min(kGroupRows, num_heads - head0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const MlaSplit sp = dsa::mla_split(a, row, split);
  const bool sparse = sp.sparse;
  const int64_t begin = sp.begin, num_tiles = sp.num_tiles;
  const DsaCache& cache = p.cache;

  // Thread tid copies chunks tid + kThreads * j (j < kChunksPerThread) of a tile. Its
  // entries' slot ids (sparse) or block ids (dense) are fetched into registers an
  // iteration before the tile is issued (-1: past the split's end), so that no global
  // load sits between a tile's turn and its cp.async.
  auto fetch_tile = [&](int64_t k, int32_t(&raw)[kChunksPerThread]) {
    dsa::mla_fetch_ids<kThreads, kChunksPerKey>(sp, k, raw);
  };
  // Issues the cp.async loads of tile k into stage k % kStages from its fetched ids, as one
  // commit group.
  auto issue_tile = [&](int64_t k, const int32_t(&raw)[kChunksPerThread]) {
    const int64_t tile0 = begin + k * kKeys;
    const int stage = static_cast<int>(k % kStages);
    uint8_t* dst = lat_s + stage * kKeys * kLatPitch;
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int c = static_cast<int>(threadIdx.x) + kThreads * j;
      const int key = c / kChunksPerKey;
      const int chunk = c % kChunksPerKey;
      const int32_t id = raw[j];
      const bool valid = id >= 0;
      const int64_t block = sparse ? int64_t{id >> sp.bs_shift} : int64_t{id};
      const int64_t in_block = sparse ? int64_t{id & sp.bs_mask} : (tile0 + key) & sp.bs_mask;
      const uint8_t* src = valid ? cache.pool + block * cache.row_bytes + cache.latent_offset +
                                       in_block * kDsaLatentDim + chunk * 16
                                 : cache.pool;
      dsa::cp_async_16(dst + key * kLatPitch + chunk * 16, src, valid ? 16 : 0);
      if (chunk == 0) valid_s[stage * kKeys + key] = valid;
    }
    dsa::cp_async_commit();
  };

  // q rows (a warp per row, float4 k of a row at lane + 32 k: 128 of q_lat, 16 of q_pe),
  // all of a warp's rows requested first, then tile 0's slot ids, so that the two global
  // round trips overlap; then tile 0 is issued and tile 1's ids fetched while q is
  // converted. Every issue point commits one group (empty past the last tile), so that
  // before tile k is used the groups of tiles k + 1 and k + 2 are the only ones pending.
  constexpr int kRowsPerWarp = kRows / (kThreads / 32);
  constexpr int kVecsPerRow = kDsaLatentDim / 4;         // 144
  constexpr int kVecsPerLane = (kVecsPerRow + 31) / 32;  // 5
  float4 v[kRowsPerWarp][kVecsPerLane];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp + (kThreads / 32) * j;
    const int64_t qh = row * num_heads + head0 + r;
    const auto* q_lat = reinterpret_cast<const float4*>(p.q_lat + qh * kDsaLoraDim);
    const auto* q_pe = reinterpret_cast<const float4*>(p.q_pe + qh * kDsaRopeDim);
#pragma unroll
    for (int k = 0; k < kVecsPerLane; ++k) {
      const int i = k * 32 + lane;
      v[j][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < rows_here && i < kVecsPerRow) {
        v[j][k] = i < kDsaLoraDim / 4 ? q_lat[i] : q_pe[i - kDsaLoraDim / 4];
      }
    }
  }
  int32_t raw[kChunksPerThread];
  if (num_tiles > 0) {
    fetch_tile(0, raw);
    issue_tile(0, raw);
    fetch_tile(1, raw);
  }

  // q rows -> fp16 with a power-of-two scale each.
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp + (kThreads / 32) * j;
    float inv = 0.0f;
    const float scale = dsa::mla_q_scale(v[j], inv);
#pragma unroll
    for (int k = 0; k < kVecsPerLane; ++k) {
      const int i = k * 32 + lane;
      if (i < kVecsPerRow) {
        *reinterpret_cast<uint2*>(q_s + r * kQPitch + 4 * i) = dsa::mla_q_f16x4(v[j][k], inv);
      }
    }
    if (lane == 0) factor_s[r] = scale * cache.latent_scale * p.softmax_scale * kLog2e;
  }
  if (num_tiles > 0) {
    if (num_tiles > 1) {
      issue_tile(1, raw);
    } else {
      dsa::cp_async_commit();
    }
    fetch_tile(2, raw);
  }

  const int mt = kMTiles == 2 ? (warp & 1) : 0;
  const bool mt_active = mt * 16 < rows_here;  // warp-uniform
  const int qk_keys = kMTiles == 2 ? (warp >> 1) * 16 : warp * 8;
  const int pv_cols = kMTiles == 2 ? (warp >> 1) * 128 : warp * 64;
  float o[4 * kPvGroups][4] = {};
  // Softmax state of row (threadIdx.x / 8), kept by its 8 threads.
  const int sm_row = threadIdx.x / 8;
  const int sm_part = threadIdx.x % 8;
  float run_max = -INFINITY;
  float run_sum = 0.0f;

  for (int64_t k = 0; k < num_tiles; ++k) {
    // Stage (k + 2) % kStages held tile k - 1, released by the last iteration's barrier.
    if (k + 2 < num_tiles) {
      issue_tile(k + 2, raw);
    } else {
      dsa::cp_async_commit();
    }
    fetch_tile(k + 3, raw);
    dsa::cp_async_wait<kStages - 1>();  // tile k's group is complete
    __syncthreads();
    const int stage = static_cast<int>(k % kStages);
    const uint8_t* tile = lat_s + stage * kKeys * kLatPitch;
    const int* valid = valid_s + stage * kKeys;

    // QK.
    if (mt_active) {
      // Two accumulators per n-tile (even / odd k-steps), summed at the end: one chain of
      // 36 dependent MMAs per n-tile left the warp waiting on MMA latency.
      float acc2[2][kQkNTiles][4] = {};
      const __half* qa = q_s + (mt * 16 + g) * kQPitch + 16 * t;
      const __half* qb = qa + 8 * kQPitch;
#pragma unroll 3
      for (int S = 0; S < kDsaLatentDim / 64; ++S) {
        uint4 a_lo[2], a_hi[2];
        a_lo[0] = *reinterpret_cast<const uint4*>(qa + 64 * S);
        a_lo[1] = *reinterpret_cast<const uint4*>(qa + 64 * S + 8);
        a_hi[0] = *reinterpret_cast<const uint4*>(qb + 64 * S);
        a_hi[1] = *reinterpret_cast<const uint4*>(qb + 64 * S + 8);
        const uint32_t* ra = reinterpret_cast<const uint32_t*>(a_lo);
        const uint32_t* rb = reinterpret_cast<const uint32_t*>(a_hi);
#pragma unroll
        for (int jn = 0; jn < kQkNTiles; ++jn) {
          const uint4 lw = *reinterpret_cast<const uint4*>(
              tile + (qk_keys + jn * 8 + g) * kLatPitch + 64 * S + 16 * t);
          const uint32_t w[4] = {lw.x, lw.y, lw.z, lw.w};
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            mma_f16(acc2[s & 1][jn], ra[2 * s], rb[2 * s], ra[2 * s + 1], rb[2 * s + 1],
                    dsa::e4m3x2_to_f16x2(w[s] & 0xffffu), dsa::e4m3x2_to_f16x2(w[s] >> 16));
          }
        }
      }
      const float f0 = factor_s[mt * 16 + g];
      const float f1 = factor_s[mt * 16 + g + 8];
      float acc[kQkNTiles][4];
#pragma unroll
      for (int jn = 0; jn < kQkNTiles; ++jn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[jn][e] = acc2[0][jn][e] + acc2[1][jn][e];
      }
#pragma unroll
      for (int jn = 0; jn < kQkNTiles; ++jn) {
        const int key = qk_keys + jn * 8 + 2 * t;
        const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;
        float* l0 = logit_s + (mt * 16 + g) * kLogitPitch + key;
        float* l1 = l0 + 8 * kLogitPitch;
        *reinterpret_cast<float2*>(l0) =
            make_float2(v0 ? acc[jn][0] * f0 : -INFINITY, v1 ? acc[jn][1] * f0 : -INFINITY);
        *reinterpret_cast<float2*>(l1) =
            make_float2(v0 ? acc[jn][2] * f1 : -INFINITY, v1 ? acc[jn][3] * f1 : -INFINITY);
      }
    }
    __syncthreads();

    // Online softmax, base 2; rows past rows_here are computed on zero q and discarded.
    {
      const float4* src =
          reinterpret_cast<const float4*>(logit_s + sm_row * kLogitPitch + sm_part * 8);
      const float4 x0 = src[0], x1 = src[1];
      float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      if (sm_row >= rows_here) {  // padding rows (their logits may be unwritten)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = -INFINITY;
      }
      float tile_max = v[0];
#pragma unroll
      for (int j = 1; j < 8; ++j) tile_max = fmaxf(tile_max, v[j]);
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      const float new_max = fmaxf(run_max, tile_max);
      float corr = 1.0f;
      float sum = 0.0f;
      __align__(16) __half probs[8];
      if (new_max == -INFINITY) {
#pragma unroll
        for (int j = 0; j < 8; ++j) probs[j] = __float2half_rn(0.0f);
      } else {
        corr = exp2f(run_max - new_max);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          probs[j] = __float2half_rn(exp2f(v[j] - new_max));
          sum += __half2float(probs[j]);
        }
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      run_sum = run_sum * corr + sum;
      run_max = new_max;
      *reinterpret_cast<uint4*>(p_s + sm_row * kPPitch + sm_part * 8) =
          *reinterpret_cast<const uint4*>(probs);
      if (sm_part == 0) corr_s[sm_row] = corr;
    }
    __syncthreads();

    // PV.
    if (mt_active) {
      const float c0 = corr_s[mt * 16 + g];
      const float c1 = corr_s[mt * 16 + g + 8];
#pragma unroll
      for (int n = 0; n < 4 * kPvGroups; ++n) {
        o[n][0] *= c0;
        o[n][1] *= c0;
        o[n][2] *= c1;
        o[n][3] *= c1;
      }
      const __half* pa = p_s + (mt * 16 + g) * kPPitch + 2 * t;
      const __half* pb = pa + 8 * kPPitch;
#pragma unroll
      for (int kc = 0; kc < kKeys / 16; ++kc) {
        const uint32_t a0 = *reinterpret_cast<const uint32_t*>(pa + kc * 16);
        const uint32_t a1 = *reinterpret_cast<const uint32_t*>(pb + kc * 16);
        const uint32_t a2 = *reinterpret_cast<const uint32_t*>(pa + kc * 16 + 8);
        const uint32_t a3 = *reinterpret_cast<const uint32_t*>(pb + kc * 16 + 8);
        const uint8_t* k0 = tile + (kc * 16 + 2 * t) * kLatPitch + pv_cols + 4 * g;
#pragma unroll
        for (int q = 0; q < kPvGroups; ++q) {
          const uint32_t w0 = *reinterpret_cast<const uint32_t*>(k0 + 32 * q);
          const uint32_t w1 = *reinterpret_cast<const uint32_t*>(k0 + kLatPitch + 32 * q);
          const uint32_t w2 = *reinterpret_cast<const uint32_t*>(k0 + 8 * kLatPitch + 32 * q);
          const uint32_t w3 = *reinterpret_cast<const uint32_t*>(k0 + 9 * kLatPitch + 32 * q);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const uint32_t sel = static_cast<uint32_t>(r) | (static_cast<uint32_t>(r + 4) << 4);
            const uint32_t b0 = dsa::e4m3x2_to_f16x2(__byte_perm(w0, w1, sel));
            const uint32_t b1 = dsa::e4m3x2_to_f16x2(__byte_perm(w2, w3, sel));
            mma_f16(o[4 * q + r], a0, a1, a2, a3, b0, b1);
          }
        }
      }
    }
    __syncthreads();
  }

  // Partials: o (unnormalized), max and sum per head. The fragments go to shared memory
  // (the latent stages, free after the loop's last barrier) in column order, then out as
  // whole 2-KB rows in 16-byte stores: stored straight from the fragments, every warp store
  // touched 32 sectors for 4 bytes each, ~10 us of a one-tile block at B = 1.
  const int64_t num_splits = a.num_splits;
  float* stage_s = reinterpret_cast<float*>(lat_s);
  if (mt_active) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float* dst = stage_s + (mt * 16 + g + 8 * half) * kStagePitch + pv_cols + 8 * t;
#pragma unroll
      for (int n = 0; n < 4 * kPvGroups; ++n) {
        const int q = n / 4, rr = n % 4;
        dst[32 * q + rr] = o[n][2 * half];
        dst[32 * q + 4 + rr] = o[n][2 * half + 1];
      }
    }
  }
  if (sm_part == 0 && sm_row < rows_here) {
    a.part_ml[(row * num_heads + head0 + sm_row) * num_splits + split] =
        make_float2(run_max, run_sum);
  }
  __syncthreads();
  constexpr int kRowVecs = kDsaLoraDim / 4;  // 128 float4 per row
  for (int e = threadIdx.x; e < rows_here * kRowVecs; e += kThreads) {
    const int r = e / kRowVecs, c = e % kRowVecs;
    auto* dst = reinterpret_cast<float4*>(
        a.part_o + ((row * num_heads + head0 + r) * num_splits + split) * kDsaLoraDim);
    dst[c] = *reinterpret_cast<const float4*>(stage_s + r * kStagePitch + 4 * c);
  }
}

// Block per (b * n_q + i, h): merges the splits, a thread per 4 columns (float4). The
// first kCombineBatch splits' partial rows are requested before the (max, sum) pairs are
// reduced, and later splits in batches of kCombineBatch loads in flight: the merge is a
// chain of L2 round trips, not of bandwidth (4 MB at B = 1). An empty split (m = -inf)
// weighs 0 and its o is 0.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(MlaArgs a) {
  __shared__ float2 ml_s[kMaxSplits];
  __shared__ float weight_s[kMaxSplits];
  __shared__ float warp_max_s[kCombineThreads / 32];
  dsa::follow_previous_grid();
  const DsaMlaParams& p = a.p;
  const int64_t qh = blockIdx.x;  // (b * n_q + i) * H + h
  const int num_splits = static_cast<int>(a.num_splits);
  const float2* ml = a.part_ml + qh * num_splits;
  const auto* part =
      reinterpret_cast<const float4*>(a.part_o + qh * num_splits * kDsaLoraDim) + threadIdx.x;
  float4 v[kCombineBatch];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      v[j] = s0 + j < num_splits ? part[(s0 + j) * (kDsaLoraDim / 4)]
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  load_batch(0);
  float max_all = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) {
    ml_s[s] = ml[s];
    max_all = fmaxf(max_all, ml_s[s].x);
  }
  for (int off = 16; off > 0; off /= 2)
    max_all = fmaxf(max_all, __shfl_xor_sync(0xffffffffu, max_all, off));
  if (threadIdx.x % 32 == 0) warp_max_s[threadIdx.x / 32] = max_all;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineThreads / 32; ++w) max_all = fmaxf(max_all, warp_max_s[w]);
  auto* out = reinterpret_cast<float4*>(p.o_lat + qh * kDsaLoraDim) + threadIdx.x;
  if (max_all == -INFINITY) {
    *out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (threadIdx.x == 0) p.lse[qh] = -INFINITY;
    return;
  }
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) {
    weight_s[s] = ml_s[s].x != -INFINITY ? exp2f(ml_s[s].x - max_all) : 0.0f;
  }
  __syncthreads();
  float sum_all = 0.0f;
  for (int s = 0; s < num_splits; ++s) sum_all += weight_s[s] * ml_s[s].y;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0; s0 < num_splits; s0 += kCombineBatch) {
    if (s0 > 0) load_batch(s0);
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const float w = s0 + j < num_splits ? weight_s[s0 + j] : 0.0f;
      acc.x += w * v[j].x;
      acc.y += w * v[j].y;
      acc.z += w * v[j].z;
      acc.w += w * v[j].w;
    }
  }
  const float norm = p.cache.latent_scale / sum_all;
  *out = make_float4(acc.x * norm, acc.y * norm, acc.z * norm, acc.w * norm);
  if (threadIdx.x == 0) p.lse[qh] = (max_all + log2f(sum_all)) * kLn2;
}

// Warpgroup MMAs take groups of 64 heads (the last one padded with zero rows), so they
// run head counts from kWgmmaMinHeads up (at most 25% padding; below it the mma.sync
// kernel's 16- or 32-head groups waste less), and sparse MLA only from kWgmmaMinGroups
// (query, 64-head group) pairs: below that the mma.sync kernel's smaller blocks spread a
// query's 2,048 keys over more SMs and win. Measured on the H200, 2026-11-30 (sparse, 64
// heads: B = 1 15.0 vs 18.0 us, B = 6 25.2 vs 25.8, B = 8 29.3 vs 27.4; 128 heads: B = 2
// 20.8 vs 23.6, B = 4 29.0 vs 27.0; dense MLA on warpgroup MMAs is faster at every batch:
// B = 1 x 32K 48.4 vs 43.1 us). BENCHMARKS.md has the head-count sweep.
constexpr int64_t kWgmmaMinHeads = 48;
constexpr int64_t kWgmmaMinGroups = 8;

}  // namespace

bool dsa_mla_uses_wgmma(const DsaMlaParams& p, bool batch_invariant) {
  if (p.num_heads < kWgmmaMinHeads) return false;
  if (batch_invariant || p.slots == nullptr) return true;  // never by the batch
  const int64_t rows = p.batch.num_requests * p.batch.num_q;
  const int64_t groups = (p.num_heads + dsa::kMlaWgmmaHeads - 1) / dsa::kMlaWgmmaHeads;
  return rows * groups >= kWgmmaMinGroups;
}

namespace {

struct Plan {
  int64_t num_groups, num_splits, keys_per_split;
  size_t part_o_bytes, part_ml_bytes;
  size_t total() const { return part_o_bytes + part_ml_bytes; }
};

// batch_invariant: one split per query, so that its keys are always summed in one order
// whatever B, n_q and max_context are (the split plan below depends on all three).
Plan make_plan(const DsaMlaParams& p, bool batch_invariant) {
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  Plan plan{};
  const int64_t rows = p.batch.num_requests * p.batch.num_q;
  // The kernel's heads per block: 64 on warpgroup MMAs, else 32 (16 when H <= 16).
  const int64_t group_rows = dsa_mla_uses_wgmma(p, batch_invariant) ? dsa::kMlaWgmmaHeads
                             : p.num_heads <= 16                    ? 16
                                                                    : kRows;
  plan.num_groups = (p.num_heads + group_rows - 1) / group_rows;
  const int64_t entries =
      std::max<int64_t>(1, p.slots != nullptr ? p.topk_width : p.batch.max_context);
  const int64_t max_tiles = (entries + kKeys - 1) / kKeys;
  // Splits: modelled time (waves of kCtasPerSm blocks per SM) x (tiles per split +
  // kOverheadTiles for a block's prologue and partials); the fewest splits within
  // kSplitSlack of the best (each split costs partial memory and combine work).
  const int64_t blocks = std::max<int64_t>(1, rows * plan.num_groups);
  const int64_t slots_per_wave = int64_t{num_sms} * kCtasPerSm;
  const int64_t max_splits = std::min(kMaxSplits, max_tiles);
  auto split_cost = [&](int64_t splits) {
    const int64_t tiles_per_split = (max_tiles + splits - 1) / splits;
    const int64_t waves = (blocks * splits + slots_per_wave - 1) / slots_per_wave;
    return waves * (tiles_per_split + kOverheadTiles);
  };
  int64_t best_cost = INT64_MAX;
  for (int64_t s = 1; s <= max_splits; ++s) best_cost = std::min(best_cost, split_cost(s));
  int64_t splits = 1;
  while (!batch_invariant &&
         static_cast<double>(split_cost(splits)) > kSplitSlack * static_cast<double>(best_cost))
    ++splits;
  const int64_t tiles_per_split = (max_tiles + splits - 1) / splits;
  plan.keys_per_split = tiles_per_split * kKeys;
  plan.num_splits = (max_tiles + tiles_per_split - 1) / tiles_per_split;
  const int64_t heads = rows * p.num_heads;
  plan.part_o_bytes = dsa::align_up(sizeof(float) * heads * plan.num_splits * kDsaLoraDim);
  plan.part_ml_bytes = dsa::align_up(sizeof(float2) * heads * plan.num_splits);
  return plan;
}

// validate (need_pointers) or validate_sizes (check.h), then the CUDA-only limits: the
// grid, and the head groups of the MMA tiles.
void check_params(const DsaMlaParams& p, bool need_pointers = true) {
  if (need_pointers) {
    validate(p);
  } else {
    validate_sizes(p);
  }
  dsa::check_cuda_limits(p.batch, "dsa_mla_decode");
  CHECK(p.num_heads <= 128, "dsa_mla_decode: num_heads (MLA heads) must be in 1..128, got ",
        p.num_heads);
}

}  // namespace

size_t dsa_mla_workspace_bytes(const DsaMlaParams& p) {
  check_params(p, /*need_pointers=*/false);
  // The batch-invariant plan (one split) never needs more.
  return make_plan(p, /*batch_invariant=*/false).total();
}

void dsa_mla_decode(const DsaMlaParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, bool batch_invariant) {
  check_params(p);
  if (p.batch.num_requests == 0) return;
  dsa::check_cuda_limits(p.cache, "dsa_mla_decode");
  CHECK(reinterpret_cast<uintptr_t>(p.q_lat) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(p.q_pe) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(p.o_lat) % 16 == 0,
        "dsa_mla_decode: q_lat, q_pe and o_lat must be 16-byte aligned (float4 loads and stores)");
  const Plan plan = make_plan(p, batch_invariant);
  CHECK(workspace != nullptr && workspace_bytes >= plan.total(), "dsa_mla workspace of ",
        workspace_bytes, " bytes, need ", plan.total());
  CHECK(reinterpret_cast<uintptr_t>(workspace) % dsa::kAlign == 0,
        "dsa_mla workspace must be 256-byte aligned");
  auto* base = static_cast<char*>(workspace);
  const MlaArgs a{.p = p,
                  .num_splits = plan.num_splits,
                  .keys_per_split = plan.keys_per_split,
                  .num_groups = plan.num_groups,
                  .part_o = reinterpret_cast<float*>(base),
                  .part_ml = reinterpret_cast<float2*>(base + plan.part_o_bytes)};
  const int64_t rows = p.batch.num_requests * p.batch.num_q;
  CHECK(rows <= 65535, "dsa_mla_decode: B * n_q = ", rows, " above 65535");
  const dim3 grid(static_cast<unsigned>(plan.num_groups), static_cast<unsigned>(plan.num_splits),
                  static_cast<unsigned>(rows));
  // The combine overlapped with the MLA kernel (dsa_common.cuh). The MLA kernel is launched
  // plainly: overlapped with the top-k's select in a DSA step it made the step slower
  // (B = 8 x 1M 379 -> 395 us, 2026-11-30, H200), and again with its blocks loading q
  // before they waited for the select (2026-12-01: B = 1 x 8K 38.3 -> 48.8, B = 64 x 8K
  // 130.4 -> 141.2, B = 8 x 1M 354.5 -> 360.9; only B = 8 x 128K gained, 92.2 -> 89.6).
  if (dsa_mla_uses_wgmma(p, batch_invariant)) {
    dsa::launch_mla_wgmma(a, grid, stream);
  } else {
    auto* kernel = p.num_heads <= 16 ? mla_kernel<1> : mla_kernel<2>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    SmemLayout::kBytes));
    kernel<<<grid, kThreads, SmemLayout::kBytes, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  const int64_t heads = rows * p.num_heads;
  dsa::launch_overlapped(combine_kernel, static_cast<unsigned>(heads), kCombineThreads, 0, stream,
                         a);
}

}  // namespace hyserve::cuda
