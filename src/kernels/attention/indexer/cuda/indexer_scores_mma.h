// The prefill scorers on tensor cores (indexer_scores_mma.cu on mma.sync, indexer_scores_wgmma.cu
// on FP8 warpgroup MMAs), behind cuda.h's indexer_scores_fp8_cache: they take the calls
// mma_scorer_supports accepts (one block table for all queries, head_dim 128, 16 / 32 / 64
// heads, 16-byte aligned q and key rows); the others go to the CUDA-core kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/paged.h"
#include "kernels/attention/indexer/params.h"

namespace hyserve::cuda::indexer {

bool mma_scorer_supports(const IndexerFp8CacheScoreParams& p);

// What both scorers' kernels take: p's pointers and sizes, and the keys each CTA scores.
struct TensorScoreArgs {
  const float* q;             // [T, Hi, 128]
  const uint8_t* k_fp8;       // page of block 0 (or [S, 128])
  const float* k_scales;      // page of block 0 (or [S])
  PagedRows k_pages;          // one table for every query
  const float* head_weights;  // [T, Hi]
  const int64_t* q_pos;       // [T]
  float* scores;              // [T, S]
  int64_t num_tokens;
  int64_t num_keys;
  int64_t keys_per_cta;  // a multiple of the kernel's key step
};
TensorScoreArgs tensor_score_args(const IndexerFp8CacheScoreParams& p);

// Keys per CTA of a grid of num_query_tiles x key ranges on the current device: about 8 CTAs
// per SM over the grid, 256 to 4,096 keys (amortizing a CTA's query prologue; keeping the
// grid long enough for the CTAs resident together to share key tiles through L2), at most
// 65,535 ranges, a multiple of `step` keys.
int64_t plan_keys_per_cta(int64_t num_keys, int64_t num_query_tiles, int64_t step);

// f.template operator()<Hi>() for a supported head count (16, 32, 64).
template <class F>
void dispatch_index_heads(int64_t num_heads, F&& f) {
  switch (num_heads) {
    case 16:
      f.template operator()<16>();
      break;
    case 32:
      f.template operator()<32>();
      break;
    default:
      f.template operator()<64>();
      break;
  }
}

// Requires mma_scorer_supports(p) and p's pointers checked by the caller.
void indexer_scores_fp8_cache_mma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream);
// The same calls on Hopper's FP8 warpgroup MMAs (indexer_scores_wgmma.cu).
void indexer_scores_fp8_cache_wgmma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda::indexer
