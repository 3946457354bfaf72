// CUDA versions of the DSA lightning indexer ops (params.h, cpu.h): same Params, DEVICE
// pointers, launched on a stream. None allocates; none needs a workspace.
//
// What matches the CPU op exactly (bitwise): hadamard_rotate, quantize_fp8_ue8m0 (same
// butterfly order, same rounding), causal_topk (exact radix select on the score bits,
// ties to the lower position, -0 == +0). The CUDA-core scores differ from the CPU's only
// by fp32 summation order (products of decoded FP8 values are exact; their sums are
// not); the tensor-core scorer's by the tensor cores' accumulation, ~2^-10 of
// k_scale * sum_h |w'_h| * sum_d |q8 k8| at most.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/indexer/params.h"

namespace hyserve::cuda {

// Each row x <- H x / sqrt(dim) in place, dim a power of two <= 8192.
void hadamard_rotate(float* x /* [rows, dim] */, int64_t rows, int64_t dim, cudaStream_t stream);

// Per block of 128 values of a row: s = 2^ceil(log2(max(amax, 1e-4) / 448)),
// q = e4m3(clamp(x / s, -448, 448)); bitwise equal to cpu::quantize_fp8_ue8m0.
void quantize_fp8_ue8m0(const float* x /* [rows, dim] */, int64_t rows, int64_t dim,
                        uint8_t* q /* [rows, dim] e4m3 */,
                        float* scales /* [rows, ceil(dim / 128)] */, cudaStream_t stream);

// scores [T, S]: visible keys scored, the rest -inf. With p.fp8, q is quantized per head
// and k per key inside the kernel (no workspace), as the CPU op does. The FP8-cache
// scorer runs on tensor cores when every query shares one block table (prefill),
// head_dim is 128, Hi is 16, 32 or 64 and q and the key rows are 16-byte aligned
// (cuda/indexer_scores_mma.h); on CUDA cores otherwise.
void indexer_scores(const IndexerScoreParams& p, cudaStream_t stream);
// The tensor-core scorer a call takes: kAuto is the mma.sync one unless
// HYSERVE_INDEXER_WGMMA=1 (read once per process) picks the FP8 warpgroup one, the default
// once its GPU tests and benchmark have run (docs/DECISIONS.md, "Indexer logits on FP8
// warpgroup MMAs"); tests and benchmarks name one.
enum class IndexerScorer { kAuto, kMmaSync, kWgmma };
void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p, cudaStream_t stream,
                              IndexerScorer scorer = IndexerScorer::kAuto);

// Per query t: the min(topk, q_pos[t] + 1) highest-scoring keys among s <= q_pos[t]
// (s < S), ties to the lower position; sorted ascending, padded with -1. One block per
// query, a typical row read twice (cuda/causal_topk.cu); no workspace for any S
// (S < 2^31). Equal to cpu::causal_topk for NaN-free rows
// (the CPU op throws on a visible NaN; here a NaN orders above +inf or below -inf by its
// sign bit and is not reported).
void causal_topk(const float* scores /* [T, S] */, const int64_t* q_pos /* [T] */, int64_t T,
                 int64_t S, int64_t topk, int32_t* out /* [T, topk] */, cudaStream_t stream);

// The backend ops (backend/ops.h) over their Params.
inline void hadamard_rotate(const HadamardParams& p, cudaStream_t stream) {
  hadamard_rotate(p.x, p.rows, p.dim, stream);
}
inline void quantize_fp8_ue8m0(const QuantizeFp8Ue8m0Params& p, cudaStream_t stream) {
  quantize_fp8_ue8m0(p.x, p.rows, p.dim, p.q, p.scales, stream);
}
inline void causal_topk(const CausalTopkParams& p, cudaStream_t stream) {
  causal_topk(p.scores, p.q_pos, p.num_queries, p.num_keys, p.topk, p.out, stream);
}

}  // namespace hyserve::cuda
