// Indexer scores against the FP8 index-key cache on Hopper's FP8 warpgroup MMAs (e4m3 x
// e4m3 -> f32, wgmma), for calls with one block table for all queries (prefill); the same
// calls, arguments and result as the mma.sync scorer (indexer_scores_mma.cu), which it
// replaces where it is chosen (indexer_scores_mma.h).
//
// Tiling. A CTA of two warpgroups takes 256 (query, head) rows, kQueries = 256 / Hi queries
// (8 at K3's 32 heads, 4 at DeepSeek's 64, 16 at 16), and a range of keys walked in stages
// of 128: warpgroup w multiplies the stage's keys [64w, 64w + 64) against all 256 rows, as
// four MMAs m64n256k32 (K = 128 dims, 32 a step) with the keys as A (64 rows) and the
// queries as B (256 rows), both K-major in shared memory: a key tile read from shared memory
// once serves kQueries queries (the mma.sync scorer multiplies 32 keys per warp and query).
//
// Prologue: warp w quantizes rows 32w ..+32 exactly as cpu quantize_fp8_ue8m0 does ([T * Hi,
// 128] rows, a ue8m0 scale per row) straight into the 128-byte-swizzled B matrix, and keeps
// w' = head weight * q scale per row in shared memory. Key stages (codes, each key's row
// found through the block table, and scales) stream through shared memory with cp.async,
// three stages, one block barrier each.
//
// Epilogue per warpgroup and tile: lane (g, t) of warp v holds the dot products of keys
// 16v + g and 16v + g + 8 with rows 8n + 2t (+1), n = 0..31; per query it sums relu(dot) w'
// over its 8 (Hi = 32) rows, then over the 4 lanes of equal g (2 shuffles): every head. The
// [kQueries][64] sums go through shared memory and out as whole 256-byte rows of a query's
// scores, times the key's scale, or -inf past the query's q_pos.
//
// Precision: the e4m3 products are exact; the tensor cores add them in their own order and
// internal precision (as the DSA decode indexer's wgmma does), the epilogue adds heads in
// another order than the CPU: the mma.sync scorer's bound holds, ~2^-10 of k_scale *
// sum_h |w'_h| * sum_d |q8 k8|; masked keys are -inf exactly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/cuda/wgmma.cuh"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "kernels/attention/indexer/cuda/indexer_scores_mma.h"
#include "kernels/attention/indexer/cuda/tensor_score_common.cuh"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda::indexer {
namespace {

using dsa::cp_async_16;
using dsa::cp_async_4;
using dsa::cp_async_commit;
using dsa::cp_async_wait;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kHeadDim = 128;
constexpr int kRows = 256;       // (query, head) rows of a CTA: the MMA's N
constexpr int kTileKeys = 64;    // a warpgroup's keys: the MMA's M
constexpr int kStageKeys = 128;  // both warpgroups' tiles
constexpr int kStages = 3;
constexpr int kTileBytes = kTileKeys * kHeadDim;  // 8 KB of codes

template <int kHeads>
struct Layout {
  static constexpr int kQueries = kRows / kHeads;
  static constexpr int kQ = 0;                                       // [256][128] e4m3
  static constexpr int kKeys = kQ + kRows * kHeadDim;                // [stages][2][64][128]
  static constexpr int kScales = kKeys + kStages * 2 * kTileBytes;   // [stages][128] f32
  static constexpr int kW = kScales + kStages * kStageKeys * 4;      // [256] f32
  static constexpr int kOut = kW + kRows * 4;                        // [2][kQueries][64] f32
  static constexpr int kLast = kOut + 2 * kQueries * kTileKeys * 4;  // [kQueries] int
  static constexpr int kBytes = kLast + kQueries * 4;
  static constexpr int kAllocated = kBytes + 1024;  // + the base's alignment
};

using Args = TensorScoreArgs;

// Keys [stage0, stage0 + 128) (codes and scales) into one stage; keys at or past num_keys
// read nothing and land as zeros.
__device__ __forceinline__ void load_stage(const Args& a, int64_t stage0, uint8_t* keys_s,
                                           float* scales_s) {
  for (int c = threadIdx.x; c < kStageKeys * 8; c += kThreads) {
    const int key = c / 8, chunk = c % 8;
    const int64_t s = stage0 + key;
    const bool valid = s < a.num_keys;
    const uint8_t* src = valid ? a.k_pages.row(a.k_fp8, s, kHeadDim) + chunk * 16 : a.k_fp8;
    cp_async_16(sw128_chunk(keys_s + (key / kTileKeys) * kTileBytes, key % kTileKeys, chunk), src,
                valid ? 16 : 0);
  }
  if (threadIdx.x < kStageKeys) {
    const int64_t s = stage0 + threadIdx.x;
    const bool valid = s < a.num_keys;
    cp_async_4(scales_s + threadIdx.x, valid ? a.k_pages.row(a.k_scales, s, 1) : a.k_scales,
               valid ? 4 : 0);
  }
}

template <int kHeads>
__global__ void __launch_bounds__(kThreads, 1) wgmma_score_kernel(Args a) {
  using L = Layout<kHeads>;
  constexpr int kQueries = L::kQueries;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint8_t* q_s = smem + L::kQ;
  uint8_t* keys_s = smem + L::kKeys;
  auto* scales_s = reinterpret_cast<float*>(smem + L::kScales);
  auto* w_s = reinterpret_cast<float*>(smem + L::kW);
  auto* out_s = reinterpret_cast<float*>(smem + L::kOut);
  auto* last_s = reinterpret_cast<int*>(smem + L::kLast);

  const int group = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x % 128) / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t query0 = int64_t{blockIdx.x} * kQueries;
  const int num_queries = static_cast<int>(min(int64_t{kQueries}, a.num_tokens - query0));
  const int64_t begin = int64_t{blockIdx.y} * a.keys_per_cta;
  const int64_t end = min(a.num_keys, begin + a.keys_per_cta);
  const int num_local = static_cast<int>(end - begin);

  // Stages up to the CTA's largest visible key are computed, the keys after them -inf.
  const int num_stages = visible_steps<kThreads>(a, query0, num_queries, begin, end, kStageKeys);
  if (num_stages == 0) return;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_stages) {
      load_stage(a, begin + int64_t{st} * kStageKeys, keys_s + st * 2 * kTileBytes,
                 scales_s + st * kStageKeys);
    }
    cp_async_commit();
  }

  // The CTA's rows, quantized: warp w takes rows 32w ..+32, lane the dims [4 lane, +4).
  for (int r = warp * 32; r < warp * 32 + 32; ++r) {
    const int qi = r / kHeads;
    uint32_t codes = 0;
    float w = 0.0f;
    if (qi < num_queries) codes = quantize_q_row(a, query0 * kHeads + r, lane, w);
    *reinterpret_cast<uint32_t*>(q_s + sw128_offset(r, 4 * lane)) = codes;
    if (lane == 0) w_s[r] = w;
  }
  if (threadIdx.x < kQueries) {
    // The query's last visible key relative to begin (keys_per_cta bounds every offset).
    const int qi = static_cast<int>(threadIdx.x);
    const int64_t rel = qi < num_queries ? a.q_pos[query0 + qi] - begin : -1;
    last_s[qi] = static_cast<int>(max(int64_t{-1}, min(rel, a.keys_per_cta)));
  }
  fence_proxy_async();

  float* my_out = out_s + group * kQueries * kTileKeys;
  const int k_lo = 16 * warp_in_group + g;  // this thread's keys of a tile: k_lo, k_lo + 8
  for (int stage = 0; stage < num_stages; ++stage) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();  // the stage landed for every thread; the stage before it is free
    const int next = stage + kStages - 1;
    if (next < num_stages) {
      load_stage(a, begin + int64_t{next} * kStageKeys, keys_s + (next % kStages) * 2 * kTileBytes,
                 scales_s + (next % kStages) * kStageKeys);
    }
    cp_async_commit();
    const int tile0 = stage * kStageKeys + group * kTileKeys;  // relative to begin
    if (tile0 >= num_local) continue;                          // uniform over the warpgroup
    const uint8_t* tile_keys = keys_s + (stage % kStages) * 2 * kTileBytes + group * kTileBytes;
    const float* tile_scales = scales_s + (stage % kStages) * kStageKeys + group * kTileKeys;

    float d[kRows / 2];
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kHeadDim / 32; ++s) {
      wgmma_e4m3<kRows>(d, wgmma_desc_sw128(tile_keys + 32 * s), wgmma_desc_sw128(q_s + 32 * s),
                        s > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>(d);

    // Per query: relu(dot) w' over its rows (columns), then over the 4 lanes of a key.
#pragma unroll
    for (int qi = 0; qi < kQueries; ++qi) {
      float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
      for (int nn = 0; nn < kHeads / 8; ++nn) {
        const int n = qi * (kHeads / 8) + nn;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float w = w_s[8 * n + 2 * t + e];
          v0 += w * fmaxf(d[4 * n + e], 0.0f);
          v1 += w * fmaxf(d[4 * n + 2 + e], 0.0f);
        }
      }
      v0 += __shfl_xor_sync(0xffffffffu, v0, 1);
      v0 += __shfl_xor_sync(0xffffffffu, v0, 2);
      v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
      v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
      if (t == (qi & 3)) {
        my_out[qi * kTileKeys + k_lo] = v0;
        my_out[qi * kTileKeys + k_lo + 8] = v1;
      }
    }
    named_barrier(1 + group, 128);  // the tile's sums are in my_out
    // A query's 64 keys are 64 consecutive scores: four per thread, a warp two queries' rows.
    for (int j = threadIdx.x % 128; j < kQueries * (kTileKeys / 4); j += 128) {
      const int qi = j / (kTileKeys / 4);
      const int kk = (j % (kTileKeys / 4)) * 4;
      if (qi >= num_queries) continue;
      float* row = a.scores + (query0 + qi) * a.num_keys + begin;
      const int last_visible = last_s[qi];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile0 + kk + e;
        if (key < num_local) {
          row[key] = key <= last_visible ? tile_scales[kk + e] * my_out[qi * kTileKeys + kk + e]
                                         : -INFINITY;
        }
      }
    }
    named_barrier(1 + group, 128);  // my_out is free for the warpgroup's next tile
  }
}

template <int kHeads>
void launch(Args a, cudaStream_t stream) {
  using L = Layout<kHeads>;
  int device = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(L::kAllocated <= max_smem, "indexer scores (warpgroup MMAs): ", L::kAllocated,
        " bytes of shared memory needed, the device has ", max_smem);
  const int64_t num_query_tiles = (a.num_tokens + L::kQueries - 1) / L::kQueries;
  a.keys_per_cta = plan_keys_per_cta(a.num_keys, num_query_tiles, kStageKeys);
  const int64_t num_ranges = (a.num_keys + a.keys_per_cta - 1) / a.keys_per_cta;
  CUDA_CHECK(cudaFuncSetAttribute(wgmma_score_kernel<kHeads>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, L::kAllocated));
  const dim3 grid(static_cast<unsigned>(num_query_tiles), static_cast<unsigned>(num_ranges));
  wgmma_score_kernel<kHeads><<<grid, kThreads, L::kAllocated, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void indexer_scores_fp8_cache_wgmma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream) {
  CHECK(mma_scorer_supports(p), "indexer scores (warpgroup MMAs): unsupported call");
  if (p.num_tokens == 0 || p.num_keys == 0) return;
  const Args a = tensor_score_args(p);
  dispatch_index_heads(p.num_heads, [&]<int kHeads>() { launch<kHeads>(a, stream); });
}

}  // namespace hyserve::cuda::indexer
