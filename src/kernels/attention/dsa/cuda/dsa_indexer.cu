// DSA indexer scores over the packed cache's FP8 keys on Hopper's FP8 tensor cores (wgmma,
// e4m3 x e4m3 -> f32; cuda.h).
//
// Block (chunk, b): keys [chunk * keys_per_block, +keys_per_block) of request b, all n_q
// queries of b. Each of the block's two warpgroups walks tiles of 64 keys (tiles wg,
// wg + 2, ... of the chunk) through its own ring of kStages shared-memory stages filled
// by cp.async, kStages - 1 tiles in flight while one is multiplied. A tile is the A
// operand (64 keys x 128 dims, K-major, 128-byte swizzled: wgmma.cuh); a query's Hi heads
// are B (Hi x 128, the same layout, written once per block). Four MMAs m64nHik32 give
// the 64 x Hi dot products of one query in registers; each thread then weights its heads'
// ReLUs (rows 16w + g and 16w + g + 8, heads 8n + 2t, +1), two shuffles finish the sums
// over the 4 lanes of a row, and lanes t = 0 / 1 store their row's score times the key's
// scale. The e4m3 products are exact; the tensor cores add them with a reduced-precision
// accumulator (tests/gpu/dsa_test.cpp states the tolerance).
//
// Copies: thread i of a warpgroup copies 16-byte chunk i % 8 of key rows i / 8 + 16j
// (j < 4), so a warp reads 512 contiguous bytes (four whole keys); the swizzle only moves
// the chunk within its row in shared memory. Each thread waits for its own copies, fences
// them for the async proxy, and a barrier of the warpgroup publishes the tile; that
// barrier also tells the warpgroup that the stage filled next (read in the previous
// iteration, MMAs and scales) is free.
//
// L2: where the step's scores fit (dsa::keep_scores_in_l2) the key copies are marked
// evict-first (read once) and the score stores evict-last, for the top-k to read there.
//
// With a histogram (the top-k's first radix pass, fused) the storing lanes also count
// the score's bin in a shared histogram per query, added to the global one when the
// block ends.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda/wgmma.cuh"
#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kGroups = 2;  // warpgroups per block
constexpr int kThreads = 128 * kGroups;
constexpr int kTileKeys = 64;  // the wgmma's M
constexpr int kTileBytes = kTileKeys * kDsaIndexDim;
// 3 stages: 2 tiles (16 KB) in flight per warpgroup; a block with one query and its
// histogram takes 64 KB of shared memory, so 3 blocks (96 KB in flight) fit an SM.
// Measured against 2, 4 and 6 stages and one warpgroup per block (2026-11-30, H200).
constexpr int kStages = 3;
constexpr int kBlockStepKeys = kGroups * kTileKeys;
constexpr int kMaxRows = 8 * 64;  // n_q * Hi

// Shared memory, from a 1,024-aligned base (swizzle atoms):
//   codes  [kGroups][kStages][64 keys][128]   swizzled tiles
//   q      [n_q * Hi][128]                    swizzled query rows
//   scales [kGroups][kStages][64]             the tiles' key scales
//   w      [n_q * Hi]                         head weights
//   hist   [n_q][kDsaTopkBins]                only with a histogram
constexpr size_t kCodesBytes = size_t{kGroups} * kStages * kTileBytes;
constexpr size_t kScalesBytes = size_t{kGroups} * kStages * kTileKeys * sizeof(float);

size_t shared_bytes(int64_t num_q, int64_t num_heads, bool histogram) {
  const auto rows = static_cast<size_t>(num_q * num_heads);
  return 1024 /* base alignment */ + kCodesBytes + rows * kDsaIndexDim + kScalesBytes +
         rows * sizeof(float) + (histogram ? sizeof(int) * num_q * kDsaTopkBins : 0);
}

// Issues thread tid's copies of the tile at tile0 (keys past end: zeros, nothing read).
__device__ __forceinline__ void issue_tile(const DsaIndexerParams& p, const int32_t* table,
                                           int block_shift, int tile0, int end, int tid,
                                           uint64_t policy, uint8_t* codes, float* scales) {
  if (tile0 >= end) return;
  const DsaCache& c = p.cache;
  const int mask = c.block_size - 1;
  const auto page_of = [&](int key) {
    return c.pool + int64_t{table[key >> block_shift]} * c.row_bytes + c.index_offset;
  };
  const int chunk = tid % 8;
#pragma unroll
  for (int j = 0; j < kTileKeys / 16; ++j) {
    const int r = tid / 8 + 16 * j, key = tile0 + r;
    const uint8_t* src =
        key < end ? page_of(key) + (key & mask) * kDsaIndexDim + chunk * 16 : c.pool;
    dsa::cp_async_16(sw128_chunk(codes, r, chunk), src, key < end ? 16 : 0, policy);
  }
  if (tid < kTileKeys / 4) {  // 4 scales per thread (in one cache block: 4 | block_size)
    const int key = tile0 + 4 * tid;
    const int bytes = 4 * max(0, min(4, end - key));
    const uint8_t* src = bytes > 0 ? page_of(key) + int64_t{c.block_size} * kDsaIndexDim +
                                         (key & mask) * sizeof(float)
                                   : c.pool;
    dsa::cp_async_16(scales + 4 * tid, src, bytes, policy);
  }
}

// kN = Hi heads: the wgmma's N.
template <int kN>
__global__ void __launch_bounds__(kThreads, 2)
    indexer_kernel(DsaIndexerParams p, int64_t keys_per_block, bool keep_scores) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  const int num_q = static_cast<int>(p.batch.num_q);
  const int num_rows = num_q * kN;
  uint8_t* codes_s = smem;
  uint8_t* q_s = codes_s + kCodesBytes;
  auto* scales_s = reinterpret_cast<float*>(q_s + num_rows * kDsaIndexDim);
  float* w_s = scales_s + kGroups * kStages * kTileKeys;
  int* hist_s = p.histogram != nullptr ? reinterpret_cast<int*>(w_s + num_rows) : nullptr;

  const int64_t b = blockIdx.y;
  // Positions fit int32 (max_context < 2^31, check_cuda_limits). Clamped so that a length
  // beyond the host bound (a caller bug) cannot write outside.
  const int seq_len = static_cast<int>(min(int64_t{p.batch.seq_lens[b]}, p.batch.max_context));
  const int64_t begin64 = blockIdx.x * keys_per_block;
  if (begin64 >= seq_len) return;
  const int begin = static_cast<int>(begin64);
  const int end = static_cast<int>(min(int64_t{seq_len}, begin64 + keys_per_block));
  const int32_t* table = p.batch.block_tables + b * p.batch.max_blocks;
  const int block_shift = __ffs(p.cache.block_size) - 1;

  const int group = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  // Where the step's scores fit L2, the keys (read once) leave it first and the scores
  // (read back by the top-k right after) last; otherwise no hints (dsa_common.cuh).
  const uint64_t stream = keep_scores ? dsa::l2_evict_first() : dsa::l2_evict_normal();
  const uint64_t keep = keep_scores ? dsa::l2_evict_last() : dsa::l2_evict_normal();
  uint8_t* my_codes = codes_s + group * kStages * kTileBytes;
  float* my_scales = scales_s + group * kStages * kTileKeys;
  // The first kStages - 1 tiles go out before the block loads its queries; one commit
  // group per tile (empty past the end), so that a tile is complete when at most
  // kStages - 2 later groups are pending.
  int tile0 = begin + group * kTileKeys;
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    issue_tile(p, table, block_shift, tile0 + k * kBlockStepKeys, end, tid, stream,
               my_codes + k * kTileBytes, my_scales + k * kTileKeys);
    dsa::cp_async_commit();
  }

  // The query rows, swizzled like the tiles.
  const auto* q_src = reinterpret_cast<const uint4*>(p.q8 + b * num_rows * kDsaIndexDim);
  for (int e = threadIdx.x; e < num_rows * 8; e += kThreads) {
    *reinterpret_cast<uint4*>(sw128_chunk(q_s, e / 8, e % 8)) = q_src[e];
  }
  for (int i = threadIdx.x; i < num_rows; i += kThreads) w_s[i] = p.weights[b * num_rows + i];
  if (hist_s != nullptr) {
    for (int i = threadIdx.x; i < num_q * kDsaTopkBins; i += kThreads) hist_s[i] = 0;
  }
  fence_proxy_async();
  __syncthreads();

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Lanes t = 0 / 1 store rows 16 warp + g / + 8 (the other two only help reduce).
  const int row = 16 * warp + g + 8 * (t & 1);
  const bool storer = t < 2;
  float* out = p.scores + b * num_q * p.score_stride;
  for (int stage = 0; tile0 < end; tile0 += kBlockStepKeys) {
    dsa::cp_async_wait<kStages - 2>();  // this thread's copies of the tile landed
    fence_proxy_async();
    named_barrier(1 + group, 128);  // everyone's; the previous stage is free
    const int refill = stage == 0 ? kStages - 1 : stage - 1;
    issue_tile(p, table, block_shift, tile0 + (kStages - 1) * kBlockStepKeys, end, tid, stream,
               my_codes + refill * kTileBytes, my_scales + refill * kTileKeys);
    dsa::cp_async_commit();

    const uint64_t a_desc = wgmma_desc_sw128(my_codes + stage * kTileBytes);
    const int key = tile0 + row;
    const float scale = my_scales[stage * kTileKeys + row];
    stage = stage == kStages - 1 ? 0 : stage + 1;
#pragma unroll 1
    for (int i = 0; i < num_q; ++i) {
      const uint64_t b_desc = wgmma_desc_sw128(q_s + i * kN * kDsaIndexDim);
      float acc[kN / 2];
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kDsaIndexDim / 32; ++s) {  // +32 bytes per k-step: +2 in the descriptor
        wgmma_e4m3<kN>(acc, a_desc + 2 * s, b_desc + 2 * s, s);
      }
      wgmma_commit();
      wgmma_wait<0>(acc);
      // sum0: row 16 warp + g, sum1: row + 8, over this lane's heads.
      float sum0 = 0.0f, sum1 = 0.0f;
      const float* w = w_s + i * kN + 2 * t;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
        const float2 wn = *reinterpret_cast<const float2*>(w + 8 * n);
        sum0 = fmaf(wn.x, fmaxf(acc[4 * n], 0.0f), sum0);
        sum0 = fmaf(wn.y, fmaxf(acc[4 * n + 1], 0.0f), sum0);
        sum1 = fmaf(wn.x, fmaxf(acc[4 * n + 2], 0.0f), sum1);
        sum1 = fmaf(wn.y, fmaxf(acc[4 * n + 3], 0.0f), sum1);
      }
      // Odd lanes keep row + 8: each lane sends its partner the sum the partner keeps.
      const bool odd = (t & 1) != 0;
      float sum = (odd ? sum1 : sum0) + __shfl_xor_sync(0xffffffffu, odd ? sum0 : sum1, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (storer && key < end) {
        const int position = seq_len - num_q + i;
        const bool visible = key <= position;
        const float s = visible ? scale * sum : -INFINITY;
        dsa::store_f32(out + i * p.score_stride + key, s, keep);  // 64-bit: int64 stride
        if (hist_s != nullptr && visible) {
          atomicAdd(&hist_s[i * kDsaTopkBins + (float_order_key(s) >> kDsaTopkBinShift)], 1);
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

using KernelFn = void (*)(DsaIndexerParams, int64_t, bool);

// Keys cut into ~64 blocks per SM (short blocks keep every SM streaming to the end of
// the grid: at B = 64 x 1M 4 per SM read at 77% of the copy bandwidth, 32 at 96%), but no
// block under 1,024 keys unless that leaves fewer than 8 per SM (the ring's fill and the
// query load are per block). H200, 2026-12-01, indexer us, 32 -> 64 blocks per SM in one
// run and 64 -> 128 in the next: B = 32 x 1M 1,119 -> 1,099 and 1,099 -> 1,089, B = 64 x
// 1M 2,232 -> 2,191 and 2,190 -> 2,169 (but its step 2,465 -> 2,489), B = 8 x 1M 289.2 ->
// 286.5 and 286.7 -> 287.0; 128K within 1%. 16 or 8 per SM (4K-8K-key blocks) were 1-10%
// slower than 32, and 512-key blocks slower at 128K (B = 8 x 128K 44.5 -> 45.7).
constexpr int kBlocksPerSm = 64;
constexpr int kMinBlocksPerSm = 8;
constexpr int64_t kMinKeysPerBlock = 1024;

// The indexer takes a histogram only while two blocks fit an SM (227 KiB of shared
// memory). dsa_decode has it build one where that costs no resident block, or where the
// step is small: with 32 index heads and one query the histogram's 8 KB take the SM from
// 4 blocks to 3, and the fused indexer reads ~8% slower (Nsight Compute, B = 8 x 1M:
// 307 us against 283), more than the top-k's own histogram pass costs (15 us) from ~2M
// scores on; below that the extra pass and launch cost more. Steps on the H200,
// 2026-11-30, fused / not: B = 8 x 1M 370.4 / 362.3 us, B = 32 x 128K 256.5 / 247.3,
// B = 64 x 128K 442.9 / 434.2, B = 8 x 512K 224.2 / 216.7; B = 1 x 32K 40.8 / 47.8, B = 8
// x 32K 70.2 / 73.5, B = 8 x 128K 101.8 / 102.3, B = 1 x 1M 89.6 / 90.2.
constexpr size_t kMaxSmemFor2Blocks = 113 * 1024;
constexpr int64_t kFuseAlwaysScores = int64_t{1} << 21;

KernelFn kernel_for(int64_t num_heads) {
  const KernelFn kernels[] = {indexer_kernel<16>, indexer_kernel<32>, indexer_kernel<48>,
                              indexer_kernel<64>};
  return kernels[num_heads / 16 - 1];
}

// Blocks of the indexer for these sizes resident per SM.
int resident_blocks(int64_t num_q, int64_t num_heads, bool histogram) {
  const KernelFn kernel = kernel_for(num_heads);
  const size_t smem = shared_bytes(num_q, num_heads, histogram);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem));
  return blocks;
}

}  // namespace

void dsa_indexer_scores(const DsaIndexerParams& p, cudaStream_t stream) {
  validate(p);
  // CUDA-only limits: the head count the wgmma B operand takes, the grid.
  dsa::check_cuda_limits(p.batch, "dsa_indexer_scores");
  CHECK(p.num_heads >= 16 && p.num_heads <= 64 && p.num_heads % 16 == 0,
        "dsa_indexer_scores: num_heads (indexer heads) must be 16, 32, 48 or 64, got ",
        p.num_heads);
  if (p.batch.num_requests == 0 || p.batch.max_context == 0) return;
  dsa::check_cuda_limits(p.cache, "dsa_indexer_scores");
  CHECK(reinterpret_cast<uintptr_t>(p.q8) % 16 == 0,
        "dsa_indexer_scores: q8 must be 16-byte aligned");
  const int64_t rows = p.batch.num_q * p.num_heads;
  CHECK(rows <= kMaxRows, "dsa_indexer_scores: n_q * Hi = ", rows);
  // Positions run in int32 inside the kernel, with a few tiles of slack past the end.
  CHECK(p.batch.max_context <= INT32_MAX - 4096, "dsa_indexer_scores: max_context ",
        p.batch.max_context);
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  // Cut every request's key range (kBlocksPerSm above).
  const int64_t step_keys = kBlockStepKeys;
  const int64_t total_keys = p.batch.num_requests * p.batch.max_context;
  const auto keys_for = [&](int64_t blocks_per_sm) {
    const int64_t blocks = blocks_per_sm * num_sms;
    return (total_keys + blocks - 1) / blocks;
  };
  int64_t keys_per_block =
      std::max(keys_for(kBlocksPerSm), std::min(kMinKeysPerBlock, keys_for(kMinBlocksPerSm)));
  keys_per_block =
      std::max<int64_t>(step_keys, (keys_per_block + step_keys - 1) / step_keys * step_keys);
  const int64_t num_chunks = (p.batch.max_context + keys_per_block - 1) / keys_per_block;
  const size_t smem = shared_bytes(p.batch.num_q, p.num_heads, p.histogram != nullptr);
  CHECK(p.histogram == nullptr || smem <= kMaxSmemFor2Blocks, "indexer: the histograms of n_q ",
        p.batch.num_q, " queries x ", p.num_heads,
        " heads do not fit shared memory (dsa_indexer_takes_histogram)");
  const KernelFn kernel = kernel_for(p.num_heads);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(p.batch.num_requests));
  const bool keep_scores = dsa::keep_scores_in_l2(sizeof(float) * p.batch.num_requests *
                                                  p.batch.num_q * p.batch.max_context);
  kernel<<<grid, kThreads, smem, stream>>>(p, keys_per_block, keep_scores);
  CUDA_CHECK_LAUNCH();
}

bool dsa_indexer_takes_histogram(int64_t num_q, int64_t num_heads) {
  return shared_bytes(num_q, num_heads, true) <= kMaxSmemFor2Blocks;
}

bool dsa_indexer_fuses_histogram(const DsaBatch& batch, int64_t num_heads) {
  if (!dsa_indexer_takes_histogram(batch.num_q, num_heads)) return false;
  if (batch.num_requests * batch.num_q * batch.max_context <= kFuseAlwaysScores) return true;
  CHECK(num_heads >= 16 && num_heads <= 64 && num_heads % 16 == 0,
        "indexer heads must be 16, 32, 48 or 64, got ", num_heads);
  // Per (device, n_q, Hi) the occupancy answer never changes: asked once, not per step.
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t>, bool> no_block_lost;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, batch.num_q, num_heads);
  auto it = no_block_lost.find(key);
  if (it == no_block_lost.end()) {
    it = no_block_lost
             .emplace(key, resident_blocks(batch.num_q, num_heads, true) >=
                               resident_blocks(batch.num_q, num_heads, false))
             .first;
  }
  return it->second;
}

}  // namespace hyserve::cuda
