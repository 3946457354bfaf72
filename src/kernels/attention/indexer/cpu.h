// CPU reference of the DSA lightning indexer (params.h): Hadamard rotation, ue8m0 FP8
// quantization, scoring, and the causal top-k selection MLA then attends over.
#pragma once

#include <cstdint>

#include "kernels/attention/indexer/params.h"

namespace hyserve::cpu {

// Each row x <- H x / sqrt(dim), H the Sylvester Hadamard matrix (H_1 = [1],
// H_2n = [[H_n, H_n], [H_n, -H_n]]); orthonormal and symmetric. dim a power of two.
void hadamard_rotate(float* x /* [rows, dim] */, int64_t rows, int64_t dim);

// Per block of 128 values of a row (the whole row when dim < 128; the last block may
// be short): s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(clamp(x / s, -448, 448)).
void quantize_fp8_ue8m0(const float* x /* [rows, dim] */, int64_t rows, int64_t dim,
                        uint8_t* q /* [rows, dim] e4m3 */,
                        float* scales /* [rows, ceil(dim / 128)] */);

void indexer_scores(const IndexerScoreParams& p);
void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p);

// Per query t: the min(topk, q_pos[t] + 1) highest-scoring keys among s <= q_pos[t]
// (s < S), ties to the lower position; written sorted ascending, padded with -1.
void causal_topk(const float* scores /* [T, S] */, const int64_t* q_pos /* [T] */, int64_t T,
                 int64_t S, int64_t topk, int32_t* out /* [T, topk] */);

// The backend ops (backend/ops.h) over their Params.
inline void hadamard_rotate(const HadamardParams& p) {
  hadamard_rotate(p.x, p.rows, p.dim);
}
inline void quantize_fp8_ue8m0(const QuantizeFp8Ue8m0Params& p) {
  quantize_fp8_ue8m0(p.x, p.rows, p.dim, p.q, p.scales);
}
inline void causal_topk(const CausalTopkParams& p) {
  causal_topk(p.scores, p.q_pos, p.num_queries, p.num_keys, p.topk, p.out);
}

}  // namespace hyserve::cpu
