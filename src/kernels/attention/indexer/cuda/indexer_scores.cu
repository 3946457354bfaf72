// CUDA indexer ops (cuda.h): Hadamard rotation, ue8m0 FP8 quantization, scoring.
// The rotation and the quantization perform exactly the CPU's fp32 operations in the
// same order (butterfly adds, one multiply; frexp/ldexp/rint), so their results are
// bitwise equal to cpu.cpp's. Scoring on CUDA cores: one block per (query, tile of 128
// keys), the query's heads in shared memory, one thread per key; the FP8-cache scorer
// hands the calls the tensor-core kernel supports (prefill) to indexer_scores_mma.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "core/cuda/dtype.cuh"
#include "kernels/attention/indexer/check.h"
#include "kernels/attention/indexer/cuda.h"
#include "kernels/attention/indexer/cuda/fp8_quant.cuh"
#include "kernels/attention/indexer/cuda/indexer_scores_mma.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

using indexer::clamp_e4m3;
using indexer::max_like_std;
using indexer::ue8m0_scale;
using indexer::warp_max;

constexpr int kScoreTile = 128;  // keys per block, one per thread
constexpr int kMaxHadamardDim = 8192;

enum class KeyMode { kF32, kF32Quantized, kFp8Cache };

__global__ void hadamard_kernel(float* x, int64_t dim, float norm) {
  extern __shared__ float v[];
  float* row = x + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = row[i];
  __syncthreads();
  for (int64_t half = 1; half < dim; half *= 2) {
    for (int64_t p = threadIdx.x; p < dim / 2; p += blockDim.x) {
      const int64_t j = (p / half) * 2 * half + p % half;
      const float a = v[j], b = v[j + half];
      v[j] = a + b;
      v[j + half] = a - b;
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) row[i] = v[i] * norm;
}

// One warp per (row, block of 128 values).
__global__ void quantize_kernel(const float* x, int64_t rows, int64_t dim, uint8_t* q,
                                float* scales) {
  const int64_t num_blocks = (dim + kIndexerFp8BlockSize - 1) / kIndexerFp8BlockSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * num_blocks) return;
  const int64_t r = warp / num_blocks;
  const int64_t b = warp % num_blocks;
  const int64_t lo = b * kIndexerFp8BlockSize;
  const int64_t hi = dim < lo + kIndexerFp8BlockSize ? dim : lo + kIndexerFp8BlockSize;
  float amax = 0.0f;
  for (int64_t i = lo + lane; i < hi; i += 32) amax = max_like_std(amax, fabsf(x[r * dim + i]));
  const float s = ue8m0_scale(warp_max(amax));
  if (lane == 0) scales[r * num_blocks + b] = s;
  for (int64_t i = lo + lane; i < hi; i += 32) {
    q[r * dim + i] = f32_to_e4m3(clamp_e4m3(x[r * dim + i] / s));
  }
}

struct ScoreArgs {
  const float* q;             // [T, Hi, d]
  const float* k;             // [S, d] (kF32, kF32Quantized)
  const uint8_t* k_fp8;       // [S, d] (kFp8Cache)
  const float* k_scales;      // [S] (kFp8Cache)
  PagedRows k_pages;          // of k, or of k_fp8 and k_scales
  int64_t table_stride;       // > 0: query t's block table is t * table_stride further
  const float* head_weights;  // [T, Hi]
  const int64_t* q_pos;       // [T]
  float* scores;              // [T, S]
  int64_t num_keys;
  int num_heads;
  int head_dim;
};

// Shared memory: q [Hi, d] | w [Hi] | keys transposed [d, kScoreTile + 1].
template <KeyMode kMode>
__global__ void score_kernel(ScoreArgs a) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  const int num_heads = a.num_heads;
  float* q_s = smem;
  float* w_s = q_s + num_heads * d;
  float* k_t = w_s + num_heads;
  constexpr int kPitch = kScoreTile + 1;

  const int64_t t = blockIdx.y;
  const PagedRows pages = a.k_pages.for_query(t, a.table_stride);
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * kScoreTile;
  const int64_t s = tile0 + threadIdx.x;
  const int64_t last = a.q_pos[t] < a.num_keys ? a.q_pos[t] : a.num_keys - 1;
  float* out_row = a.scores + t * a.num_keys;
  const float neg_inf = -INFINITY;
  if (tile0 > last) {
    if (s < a.num_keys) out_row[s] = neg_inf;
    return;
  }

  for (int i = threadIdx.x; i < num_heads * d; i += blockDim.x) {
    q_s[i] = a.q[t * num_heads * d + i];
  }
  for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
    w_s[h] = a.head_weights[t * num_heads + h];
  }
  // Each key's row address once (one block-table lookup per key, not per element), then
  // the tile's elements strided over the block so that a warp reads consecutive bytes.
  __shared__ const void* key_rows[kScoreTile];
  {
    const int64_t src = tile0 + threadIdx.x;
    const void* row = nullptr;
    if (src <= last) {
      if constexpr (kMode == KeyMode::kFp8Cache) {
        row = pages.row(a.k_fp8, src, d);
      } else {
        row = pages.row(a.k, src, d);
      }
    }
    key_rows[threadIdx.x] = row;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kScoreTile * d; i += blockDim.x) {
    const int key = i / d;
    const int dd = i - key * d;
    const void* row = key_rows[key];
    float val = 0.0f;
    if (row != nullptr) {
      if constexpr (kMode == KeyMode::kFp8Cache) {
        val = e4m3_to_f32(static_cast<const uint8_t*>(row)[dd]);
      } else {
        val = static_cast<const float*>(row)[dd];
      }
    }
    k_t[dd * kPitch + key] = val;
  }
  __syncthreads();

  if constexpr (kMode != KeyMode::kF32) {
    // q per head: a warp per head row, like cpu quantize_fp8_ue8m0 on [T*Hi, d].
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    for (int h = warp; h < num_heads; h += blockDim.x / 32) {
      float* row = q_s + h * d;
      float amax = 0.0f;
      for (int i = lane; i < d; i += 32) amax = max_like_std(amax, fabsf(row[i]));
      const float scale = ue8m0_scale(warp_max(amax));
      for (int i = lane; i < d; i += 32) {
        row[i] = e4m3_to_f32(f32_to_e4m3(clamp_e4m3(row[i] / scale)));
      }
      if (lane == 0) w_s[h] *= scale;
    }
  }
  float k_scale = 1.0f;
  if constexpr (kMode == KeyMode::kF32Quantized) {
    float amax = 0.0f;
    for (int dd = 0; dd < d; ++dd) amax = max_like_std(amax, fabsf(k_t[dd * kPitch + threadIdx.x]));
    k_scale = ue8m0_scale(amax);
    for (int dd = 0; dd < d; ++dd) {
      float& kv = k_t[dd * kPitch + threadIdx.x];
      kv = e4m3_to_f32(f32_to_e4m3(clamp_e4m3(kv / k_scale)));
    }
  } else if constexpr (kMode == KeyMode::kFp8Cache) {
    if (s <= last) k_scale = *pages.row(a.k_scales, s, 1);
  }
  __syncthreads();

  if (s >= a.num_keys) return;
  if (s > last) {
    out_row[s] = neg_inf;
    return;
  }
  float acc = 0.0f;
  for (int h = 0; h < num_heads; ++h) {
    const float* qh = q_s + h * d;
    float dot = 0.0f;
    for (int dd = 0; dd < d; ++dd) dot += qh[dd] * k_t[dd * kPitch + threadIdx.x];
    acc += w_s[h] * fmaxf(dot, 0.0f);
  }
  out_row[s] = kMode == KeyMode::kF32 ? acc : k_scale * acc;
}

template <KeyMode kMode>
void launch_scores(const ScoreArgs& a, int64_t num_tokens, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (static_cast<size_t>(a.num_heads) * a.head_dim + a.num_heads +
                                       static_cast<size_t>(a.head_dim) * (kScoreTile + 1));
  int device = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(smem <= static_cast<size_t>(max_smem), "indexer scores: ", a.num_heads, " heads x ",
        a.head_dim, " dims need ", smem, " bytes of shared memory, the device has ", max_smem);
  CUDA_CHECK(cudaFuncSetAttribute(score_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>((a.num_keys + kScoreTile - 1) / kScoreTile),
                  static_cast<unsigned>(num_tokens));
  score_kernel<kMode><<<grid, kScoreTile, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

// CUDA-only limits of the scorers (after validate): the grid's y dimension holds the
// queries, its x dimension the tiles of keys.
void check_grid_limits(const char* op, int64_t num_tokens, int64_t num_keys) {
  CHECK(num_tokens <= 65535, op, ": at most 65535 query tokens (num_tokens) per call, got ",
        num_tokens);
  CHECK(num_keys < (int64_t{1} << 31) * kScoreTile, op, ": num_keys ", num_keys);
}

}  // namespace

void hadamard_rotate(float* x, int64_t rows, int64_t dim, cudaStream_t stream) {
  validate(HadamardParams{.x = x, .rows = rows, .dim = dim});
  // CUDA-only limits: a row lives in one block's shared memory; one block per row.
  CHECK(dim <= kMaxHadamardDim, "hadamard_rotate: dim ", dim, " above ", kMaxHadamardDim);
  CHECK(rows < (int64_t{1} << 31), "hadamard_rotate: rows ", rows);
  if (rows == 0) return;
  const float norm = 1.0f / std::sqrt(static_cast<float>(dim));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, dim / 2)));
  hadamard_kernel<<<static_cast<unsigned>(rows), threads, dim * sizeof(float), stream>>>(x, dim,
                                                                                         norm);
  CUDA_CHECK_LAUNCH();
}

void quantize_fp8_ue8m0(const float* x, int64_t rows, int64_t dim, uint8_t* q, float* scales,
                        cudaStream_t stream) {
  validate(QuantizeFp8Ue8m0Params{.x = x, .rows = rows, .dim = dim, .q = q, .scales = scales});
  if (rows == 0) return;
  const int64_t num_warps = rows * ((dim + kIndexerFp8BlockSize - 1) / kIndexerFp8BlockSize);
  constexpr int kThreads = 256;
  const int64_t num_blocks = (num_warps * 32 + kThreads - 1) / kThreads;
  // CUDA-only limit: the grid's x dimension.
  CHECK(num_blocks < (int64_t{1} << 31), "quantize_fp8_ue8m0: too many rows (", rows, ")");
  quantize_kernel<<<static_cast<unsigned>(num_blocks), kThreads, 0, stream>>>(x, rows, dim, q,
                                                                              scales);
  CUDA_CHECK_LAUNCH();
}

void indexer_scores(const IndexerScoreParams& p, cudaStream_t stream) {
  validate(p);
  check_grid_limits("indexer_scores", p.num_tokens, p.num_keys);
  if (p.num_tokens == 0 || p.num_keys == 0) return;
  const ScoreArgs a{.q = p.q,
                    .k = p.k,
                    .k_fp8 = nullptr,
                    .k_scales = nullptr,
                    .k_pages = p.k_pages,
                    .table_stride = p.table_stride,
                    .head_weights = p.head_weights,
                    .q_pos = p.q_pos,
                    .scores = p.scores,
                    .num_keys = p.num_keys,
                    .num_heads = static_cast<int>(p.num_heads),
                    .head_dim = static_cast<int>(p.head_dim)};
  if (p.fp8) {
    launch_scores<KeyMode::kF32Quantized>(a, p.num_tokens, stream);
  } else {
    launch_scores<KeyMode::kF32>(a, p.num_tokens, stream);
  }
}

void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p, cudaStream_t stream,
                              IndexerScorer scorer) {
  validate(p);
  check_grid_limits("indexer_scores_fp8_cache", p.num_tokens, p.num_keys);
  if (p.num_tokens == 0 || p.num_keys == 0) return;
  if (indexer::mma_scorer_supports(p)) {
    static const bool env_wgmma = [] {
      const char* env = std::getenv("HYSERVE_INDEXER_WGMMA");
      return env != nullptr && std::string_view(env) == "1";
    }();
    if (scorer == IndexerScorer::kWgmma || (scorer == IndexerScorer::kAuto && env_wgmma)) {
      indexer::indexer_scores_fp8_cache_wgmma(p, stream);
    } else {
      indexer::indexer_scores_fp8_cache_mma(p, stream);
    }
    return;
  }
  const ScoreArgs a{.q = p.q,
                    .k = nullptr,
                    .k_fp8 = p.k_fp8,
                    .k_scales = p.k_scales,
                    .k_pages = p.k_pages,
                    .table_stride = p.table_stride,
                    .head_weights = p.head_weights,
                    .q_pos = p.q_pos,
                    .scores = p.scores,
                    .num_keys = p.num_keys,
                    .num_heads = static_cast<int>(p.num_heads),
                    .head_dim = static_cast<int>(p.head_dim)};
  launch_scores<KeyMode::kFp8Cache>(a, p.num_tokens, stream);
}

}  // namespace hyserve::cuda
