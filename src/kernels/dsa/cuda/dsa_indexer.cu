// DSA indexer scores over the packed cache on FP8 tensor cores (cuda.h).
//
// Block (chunk, b): keys [chunk * keys_per_block, +keys_per_block) of request b, all n_q
// queries of b. Its n_q * Hi query rows (e4m3) sit in shared memory; each warp walks
// tiles of 32 keys (4 MMA n-tiles of 8), every key read once from global memory with two
// 16-byte loads per lane, the next tile prefetched into registers while the current one
// is multiplied.
//
// MMA m16n8k32 (A = 16 query-head rows x 32 dims, B = 32 dims x 8 keys). The dot product
// is a sum over the 128 dims, so any permutation of the dims applied to A and B alike
// gives the same result; we pick the one that makes every lane's operands contiguous:
// lane (g = lane / 4, t = lane % 4) loads bytes [32t, 32t + 32) of its key row (key g of
// the n-tile) and of its query rows (g and g + 8 of the m-tile) = 8 words w0..w7, and
// k-step s (of 4) uses words 2s (fragment regs a0/a1, b0) and 2s + 1 (a2/a3, b1).
//
// Epilogue per query: lane holds relu(dot) for heads g, g + 8 of each m-tile and keys
// 2t, 2t + 1 of each n-tile; it weights them by w, sums its m-tiles, then the 8 lanes of
// equal t reduce by shuffles; lanes 0..3 scale by the key's scale and store. With a
// histogram (the top-k's first radix pass, fused), they also count each visible score's
// bin in a shared histogram per query, added to the global one when the block ends.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/dsa/cuda.h"
#include "kernels/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using dsa::mma_e4m3;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 32;                       // per warp and step
constexpr int kBlockStepKeys = kWarps * kTileKeys;  // 256
constexpr int kQPitch = 144;                        // bytes per query row in shared memory
constexpr int kMaxRows = 8 * 64;                    // n_q * Hi

struct KeyTile {
  uint4 codes[4][2];  // n-tile j: key g's bytes [32t, 32t + 32)
  float2 scales[4];   // n-tile j: scales of keys 2t, 2t + 1
};

// Word w (0..7) of 32 bytes held as two uint4; w is a constant after unrolling.
__device__ __forceinline__ uint32_t word(const uint4 (&v)[2], int w) {
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

__device__ __forceinline__ void load_tile(const DsaIndexerParams& p, int64_t b, int64_t tile0,
                                          int64_t end, int g, int t, KeyTile& k) {
  if (tile0 >= end) return;
  const DsaCache& c = p.cache;
  // A 32-key tile never straddles a block (block_size >= 32, tiles 32-aligned).
  const int64_t block = p.batch.block_tables[b * p.batch.max_blocks + tile0 / c.block_size];
  const uint8_t* page = c.pool + block * c.row_bytes + c.index_offset;
  const auto* scale_page =
      reinterpret_cast<const float*>(page + int64_t{c.block_size} * kDsaIndexDim);
  const int64_t j0 = tile0 % c.block_size;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t key = j0 + j * 8 + g;
    if (tile0 + j * 8 + g < end) {
      const auto* src = reinterpret_cast<const uint4*>(page + key * kDsaIndexDim + t * 32);
      k.codes[j][0] = __ldcs(src);
      k.codes[j][1] = __ldcs(src + 1);
    } else {
      k.codes[j][0] = k.codes[j][1] = make_uint4(0, 0, 0, 0);
    }
    const int64_t pair = j0 + j * 8 + 2 * t;  // even: the two scales are 8-byte aligned
    k.scales[j] = tile0 + j * 8 + 2 * t < end
                      ? __ldcs(reinterpret_cast<const float2*>(scale_page + pair))
                      : make_float2(0.0f, 0.0f);
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    indexer_kernel(DsaIndexerParams p, int64_t keys_per_block) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int num_heads = static_cast<int>(p.num_heads);
  const int num_q = static_cast<int>(p.batch.num_q);
  const int num_rows = num_q * num_heads;
  uint8_t* q_s = smem;                                               // [rows, kQPitch]
  float* w_s = reinterpret_cast<float*>(smem + num_rows * kQPitch);  // [rows]
  // [n_q, kDsaTopkBins] when p.histogram is set.
  int* hist_s = p.histogram != nullptr ? reinterpret_cast<int*>(w_s + num_rows) : nullptr;

  const int64_t b = blockIdx.y;
  // Clamped so that a length beyond the host bound (a caller bug) cannot write outside.
  const int64_t seq_len = min(int64_t{p.batch.seq_lens[b]}, p.batch.max_context);
  const int64_t begin = blockIdx.x * keys_per_block;
  if (begin >= seq_len) return;
  const int64_t end = min(seq_len, begin + keys_per_block);

  const auto* q_src = reinterpret_cast<const uint4*>(p.q8 + b * num_rows * kDsaIndexDim);
  for (int i = threadIdx.x; i < num_rows * 8; i += kThreads) {
    *reinterpret_cast<uint4*>(q_s + (i / 8) * kQPitch + (i % 8) * 16) = q_src[i];
  }
  for (int i = threadIdx.x; i < num_rows; i += kThreads) w_s[i] = p.weights[b * num_rows + i];
  if (hist_s != nullptr) {
    for (int i = threadIdx.x; i < num_q * kDsaTopkBins; i += kThreads) hist_s[i] = 0;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int num_mtiles = num_heads / 16;
  KeyTile cur, next;
  int64_t tile0 = begin + warp * kTileKeys;
  load_tile(p, b, tile0, end, g, t, cur);
  for (; tile0 < end; tile0 += kBlockStepKeys) {
    load_tile(p, b, tile0 + kBlockStepKeys, end, g, t, next);
    for (int i = 0; i < num_q; ++i) {
      float part[4][2] = {};
      for (int mt = 0; mt < num_mtiles; ++mt) {
        const int row = i * num_heads + mt * 16 + g;
        const uint4* qa = reinterpret_cast<const uint4*>(q_s + row * kQPitch + t * 32);
        const uint4* qb = reinterpret_cast<const uint4*>(q_s + (row + 8) * kQPitch + t * 32);
        const uint4 ra[2] = {qa[0], qa[1]};  // row g
        const uint4 rb[2] = {qb[0], qb[1]};  // row g + 8
        float acc[4][4] = {};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            mma_e4m3(acc[j], word(ra, 2 * s), word(rb, 2 * s), word(ra, 2 * s + 1),
                     word(rb, 2 * s + 1), word(cur.codes[j], 2 * s), word(cur.codes[j], 2 * s + 1));
          }
        }
        const float w0 = w_s[row];
        const float w1 = w_s[row + 8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          part[j][0] += w0 * fmaxf(acc[j][0], 0.0f) + w1 * fmaxf(acc[j][2], 0.0f);
          part[j][1] += w0 * fmaxf(acc[j][1], 0.0f) + w1 * fmaxf(acc[j][3], 0.0f);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = part[j][e];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          part[j][e] = v;
        }
      }
      if (g == 0) {
        const int64_t position = seq_len - num_q + i;
        float* out = p.scores + (b * num_q + i) * p.score_stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t key = tile0 + j * 8 + 2 * t;
          const float s0 = key <= position ? cur.scales[j].x * part[j][0] : -INFINITY;
          const float s1 = key + 1 <= position ? cur.scales[j].y * part[j][1] : -INFINITY;
          if (key < end) out[key] = s0;
          if (key + 1 < end) out[key + 1] = s1;
          if (hist_s != nullptr) {
            int* h = hist_s + i * kDsaTopkBins;
            if (key <= position) atomicAdd(&h[dsa_order_key(s0) >> kDsaTopkBinShift], 1);
            if (key + 1 <= position) atomicAdd(&h[dsa_order_key(s1) >> kDsaTopkBinShift], 1);
          }
        }
      }
    }
    cur = next;
  }
  if (hist_s != nullptr) {
    __syncthreads();
    int* dst = p.histogram + b * num_q * kDsaTopkBins;
    for (int k = threadIdx.x; k < num_q * kDsaTopkBins; k += kThreads) {
      if (hist_s[k] != 0) atomicAdd(&dst[k], hist_s[k]);
    }
  }
}

// Query rows, head weights and (optionally) the histograms of one block.
size_t shared_bytes(int64_t num_q, int64_t num_heads, bool histogram) {
  return static_cast<size_t>(num_q * num_heads) * (kQPitch + sizeof(float)) +
         (histogram ? sizeof(int) * num_q * kDsaTopkBins : 0);
}

// Two blocks per SM (the launch bound) share 227 KiB of shared memory.
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
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  // Cut every request's key range so that about 4 blocks per SM exist in total.
  const int64_t target_blocks = 4 * int64_t{num_sms};
  const int64_t total_keys = p.batch.num_requests * p.batch.max_context;
  int64_t keys_per_block = (total_keys + target_blocks - 1) / target_blocks;
  keys_per_block = std::max<int64_t>(
      kBlockStepKeys, (keys_per_block + kBlockStepKeys - 1) / kBlockStepKeys * kBlockStepKeys);
  const int64_t num_chunks = (p.batch.max_context + keys_per_block - 1) / keys_per_block;
  const size_t smem = shared_bytes(p.batch.num_q, p.num_heads, p.histogram != nullptr);
  CHECK(p.histogram == nullptr || smem <= kMaxSmemFor2Blocks, "indexer: the histograms of n_q ",
        p.batch.num_q, " queries x ", p.num_heads,
        " heads do not fit shared memory (dsa_indexer_fuses_histogram)");
  CUDA_CHECK(cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(p.batch.num_requests));
  indexer_kernel<<<grid, kThreads, smem, stream>>>(p, keys_per_block);
  CUDA_CHECK_LAUNCH();
}

bool dsa_indexer_fuses_histogram(int64_t num_q, int64_t num_heads) {
  return shared_bytes(num_q, num_heads, true) <= kMaxSmemFor2Blocks;
}

}  // namespace hyserve::cuda
