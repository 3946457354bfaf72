// The prefill scorers on tensor cores (indexer_scores_mma.cu on mma.sync, indexer_scores_wgmma.cu
// on FP8 warpgroup MMAs), behind cuda.h's indexer_scores_fp8_cache: they take the calls
// mma_scorer_supports accepts (one block table for all queries, head_dim 128, 16 / 32 / 64
// heads, 16-byte aligned q and key rows); the others go to the CUDA-core kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/indexer/params.h"

namespace hyserve::cuda::indexer {

bool mma_scorer_supports(const IndexerFp8CacheScoreParams& p);

// Requires mma_scorer_supports(p) and p's pointers checked by the caller.
void indexer_scores_fp8_cache_mma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream);
// The same calls on Hopper's FP8 warpgroup MMAs (indexer_scores_wgmma.cu).
void indexer_scores_fp8_cache_wgmma(const IndexerFp8CacheScoreParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda::indexer
