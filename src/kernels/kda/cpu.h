// CPU reference of the KDA ops (MODEL.md §4), in fp32. The layer runs them in order:
//   short_conv_silu (q, k, v) -> l2norm_rows (q scaled by K^-0.5, k) -> kda_gate,
//   beta = sigmoid(b_proj(x)) -> kda_chunked (prefill) or kda_recurrent (decode)
//   -> gated_rms_norm -> o_proj.
// kda_chunked and kda_recurrent compute the same function; either may continue the
// state the other left.
#pragma once

#include <cstdint>

#include "kernels/kda/params.h"

namespace hyserve::cpu {

void short_conv_silu(const ShortConvParams& p);

void kda_gate(const KdaGateParams& p);

// Each row of x [rows, dim] becomes x / sqrt(sum x^2 + 1e-6) * scale, in place.
void l2norm_rows(float* x, int64_t rows, int64_t dim, float scale);
inline void l2norm_rows(const L2NormRowsParams& p) {
  l2norm_rows(p.x, p.rows, p.dim, p.scale);
}

// Token by token (decode; also the definition the chunked form must match).
void kda_recurrent(const KdaParams& p);

// Chunked (WY) form for prefill, chunks of chunk_size tokens (the last may be shorter).
void kda_chunked(const KdaParams& p, int64_t chunk_size = kKdaChunkSize);

void gated_rms_norm(const GatedRmsNormParams& p);

// The fused decode (params.h): per request and head the ops above in the layer's order,
// token by token, so its bits equal running them one after the other.
void kda_decode(const KdaDecodeParams& p);

}  // namespace hyserve::cpu
