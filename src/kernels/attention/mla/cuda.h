// CUDA MLA attention over the latent cache (params.h), in the absorbed form, for decode
// and prefill alike (any T, S; dense causal or top-k). Pointers in the Params are DEVICE
// pointers, and so are kv_b->data / kv_b->scales (the Weight struct itself is read on
// the host). kv_b is read in its stored format (dense F32/F16/BF16, FP8 block, MXFP4, INT4)
// and dequantized inside the kernels; no absorbed copy is prepared.
//
//   1. q_abs[t,h] = [ q_nope W_UK (kv_lora) | q_pe (dr) ]                  (workspace)
//   2. split-KV: block (t, h, split) runs an online softmax over its slice of the
//      query's keys (positions 0..q_pos, or the listed top-k slots) and writes the
//      unnormalized partial o_lat with its running max and sum              (workspace)
//   3. combine the splits by their maxima -> o_lat, lse; out = W_UV o_lat.
// A query with no key gets out = 0 and lse = -inf (every split empty).
//
// The top-k list is trusted (it comes from causal_topk): entries < 0, >= num_keys or
// > q_pos[t] are skipped, not reported; duplicates are not detected (the CPU op checks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/attention/mla/params.h"
#include "kernels/linear/cuda.h"

namespace hyserve::cuda {

// Dense prefill on tensor cores (issue 47, first step; opt-in until measured on a GPU):
// when the caller passes a cuBLAS handle, a dense call (no top-k, one block table) of at
// least kMlaGemmMinTokens queries outside batch-invariant mode runs step 2 as bf16 GEMMs
// with fp32 accumulation, per chunk of kMlaGemmKeyChunk keys and kMlaGemmRowChunk (t, h)
// rows, the online softmax between the two GEMMs: scores = q_abs lat^T, o_lat += P lat.
// q_abs, the latent rows and the probabilities are rounded to bf16 (the GEMMs' inputs):
// ~2^-8 relative per term, against the fp32 kernels' exact sums.
inline constexpr int64_t kMlaGemmMinTokens = 64;
inline constexpr int64_t kMlaGemmKeyChunk = 4096;
inline constexpr int64_t kMlaGemmRowChunk = 4096;

// Bytes of workspace mla_attention_absorbed needs for these sizes: a function of T, H,
// kv_lora and dr only (not of the context), so one sized at warm-up serves every step of
// at most T tokens. gemm_prefill: with the dense-prefill GEMMs' buffers (a fixed chunk).
size_t mla_attention_workspace_bytes(const MlaAttentionParams& p, bool gemm_prefill = false);

// Per head: q_lat = q_nope W_UK; logit = (q_lat.c + q_pe.k_pe) * scale;
// o_lat = softmax(logit) @ c; o = W_UV o_lat. workspace: 256-byte aligned, at least
// mla_attention_workspace_bytes(p) bytes.
// batch_invariant: one split per query, so that a query's output bits do not depend on
// T or on the number of keys of the call (slower when T * H is small: fewer blocks).
// blas: the dense-prefill GEMMs' handle (on `stream`); null: the fp32 kernels always.
void mla_attention_absorbed(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, bool batch_invariant = false,
                            const Blas* blas = nullptr);

}  // namespace hyserve::cuda
