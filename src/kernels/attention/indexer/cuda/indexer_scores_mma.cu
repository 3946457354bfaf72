// Indexer scores against the FP8 index-key cache on tensor cores, for calls with one
// block table for all queries (prefill); see indexer_scores_mma.h.
//
// Tiling. A CTA of 8 warps takes a query tile (8 queries with 32 or 64 heads, 16 with 16
// heads: every warp owns the heads of one query, of two when there are 16) and a range
// of keys_per_cta keys, walked in tiles of 64. Each warp quantizes its query rows in the
// prologue exactly as cpu quantize_fp8_ue8m0 does ([T * Hi, 128] rows, ue8m0 scale per
// row), stages the codes in shared memory and keeps them in registers as MMA A fragments
// for the whole key range. Key tiles (codes and scales, each key's row found through the
// block table) stream through shared memory with cp.async, 3 stages; every warp
// multiplies all 64 keys of a tile against its rows, 32 keys at a time.
//
// Grid: x = query tile (fastest), y = key range. Blocks start in linear order, so the
// CTAs resident together are all query tiles of a few key ranges: a key tile comes from
// HBM once and from L2 for the other query tiles. Tiles beyond the largest q_pos of a
// CTA's queries are neither loaded nor multiplied; their scores are written -inf.
//
// MMA m16n8k16 f16 -> fp32 on the e4m3 codes converted in registers (exact: every e4m3
// value is an f16, every product fits fp32); mma.sync with e4m3 operands lowers on sm_90
// to the same f16 MMAs plus conversions of both operands and partial-sum adds at every
// MMA. A = 16 head rows x 16 dims, B = 16 dims x 8 keys. As in dsa_indexer.cu the 128
// dims are permuted alike for A and B: lane (g = lane / 4, t = lane % 4) holds bytes
// [32t, 32t + 32) of its rows g, g + 8 and of its key (g of the n-tile) as words
// w0..w7; k-step s (of 8) uses word s, its low byte pair as a0/a1 and b0, its high pair
// as a2/a3 and b1. The query fragments are converted once (one or two m-tiles) or at
// each k-step (four m-tiles, 64 heads: the registers would not hold them); the keys once
// per warp and 32 keys.
//
// Epilogue per query and 32 keys (n-tiles j = 0..3): lane (g, t) holds relu(dot) for
// heads g, g + 8 of each m-tile and keys 8j + 2t + e (e = 0, 1); it weights them by
// w' = head weight * q scale and sums its m-tiles into 8 values v[2j + e]. A butterfly
// reduce-scatter over the 8 lanes of equal t (xor 16, 8, 4; 7 shuffles) leaves lane
// (g, t) the sum over all heads of value g, i.e. of key 8(g / 2) + 2t + g % 2: the warp
// holds the 32 keys once each and writes them with one 128-byte store, times the key's
// scale, or -inf beyond the query's q_pos.
//
// Shared memory (bytes): keys [3 stages][64][144] | scales [3][64] fp32 | q staging
// [8 warps][rows per warp][144]. The 144-byte row pitch (16-aligned for cp.async) puts
// the 16-byte fragment loads of 8 consecutive lanes (2 rows x 4 t) on distinct banks.
// The A fragments live in registers for the whole key range: ~180 registers per thread
// (32 heads), one CTA per SM; latency is hidden by the 3-stage copies and the 32
// independent MMAs of each warp per 32 keys.
//
// Precision: the e4m3 products are exact; the tensor cores add them (and the fp32
// accumulator) in their own order and internal precision, and the epilogue adds heads
// in another order than the CPU. The scores differ from cpu::indexer_scores_fp8_cache by
// at most ~2^-10 of k_scale * sum_h |w'_h| * sum_d |q8 k8| (the bound the DSA decode
// indexer on the same MMA is tested with); masked keys are -inf exactly.
#include "kernels/attention/indexer/cuda/indexer_scores_mma.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "kernels/attention/indexer/cuda/tensor_score_common.cuh"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda::indexer {
namespace {

using dsa::cp_async_16;
using dsa::cp_async_commit;
using dsa::cp_async_wait;
using dsa::mma_f16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadDim = 128;
constexpr int kKeyTile = 64;
constexpr int kStages = 3;
constexpr int kPitch = 144;  // bytes per key row and per query row in shared memory

template <int kHeads>
struct Tiling {
  static constexpr int kWarpQueries = kHeads == 16 ? 2 : 1;
  static constexpr int kWarpRows = kWarpQueries * kHeads;  // MMA M rows per warp
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kQueryMTiles = kHeads / 16;
  static constexpr int kCtaQueries = kWarps * kWarpQueries;
  static constexpr size_t kKeyBytes = size_t{kStages} * kKeyTile * kPitch;
  static constexpr size_t kScaleBytes = size_t{kStages} * kKeyTile * sizeof(float);
  static constexpr size_t kSmemBytes =
      kKeyBytes + kScaleBytes + size_t{kWarps} * kWarpRows * kPitch;
};

using Args = TensorScoreArgs;

// Word w (0..7) of 32 bytes held as two uint4.
__device__ __forceinline__ uint32_t word(const uint4 (&v)[2], int w) {
  return dsa::word4(v[w >> 2], w & 3);
}

// Copies keys [tile0, tile0 + 64) (codes and scales) into one stage; keys at or past
// num_keys read nothing and land as zeros.
__device__ __forceinline__ void load_key_tile(const Args& a, int64_t tile0, uint8_t* keys_s,
                                              float* scales_s) {
  for (int c = threadIdx.x; c < kKeyTile * 8; c += kThreads) {
    const int key = c / 8;
    const int chunk = c % 8;
    const int64_t s = tile0 + key;
    const bool valid = s < a.num_keys;
    const uint8_t* src = valid ? a.k_pages.row(a.k_fp8, s, kHeadDim) + chunk * 16 : a.k_fp8;
    cp_async_16(keys_s + key * kPitch + chunk * 16, src, valid ? 16 : 0);
  }
  if (threadIdx.x < kKeyTile) {
    const int64_t s = tile0 + threadIdx.x;
    const bool valid = s < a.num_keys;
    const float* src = valid ? a.k_pages.row(a.k_scales, s, 1) : a.k_scales;
    dsa::cp_async_4(scales_s + threadIdx.x, src, valid ? 4 : 0);
  }
}

// v[i] summed over the 8 lanes of equal lane % 4 (g = lane / 4 = 0..7); lane (g, t)
// returns the sum of v[g]. Each step halves the values a lane keeps: the one with g's
// bit set keeps the upper half and sends the lower.
__device__ __forceinline__ float reduce_scatter8(const float (&v)[8], int g) {
  const bool b2 = (g & 4) != 0;
  float h4[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float keep = b2 ? v[4 + k] : v[k];
    const float send = b2 ? v[k] : v[4 + k];
    h4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  const bool b1 = (g & 2) != 0;
  float h2[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float keep = b1 ? h4[2 + k] : h4[k];
    const float send = b1 ? h4[k] : h4[2 + k];
    h2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const bool b0 = (g & 1) != 0;
  const float keep = b0 ? h2[1] : h2[0];
  const float send = b0 ? h2[0] : h2[1];
  return keep + __shfl_xor_sync(0xffffffffu, send, 4);
}

template <int kHeads>
__global__ void __launch_bounds__(kThreads, 1) mma_score_kernel(Args a) {
  using L = Tiling<kHeads>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* keys_s = smem;                                           // [stages][64][kPitch]
  float* scales_s = reinterpret_cast<float*>(smem + L::kKeyBytes);  // [stages][64]
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  uint8_t* q_s = smem + L::kKeyBytes + L::kScaleBytes + warp * L::kWarpRows * kPitch;

  const int64_t query0 = int64_t{blockIdx.x} * L::kCtaQueries;
  const int num_queries = static_cast<int>(min(int64_t{L::kCtaQueries}, a.num_tokens - query0));
  const int64_t begin = int64_t{blockIdx.y} * a.keys_per_cta;
  const int64_t end = min(a.num_keys, begin + a.keys_per_cta);

  // Tiles up to the CTA's largest visible key are computed, the keys after them -inf.
  const int num_tiles = visible_steps<kThreads>(a, query0, num_queries, begin, end, kKeyTile);
  if (num_tiles == 0) return;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles) {
      load_key_tile(a, begin + int64_t{st} * kKeyTile, keys_s + st * kKeyTile * kPitch,
                    scales_s + st * kKeyTile);
    }
    cp_async_commit();
  }

  // The warp's query rows, one per step: lane holds dims [4 lane, 4 lane + 4).
  const int64_t warp_query0 = query0 + warp * L::kWarpQueries;
  const int warp_queries = max(0, min(L::kWarpQueries, num_queries - warp * L::kWarpQueries));
  const int warp_rows = warp_queries * kHeads;
  float w_lo[L::kMTiles] = {};  // w' of row mt * 16 + g
  float w_hi[L::kMTiles] = {};  // w' of row mt * 16 + 8 + g
  for (int r = 0; r < warp_rows; ++r) {
    float w = 0.0f;
    *reinterpret_cast<uint32_t*>(q_s + r * kPitch + lane * 4) =
        quantize_q_row(a, warp_query0 * kHeads + r, lane, w);
#pragma unroll
    for (int mt = 0; mt < L::kMTiles; ++mt) {
      if (r == mt * 16 + g) w_lo[mt] = w;
      if (r == mt * 16 + 8 + g) w_hi[mt] = w;
    }
  }
  __syncwarp();
  uint4 a_frag[L::kMTiles][2][2];  // m-tile, row g / g + 8, bytes [32t, +16) / [+16, +32)
#pragma unroll
  for (int mt = 0; mt < L::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + half * 8 + g;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4* src = reinterpret_cast<const uint4*>(q_s + row * kPitch + t * 32);
      a_frag[mt][half][0] = row < warp_rows ? src[0] : zero;
      a_frag[mt][half][1] = row < warp_rows ? src[1] : zero;
    }
  }
  // f16 A fragments of k-step s (of 8, word s of the lane's 32 bytes): rows g / g + 8,
  // low / high byte pair (regs a0..a3). With at most two m-tiles they are converted once
  // and stay in registers; with four (64 heads) they are converted at each use.
  constexpr bool kResident = L::kMTiles <= 2;
  uint32_t a16[kResident ? L::kMTiles : 1][8][4];
  auto a_words = [&](int mt, int s, uint32_t(&out)[4]) {
    const uint32_t lo = word(a_frag[mt][0], s);  // row g
    const uint32_t hi = word(a_frag[mt][1], s);  // row g + 8
    out[0] = dsa::e4m3x2_to_f16x2(lo & 0xffffu);
    out[1] = dsa::e4m3x2_to_f16x2(hi & 0xffffu);
    out[2] = dsa::e4m3x2_to_f16x2(lo >> 16);
    out[3] = dsa::e4m3x2_to_f16x2(hi >> 16);
  };
  if constexpr (kResident) {
#pragma unroll
    for (int mt = 0; mt < L::kMTiles; ++mt) {
#pragma unroll
      for (int s = 0; s < 8; ++s) a_words(mt, s, a16[mt][s]);
    }
  }
  // Per query: its scores from key `begin` on, and its last visible key relative to
  // begin (keys_per_cta bounds every offset, so they fit int).
  float* out[L::kWarpQueries];
  int last_visible[L::kWarpQueries];
#pragma unroll
  for (int qi = 0; qi < L::kWarpQueries; ++qi) {
    const bool valid = qi < warp_queries;
    out[qi] = a.scores + (valid ? (warp_query0 + qi) * a.num_keys + begin : 0);
    const int64_t rel = valid ? a.q_pos[warp_query0 + qi] - begin : -1;
    last_visible[qi] = static_cast<int>(max(int64_t{-1}, min(rel, a.keys_per_cta)));
  }
  const int num_local = static_cast<int>(end - begin);

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile's stage landed for every thread; tile - 1's stage is free
    const int next = tile + kStages - 1;
    if (next < num_tiles) {
      load_key_tile(a, begin + int64_t{next} * kKeyTile,
                    keys_s + (next % kStages) * kKeyTile * kPitch,
                    scales_s + (next % kStages) * kKeyTile);
    }
    cp_async_commit();
    if (warp_queries == 0) continue;
    const uint8_t* tile_keys = keys_s + (tile % kStages) * kKeyTile * kPitch;
    const float* tile_scales = scales_s + (tile % kStages) * kKeyTile;
#pragma unroll 1
    for (int key0 = 0; key0 < kKeyTile; key0 += 32) {
      float acc[L::kMTiles][4][4] = {};
      uint4 b_frag[4][2];  // n-tile j: key key0 + 8j + g, bytes [32t, +32)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4* src =
            reinterpret_cast<const uint4*>(tile_keys + (key0 + j * 8 + g) * kPitch + t * 32);
        b_frag[j][0] = src[0];
        b_frag[j][1] = src[1];
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        uint32_t b16[4][2];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t w = word(b_frag[j], s);
          b16[j][0] = dsa::e4m3x2_to_f16x2(w & 0xffffu);
          b16[j][1] = dsa::e4m3x2_to_f16x2(w >> 16);
        }
#pragma unroll
        for (int mt = 0; mt < L::kMTiles; ++mt) {
          uint32_t conv[4];
          if constexpr (!kResident) a_words(mt, s, conv);
          const uint32_t(&a4)[4] = kResident ? a16[kResident ? mt : 0][s] : conv;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            mma_f16(acc[mt][j], a4[0], a4[1], a4[2], a4[3], b16[j][0], b16[j][1]);
          }
        }
      }
      const int my_key =
          key0 + (g >> 1) * 8 + 2 * t + (g & 1);  // this lane's key after the reduction
      const float key_scale = tile_scales[my_key];
      const int key = tile * kKeyTile + my_key;  // relative to begin
#pragma unroll
      for (int qi = 0; qi < L::kWarpQueries; ++qi) {
        float v[8] = {};  // v[2j + e]: key 8j + 2t + e
#pragma unroll
        for (int m = 0; m < L::kQueryMTiles; ++m) {
          const int mt = qi * L::kQueryMTiles + m;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            v[2 * j] +=
                w_lo[mt] * fmaxf(acc[mt][j][0], 0.0f) + w_hi[mt] * fmaxf(acc[mt][j][2], 0.0f);
            v[2 * j + 1] +=
                w_lo[mt] * fmaxf(acc[mt][j][1], 0.0f) + w_hi[mt] * fmaxf(acc[mt][j][3], 0.0f);
          }
        }
        const float total = reduce_scatter8(v, g);
        if (qi < warp_queries && key < num_local) {
          out[qi][key] = key <= last_visible[qi] ? key_scale * total : -INFINITY;
        }
      }
    }
  }
}

template <int kHeads>
void launch(Args a, cudaStream_t stream) {
  using L = Tiling<kHeads>;
  int device = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(L::kSmemBytes <= static_cast<size_t>(max_smem),
        "indexer scores (tensor cores): ", L::kSmemBytes,
        " bytes of shared memory needed, the device has ", max_smem);
  const int64_t num_query_tiles = (a.num_tokens + L::kCtaQueries - 1) / L::kCtaQueries;
  a.keys_per_cta = plan_keys_per_cta(a.num_keys, num_query_tiles, kKeyTile);
  const int64_t num_ranges = (a.num_keys + a.keys_per_cta - 1) / a.keys_per_cta;
  CUDA_CHECK(cudaFuncSetAttribute(mma_score_kernel<kHeads>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(L::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>(num_query_tiles), static_cast<unsigned>(num_ranges));
  mma_score_kernel<kHeads><<<grid, kThreads, L::kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

bool mma_scorer_supports(const IndexerFp8CacheScoreParams& p) {
  const bool one_table = p.table_stride == 0 || !p.k_pages.paged();
  const bool heads = p.num_heads == 16 || p.num_heads == 32 || p.num_heads == 64;
  const bool rows_aligned = aligned(p.q, 16) && aligned(p.k_fp8, 16) && aligned(p.k_scales, 4) &&
                            (!p.k_pages.paged() || p.k_pages.block_stride_bytes % 16 == 0);
  return one_table && heads && p.head_dim == kHeadDim && rows_aligned;
}

TensorScoreArgs tensor_score_args(const IndexerFp8CacheScoreParams& p) {
  return {.q = p.q,
          .k_fp8 = p.k_fp8,
          .k_scales = p.k_scales,
          .k_pages = p.k_pages,
          .head_weights = p.head_weights,
          .q_pos = p.q_pos,
          .scores = p.scores,
          .num_tokens = p.num_tokens,
          .num_keys = p.num_keys,
          .keys_per_cta = 0};
}

int64_t plan_keys_per_cta(int64_t num_keys, int64_t num_query_tiles, int64_t step) {
  constexpr int64_t kMinKeysPerCta = 256, kMaxKeysPerCta = 4096;
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  int64_t keys = (num_keys * num_query_tiles + 8 * num_sms - 1) / (8 * num_sms);
  keys = std::clamp((keys + kMinKeysPerCta - 1) / kMinKeysPerCta * kMinKeysPerCta, kMinKeysPerCta,
                    kMaxKeysPerCta);
  const int64_t max_ranges = 65535;
  const int64_t min_keys = (num_keys + max_ranges - 1) / max_ranges;
  return std::max(keys, (min_keys + step - 1) / step * step);
}

void indexer_scores_fp8_cache_mma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream) {
  CHECK(mma_scorer_supports(p), "indexer scores (tensor cores): unsupported call");
  if (p.num_tokens == 0 || p.num_keys == 0) return;
  const Args a = tensor_score_args(p);
  dispatch_index_heads(p.num_heads, [&]<int kHeads>() { launch<kHeads>(a, stream); });
}

}  // namespace hyserve::cuda::indexer
