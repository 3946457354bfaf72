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

// Dense prefill on tensor cores, absorbed (issue 47, first step; the calls with kv_b adapters,
// which the flash path below does not take): when the caller passes a cuBLAS handle, a dense call
// (no top-k, one block table) of at least kMlaGemmMinTokens queries outside batch-invariant mode
// runs step 2 as bf16 GEMMs with fp32 accumulation, per chunk of kMlaGemmKeyChunk keys and
// kMlaGemmRowChunk (t, h) rows, the online softmax between the two GEMMs: scores = q_abs lat^T,
// o_lat += P lat. q_abs, the latent rows and the probabilities are rounded to bf16 (the GEMMs'
// inputs): ~2^-8 relative per term, against the fp32 kernels' exact sums.
inline constexpr int64_t kMlaGemmMinTokens = 64;
inline constexpr int64_t kMlaGemmKeyChunk = 4096;
inline constexpr int64_t kMlaGemmRowChunk = 4096;

// Dense prefill in the expanded form, flash-style on tensor cores (cuda/mla_flash_prefill.cu;
// issue 47 item 1): K = c W_UK^T and V = c W_UV^T per head on cuBLAS (bf16), then S = Q K^T,
// the causal online softmax and O += P V on mma.sync, fp32 accumulate, per chunk of keys.
// 3.4x fewer FLOPs per (query, key, head) than the absorbed form at K3's sizes. q, the latent,
// kv_b and the probabilities are rounded to bf16 (~2^-9 relative per term).
// mla_attention_absorbed takes it, when given a cuBLAS handle, for the dense-prefill calls
// it supports: no top-k, one block table (table_stride 0), no kv_b adapter, dn + dr <= 192,
// dv <= 128; the GEMM path below serves the rest.
bool mla_flash_prefill_supports(const MlaAttentionParams& p);
// The flash kernel: mma.sync (sm_80's warp MMAs; every head size) or Hopper's warpgroup MMAs
// (mla_flash_wgmma.cu: the 192/128 heads, blocks of 128 queries). kAuto takes the mma.sync one
// unless HYSERVE_MLA_FLASH_WGMMA=1 (read once per process): the warpgroup kernel is the default
// once its GPU tests and benchmark have run (docs/DECISIONS.md, "Dense MLA prefill").
enum class MlaFlashKernel { kAuto, kMmaSync, kWgmma };
// Knobs for tests and benchmarks; the defaults are what the model runs.
struct MlaFlashOptions {
  int64_t max_chunk_keys = 0;  // > 0: caps the chunk of keys (rounded down to 64)
  int block_rows = 0;  // queries per block: 64 or 128 (192/128 heads only); 0: 128 (64 for 64/64)
  MlaFlashKernel kernel = MlaFlashKernel::kAuto;  // kWgmma: block_rows 0 or 128, 192/128 heads
};
// A function of T, H and the head sizes only (a fixed chunk of keys), 0 when unsupported.
size_t mla_flash_prefill_workspace_bytes(const MlaAttentionParams& p,
                                         const MlaFlashOptions& options = {});
// Any T >= 0 (the caller picks when it pays); out [T, H, dv] and lse as the other forms give
// them (a query that sees no key: out 0, lse -inf). Honours q_pos_first's hint.
void mla_flash_prefill(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                       const Blas& blas, cudaStream_t stream, const MlaFlashOptions& options = {});

// Sparse (top-k) calls over the bf16 latent at kv_lora 512, dr 64 (K3, DeepSeek-V3.2) may run
// step 2 on Hopper's warpgroup MMAs (cuda/mla_sparse_wgmma.cu; issue 47 item 4): a block per
// (query, group of 64 heads), every listed key of the query in one split, bf16 q_abs, latent and
// probabilities (~2^-9 relative per term, fp32 sums). kAuto takes it when
// HYSERVE_MLA_SPARSE_WGMMA=1 (read once per process; the default once its GPU tests and benchmark
// have run) for calls of at least kMlaSparseWgmmaMinBlocks blocks outside batch-invariant mode;
// kWgmma for every call it supports (its result per query does not depend on the batch either);
// kFp32 never.
enum class MlaSparseKernel { kAuto, kFp32, kWgmma };
inline constexpr int64_t kMlaSparseWgmmaMinBlocks = 128;
bool mla_sparse_wgmma_supports(const MlaAttentionParams& p);

// Bytes of workspace mla_attention_absorbed needs for these sizes: a function of T, H,
// kv_lora and dr only (not of the context), so one sized at warm-up serves every step of
// at most T tokens. gemm_prefill: with the dense-prefill GEMMs' buffers (a fixed chunk).
size_t mla_attention_workspace_bytes(const MlaAttentionParams& p, bool gemm_prefill = false);

// Bytes of workspace this one call of mla_attention_absorbed uses (with a cuBLAS handle when
// gemm_prefill): the flash plan alone for the calls the flash path takes, else the absorbed
// kernels' plan (and the GEMM path's buffers when it runs). Smaller than the any-call bound
// above for dense prefill (the flash path needs no q_abs or partials: ~1.1 GB less at 8K
// tokens x 32 heads); a caller sizing its workspace by it must reserve the other call shapes
// it will make (Model::reserve_decode_scratch does: decode batches, kv_b adapters).
size_t mla_attention_call_workspace_bytes(const MlaAttentionParams& p, bool gemm_prefill,
                                          bool batch_invariant);

// Per head: q_lat = q_nope W_UK; logit = (q_lat.c + q_pe.k_pe) * scale;
// o_lat = softmax(logit) @ c; o = W_UV o_lat. workspace: 256-byte aligned, at least
// mla_attention_workspace_bytes(p) bytes.
// batch_invariant: one split per query, so that a query's output bits do not depend on
// T or on the number of keys of the call (slower when T * H is small: fewer blocks).
// blas: the dense-prefill GEMMs' handle (on `stream`); null: the fp32 kernels always.
// sparse: the top-k kernel (MlaSparseKernel above).
void mla_attention_absorbed(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, bool batch_invariant = false,
                            const Blas* blas = nullptr,
                            MlaSparseKernel sparse = MlaSparseKernel::kAuto);

}  // namespace hyserve::cuda
