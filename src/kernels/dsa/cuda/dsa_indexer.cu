// DSA indexer scores over the packed cache on FP8 tensor cores (cuda.h).
//
// Block (chunk, b): keys [chunk * keys_per_block, +keys_per_block) of request b, all n_q
// queries of b. Warp w walks tiles of 32 keys (tiles w, w + 8, ... of the chunk, so the
// block's warps read neighbouring memory) through a private two-stage shared-memory ring
// filled by cp.async: the next tile is in flight while the current one is multiplied. A
// lane reads back only the bytes it copied itself, so the ring needs no barrier
// (cp.async.wait_group orders a thread's own copies).
//
// MMA m16n8k32 with the KEYS as A (16 keys x 32 dims per m-tile, two m-tiles per tile)
// and the query heads as B (32 dims x 8 heads per n-tile): a tile is 2 * Hi / 8 MMAs per
// k-step; the query fragments are read from shared memory two n-tiles at a time and
// serve both m-tiles; the head reduction after the ReLU is a 4-lane one. The dot product
// is a sum over the 128 dims, so any permutation of the dims applied to A and B alike
// gives the same result; we pick the one that makes every copy a whole 32-byte sector
// and every lane's operands contiguous: lane (g = lane / 4, t = lane % 4) holds bytes
// [16t, 16t + 16) and [64 + 16t, 64 + 16t + 16) of its key rows (keys 8j + g of the
// tile) and of its query rows (head g of each n-tile) = 8 words w0..w7, and k-step s (of
// 4) uses words 2s (fragment regs a0/a1, b0) and 2s + 1 (a2/a3, b1). (With 32 contiguous
// bytes per lane every copy instruction touched each sector twice, and L2 throughput,
// not DRAM, bounded the kernel at ~45% of the copy bandwidth.)
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

using dsa::mma_e4m3;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kQPitch = 192;      // bytes per query row in shared memory (conflict-free)
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

// Word w (0..7) of the 32 bytes at v[0], v[1]; w is a constant after unrolling.
__device__ __forceinline__ uint32_t word(const uint4* v, int w) {
  const uint4& h = v[w >> 2];
  switch (w & 3) {
    case 0:
      return h.x;
    case 1:
      return h.y;
    case 2:
      return h.z;
    default:
      return h.w;
  }
}

// Scores of query i for the warp's tile: sums[j] = the weighted sum over all heads of
// key 8j + g, reduced over the 4 lanes of equal g. Two n-tiles at a time (independent
// MMA chains), their query fragments and weights read from shared memory just before
// use and folded into the sums right after, so that few registers stay live.
template <int kNT, int kMT>
__device__ __forceinline__ void tile_scores(const KeyTile<kMT>& k, const uint8_t* q_s,
                                            const float* w_s, int i, int g, int t,
                                            float (&sums)[2 * kMT]) {
#pragma unroll
  for (int j = 0; j < 2 * kMT; ++j) sums[j] = 0.0f;
#pragma unroll 1
  for (int n0 = 0; n0 < kNT; n0 += 2) {
    uint4 q[2][2];
    float2 w[2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int head = i * kNT * 8 + (n0 + n) * 8;
      const uint8_t* src = q_s + (head + g) * kQPitch + t * 16;
      q[n][0] = *reinterpret_cast<const uint4*>(src);
      q[n][1] = *reinterpret_cast<const uint4*>(src + 64);
      w[n] = *reinterpret_cast<const float2*>(w_s + head + 2 * t);
    }
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      const uint4* lo = &k.piece[4 * m];      // key 16m + g
      const uint4* hi = &k.piece[4 * m + 2];  // key 16m + g + 8
      float acc[2][4] = {};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          mma_e4m3(acc[n], word(lo, 2 * s), word(hi, 2 * s), word(lo, 2 * s + 1),
                   word(hi, 2 * s + 1), word(q[n], 2 * s), word(q[n], 2 * s + 1));
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {  // one max and one FMA per product
        sums[2 * m] = fmaf(w[n].x, fmaxf(acc[n][0], 0.0f), sums[2 * m]);
        sums[2 * m] = fmaf(w[n].y, fmaxf(acc[n][1], 0.0f), sums[2 * m]);
        sums[2 * m + 1] = fmaf(w[n].x, fmaxf(acc[n][2], 0.0f), sums[2 * m + 1]);
        sums[2 * m + 1] = fmaf(w[n].y, fmaxf(acc[n][3], 0.0f), sums[2 * m + 1]);
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
  // [warps][kStages] ring, then [rows, kQPitch] query codes, [rows] weights and, when
  // p.histogram is set, [n_q, kDsaTopkBins] bins.
  auto* ring = reinterpret_cast<Stage<kMT>*>(smem);
  uint8_t* q_s = smem + sizeof(Stage<kMT>) * kWarps * kStages;
  float* w_s = reinterpret_cast<float*>(q_s + num_rows * kQPitch);
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

  const auto* q_src = reinterpret_cast<const uint4*>(p.q8 + b * num_rows * kDsaIndexDim);
  for (int i = threadIdx.x; i < num_rows * 8; i += kThreads) {
    *reinterpret_cast<uint4*>(q_s + (i / 8) * kQPitch + (i % 8) * 16) = q_src[i];
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
      tile_scores<kNT, kMT>(cur, q_s, w_s, i, g, t, sums);
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
         static_cast<size_t>(num_q * num_heads) * (kQPitch + sizeof(float)) +
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
