// DSA indexer scores over the packed cache's FP8 keys on tensor cores (cuda.h).
//
// Block (chunk, b): keys [chunk * keys_per_block, +keys_per_block) of request b, all n_q
// queries of b. Warp w walks tiles of 32 keys (tiles w, w + 8, ... of the chunk, so the
// block's warps read neighbouring memory) through a private two-stage shared-memory ring
// filled by cp.async: the next tile is in flight while the current one is multiplied. A
// lane reads back only the bytes it copied itself, so the ring needs no barrier
// (cp.async.wait_group orders a thread's own copies).
//
// MMA m16n8k16 on f16 with the KEYS as A (16 keys x 16 dims per m-tile, two m-tiles per
// tile) and the query heads as B (16 dims x 8 heads per n-tile); the e4m3 codes are
// exact in f16 and their products exact in the fp32 accumulators. (mma.sync with e4m3
// operands compiles on sm_90 to the same f16 MMAs plus, per MMA, conversions of both
// operands and four adds of a partial sum - 96 conversions and 72 adds per 16 MMAs in
// the SASS of the previous version; here the queries are converted once per block and
// the keys once per tile, and the MMAs accumulate in place.) The
// query fragments are read from shared memory per k-step and serve both m-tiles; the
// head reduction after the ReLU is a 4-lane one. The dot product is a sum over the 128
// dims, so any permutation of the dims applied to A and B alike gives the same result;
// we pick the one that makes every copy a whole 32-byte sector and every lane's operands
// contiguous: lane (g = lane / 4, t = lane % 4) holds bytes [16t, 16t + 16) and
// [64 + 16t, 64 + 16t + 16) of its key rows (keys 8j + g of the tile) and of its query
// rows (head g of each n-tile) = 8 words w0..w7, and k-step s (of 8) uses word s: its
// low byte pair as fragment regs a0/a1 and b0, its high pair as a2/a3 and b1. (With 32
// contiguous bytes per lane every copy instruction touched each sector twice, and L2
// throughput, not DRAM, bounded the kernel at ~45% of the copy bandwidth.)
//
// Epilogue per query: the accumulators hold dot(key, head) for keys 8j + g and heads
// 8n + 2t, 8n + 2t + 1; the lane weights their ReLUs by w (one max and one FMA each),
// sums over its n-tiles, then the 4 lanes of equal g reduce by two shuffles; lane t
// stores key 8t + g's score (times the key's scale). With a histogram (the top-k's first
// radix pass, fused) it also counts the score's bin in a shared histogram per query,
// added to the global one when the block ends.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/dsa/cuda.h"
#include "kernels/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using dsa::mma_f16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Bytes per query row in shared memory: [8 k-steps][4 lanes t][f16 pairs lo, hi], padded
// so that the 16 lanes of a half-warp's 8-byte loads hit distinct banks.
constexpr int kQhPitch = 288;
constexpr int kMaxRows = 8 * 64;  // n_q * Hi

// One ring stage of a warp: kMT m-tiles of 16 keys, indexed by lane so that a warp's
// accesses are contiguous. Lane (g, t) owns codes[2j][lane] and codes[2j + 1][lane] =
// bytes [16t, +16) and [64 + 16t, +16) of key 8j + g, and scales[j][lane] = its scale.
template <int kMT>
struct Stage {
  uint4 codes[4 * kMT][32];
  float scales[2 * kMT][32];
};

// The lane's operands of one tile: piece[2j..2j + 1] = its 32 bytes of key 8j + g.
template <int kMT>
struct KeyTile {
  uint4 piece[4 * kMT];
  float scale[2 * kMT];
};

// Issues the copies of the tile at tile0 into the lane's part of st (nothing past end).
template <int kMT>
__device__ __forceinline__ void issue_tile(const DsaIndexerParams& p, const int32_t* table,
                                           int tile0, int end, int lane, Stage<kMT>& st) {
  if (tile0 >= end) return;
  const int g = lane / 4, t = lane % 4;
  const DsaCache& c = p.cache;
  // A tile (16 kMT keys, aligned to its size) never straddles a block (block_size >= 32).
  const int64_t block = table[tile0 / c.block_size];
  const uint8_t* page = c.pool + block * c.row_bytes + c.index_offset;
  const auto* scale_page =
      reinterpret_cast<const float*>(page + int64_t{c.block_size} * kDsaIndexDim);
  const int j0 = tile0 % c.block_size + g;
  const int left = end - tile0 - g;  // keys j0, j0 + 8, ... below end
#pragma unroll
  for (int j = 0; j < 2 * kMT; ++j) {
    if (8 * j < left) {
      const uint8_t* src = page + (j0 + 8 * j) * kDsaIndexDim + t * 16;
      dsa::cp_async_16(&st.codes[2 * j][lane], src, 16);
      dsa::cp_async_16(&st.codes[2 * j + 1][lane], src + 64, 16);
      dsa::cp_async_4(&st.scales[j][lane], scale_page + j0 + 8 * j);
    }
  }
}

// The lane's part of a landed stage (keys past the end hold stale bytes: their rows of
// the MMA are never stored).
template <int kMT>
__device__ __forceinline__ void read_tile(const Stage<kMT>& st, int lane, KeyTile<kMT>& k) {
#pragma unroll
  for (int j = 0; j < 4 * kMT; ++j) k.piece[j] = st.codes[j][lane];
#pragma unroll
  for (int j = 0; j < 2 * kMT; ++j) k.scale[j] = st.scales[j][lane];
}

// Scores of query i for the warp's tile: sums[j] = the weighted sum over all heads of
// key 8j + g, reduced over the 4 lanes of equal g. k-step s (of 8, 16 dims each) uses
// word s of every lane's 32 bytes: the key words are turned into f16 pairs here, once
// per tile and n-tile group; the query's pairs were converted when the block started.
// Groups of kG n-tiles keep the accumulators of both m-tiles in registers.
template <int kNT, int kMT>
__device__ __forceinline__ void tile_scores(const KeyTile<kMT>& k, const uint8_t* qh_s,
                                            const float* w_s, int i, int g, int t,
                                            float (&sums)[2 * kMT]) {
  constexpr int kG = kNT % 4 == 0 ? 4 : 2;  // n-tiles per group
#pragma unroll
  for (int j = 0; j < 2 * kMT; ++j) sums[j] = 0.0f;
#pragma unroll 1
  for (int n0 = 0; n0 < kNT; n0 += kG) {
    const int head0 = i * kNT * 8 + n0 * 8;
    float acc[kMT][kG][4] = {};
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint2 q[kG];
#pragma unroll
      for (int n = 0; n < kG; ++n) {
        q[n] =
            *reinterpret_cast<const uint2*>(qh_s + (head0 + 8 * n + g) * kQhPitch + s * 32 + t * 8);
      }
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        const uint32_t lo = dsa::word4(k.piece[2 * (2 * m) + s / 4], s % 4);      // key 16m + g
        const uint32_t hi = dsa::word4(k.piece[2 * (2 * m + 1) + s / 4], s % 4);  // key + 8
        const uint32_t a0 = dsa::e4m3x2_to_f16x2(lo & 0xffffu);
        const uint32_t a1 = dsa::e4m3x2_to_f16x2(hi & 0xffffu);
        const uint32_t a2 = dsa::e4m3x2_to_f16x2(lo >> 16);
        const uint32_t a3 = dsa::e4m3x2_to_f16x2(hi >> 16);
#pragma unroll
        for (int n = 0; n < kG; ++n) mma_f16(acc[m][n], a0, a1, a2, a3, q[n].x, q[n].y);
      }
    }
#pragma unroll
    for (int n = 0; n < kG; ++n) {
      const float2 w = *reinterpret_cast<const float2*>(w_s + head0 + 8 * n + 2 * t);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {  // one max and one FMA per product
        sums[2 * m] = fmaf(w.x, fmaxf(acc[m][n][0], 0.0f), sums[2 * m]);
        sums[2 * m] = fmaf(w.y, fmaxf(acc[m][n][1], 0.0f), sums[2 * m]);
        sums[2 * m + 1] = fmaf(w.x, fmaxf(acc[m][n][2], 0.0f), sums[2 * m + 1]);
        sums[2 * m + 1] = fmaf(w.y, fmaxf(acc[m][n][3], 0.0f), sums[2 * m + 1]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 2 * kMT; ++j) {
    sums[j] += __shfl_xor_sync(0xffffffffu, sums[j], 1);
    sums[j] += __shfl_xor_sync(0xffffffffu, sums[j], 2);
  }
}

// Element t of a register array without dynamic indexing (t < N).
template <int N>
__device__ __forceinline__ float pick(const float (&v)[N], int t) {
  float r = v[0];
#pragma unroll
  for (int j = 1; j < N; ++j) r = t == j ? v[j] : r;
  return r;
}

// kNT = Hi / 8 n-tiles of 8 heads; kMT m-tiles of 16 keys per warp step; kStages ring
// stages per warp.
template <int kNT, int kMT, int kStages>
__global__ void __launch_bounds__(kThreads, 2)
    indexer_kernel(DsaIndexerParams p, int64_t keys_per_block) {
  constexpr int kTileKeys = 16 * kMT;
  constexpr int kBlockStepKeys = kWarps * kTileKeys;
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kHeads = kNT * 8;
  const int num_q = static_cast<int>(p.batch.num_q);
  const int num_rows = num_q * kHeads;
  // [warps][kStages] ring, then [rows, kQhPitch] query f16 pairs, [rows] weights and, when
  // p.histogram is set, [n_q, kDsaTopkBins] bins.
  auto* ring = reinterpret_cast<Stage<kMT>*>(smem);
  uint8_t* qh_s = smem + sizeof(Stage<kMT>) * kWarps * kStages;
  float* w_s = reinterpret_cast<float*>(qh_s + num_rows * kQhPitch);
  int* hist_s = p.histogram != nullptr ? reinterpret_cast<int*>(w_s + num_rows) : nullptr;

  const int64_t b = blockIdx.y;
  // Positions fit int32 (max_context < 2^31, check_batch). Clamped so that a length
  // beyond the host bound (a caller bug) cannot write outside.
  const int seq_len = static_cast<int>(min(int64_t{p.batch.seq_lens[b]}, p.batch.max_context));
  const int64_t begin64 = blockIdx.x * keys_per_block;
  if (begin64 >= seq_len) return;
  const int begin = static_cast<int>(begin64);
  const int end = static_cast<int>(min(int64_t{seq_len}, begin64 + keys_per_block));
  const int32_t* table = p.batch.block_tables + b * p.batch.max_blocks;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  Stage<kMT>* my_ring = ring + warp * kStages;
  // The first kStages - 1 tiles go out before the block waits for its queries; one commit
  // group per tile (empty past the end), so that a tile is complete when at most
  // kStages - 1 later groups are pending.
  int tile0 = begin + warp * kTileKeys;
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    issue_tile<kMT>(p, table, tile0 + k * kBlockStepKeys, end, lane, my_ring[k]);
    dsa::cp_async_commit();
  }

  // The queries as f16 pairs (exact: every e4m3 value is an f16), in the order tile_scores
  // reads them: word s of lane t's bytes ([16t, +16) then [64 + 16t, +16)) of a row.
  const auto* q_src = reinterpret_cast<const uint32_t*>(p.q8 + b * num_rows * kDsaIndexDim);
  for (int e = threadIdx.x; e < num_rows * 32; e += kThreads) {
    const int row = e / 32, t_of = (e / 8) % 4, s_of = e % 8;
    const int byte = (s_of < 4 ? 16 * t_of : 64 + 16 * t_of) + 4 * (s_of % 4);
    const uint32_t codes = q_src[row * (kDsaIndexDim / 4) + byte / 4];
    *reinterpret_cast<uint2*>(qh_s + row * kQhPitch + s_of * 32 + t_of * 8) =
        make_uint2(dsa::e4m3x2_to_f16x2(codes & 0xffffu), dsa::e4m3x2_to_f16x2(codes >> 16));
  }
  for (int i = threadIdx.x; i < num_rows; i += kThreads) w_s[i] = p.weights[b * num_rows + i];
  if (hist_s != nullptr) {
    for (int i = threadIdx.x; i < num_q * kDsaTopkBins; i += kThreads) hist_s[i] = 0;
  }
  __syncthreads();

  // Lane t stores key 8t + g of the tile (t < 2 kMT); the other lanes only help reduce.
  const bool storer = t < 2 * kMT;
  float* out = p.scores + b * num_q * p.score_stride;
  for (int stage = 0; tile0 < end; tile0 += kBlockStepKeys) {
    // The stage refilled here held the previous tile, already read into registers.
    const int refill = stage == 0 ? kStages - 1 : stage - 1;
    issue_tile<kMT>(p, table, tile0 + (kStages - 1) * kBlockStepKeys, end, lane, my_ring[refill]);
    dsa::cp_async_commit();
    dsa::cp_async_wait<kStages - 1>();
    KeyTile<kMT> cur;
    read_tile<kMT>(my_ring[stage], lane, cur);
    stage = stage == kStages - 1 ? 0 : stage + 1;
    const int key = tile0 + 8 * t + g;
    const float scale = pick(cur.scale, t);
#pragma unroll 1
    for (int i = 0; i < num_q; ++i) {
      float sums[2 * kMT];
      tile_scores<kNT, kMT>(cur, qh_s, w_s, i, g, t, sums);
      if (storer && key < end) {
        const int position = seq_len - num_q + i;
        const bool visible = key <= position;
        const float s = visible ? scale * pick(sums, t) : -INFINITY;
        out[i * p.score_stride + key] = s;  // 64-bit: score_stride is int64
        if (hist_s != nullptr && visible) {
          atomicAdd(&hist_s[i * kDsaTopkBins + (dsa_order_key(s) >> kDsaTopkBinShift)], 1);
        }
      }
    }
  }
  dsa::cp_async_wait<0>();  // no copy may land in shared memory after the block exits
  if (hist_s != nullptr) {
    __syncthreads();
    int* dst = p.histogram + b * num_q * kDsaTopkBins;
    for (int k = threadIdx.x; k < num_q * kDsaTopkBins; k += kThreads) {
      if (hist_s[k] != 0) atomicAdd(&dst[k], hist_s[k]);
    }
  }
}

using KernelFn = void (*)(DsaIndexerParams, int64_t);

// 32 keys per warp step, two stages (one tile in flight while one is multiplied): 4.2 KB
// per warp, ~67 KB per SM in flight. Measured against 16-key tiles with 2 or 4 stages,
// 32-key tiles with 3 stages and half the blocks: this shape executes the fewest
// instructions per key and read the keys fastest (2026-11-30, H200).
constexpr int kMT = 2;
constexpr int kStages = 2;
constexpr int kStepKeys = kWarps * 16 * kMT;  // keys per block step
constexpr int kBlocksPerSm = 4;               // keys cut into ~4 blocks per SM

// The cp.async rings, query rows, head weights and (optionally) the histograms of one block.
size_t shared_bytes(int64_t num_q, int64_t num_heads, bool histogram) {
  return sizeof(Stage<kMT>) * kWarps * kStages +
         static_cast<size_t>(num_q * num_heads) * (kQhPitch + sizeof(float)) +
         (histogram ? sizeof(int) * num_q * kDsaTopkBins : 0);
}

// The histogram is fused only while two blocks fit an SM (227 KiB of shared memory).
constexpr size_t kMaxSmemFor2Blocks = 113 * 1024;

}  // namespace

void dsa_indexer_scores(const DsaIndexerParams& p, cudaStream_t stream) {
  dsa::check_batch(p.batch);
  CHECK(p.num_heads >= 16 && p.num_heads <= 64 && p.num_heads % 16 == 0,
        "indexer heads must be 16, 32, 48 or 64, got ", p.num_heads);
  CHECK(p.score_stride >= p.batch.max_context, "score_stride ", p.score_stride, " < max_context ",
        p.batch.max_context);
  if (p.batch.num_requests == 0 || p.batch.max_context == 0) return;
  dsa::check_cache(p.cache);
  CHECK(p.q8 != nullptr && p.weights != nullptr && p.scores != nullptr,
        "null q8, weights or scores");
  CHECK(reinterpret_cast<uintptr_t>(p.q8) % 16 == 0, "q8 must be 16-byte aligned");
  const int64_t rows = p.batch.num_q * p.num_heads;
  CHECK(rows <= kMaxRows, "n_q * Hi = ", rows);
  // Positions run in int32 inside the kernel, with a few tiles of slack past the end.
  CHECK(p.batch.max_context <= INT32_MAX - 4096, "max_context ", p.batch.max_context);
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  // Cut every request's key range so that about kBlocksPerSm blocks per SM exist in total.
  const int64_t step_keys = kStepKeys;
  const int64_t target_blocks = int64_t{kBlocksPerSm} * num_sms;
  const int64_t total_keys = p.batch.num_requests * p.batch.max_context;
  int64_t keys_per_block = (total_keys + target_blocks - 1) / target_blocks;
  keys_per_block =
      std::max<int64_t>(step_keys, (keys_per_block + step_keys - 1) / step_keys * step_keys);
  const int64_t num_chunks = (p.batch.max_context + keys_per_block - 1) / keys_per_block;
  const size_t smem = shared_bytes(p.batch.num_q, p.num_heads, p.histogram != nullptr);
  CHECK(p.histogram == nullptr || smem <= kMaxSmemFor2Blocks, "indexer: the histograms of n_q ",
        p.batch.num_q, " queries x ", p.num_heads,
        " heads do not fit shared memory (dsa_indexer_fuses_histogram)");
  const KernelFn kernels[] = {indexer_kernel<2, kMT, kStages>, indexer_kernel<4, kMT, kStages>,
                              indexer_kernel<6, kMT, kStages>, indexer_kernel<8, kMT, kStages>};
  const KernelFn kernel = kernels[p.num_heads / 16 - 1];
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(p.batch.num_requests));
  kernel<<<grid, kThreads, smem, stream>>>(p, keys_per_block);
  CUDA_CHECK_LAUNCH();
}

bool dsa_indexer_fuses_histogram(int64_t num_q, int64_t num_heads) {
  return shared_bytes(num_q, num_heads, true) <= kMaxSmemFor2Blocks;
}

}  // namespace hyserve::cuda
