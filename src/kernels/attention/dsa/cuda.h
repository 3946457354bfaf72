// CUDA DSA decode over the packed block cache (params.h). Pointers in the Params are
// DEVICE pointers. Every launch reads per-request data (block tables, lengths) from device
// memory and sizes its grid from B, n_q, H and max_context only, so a step can be captured
// in a CUDA graph. Nothing allocates; the callers pass 256-byte aligned workspaces sized
// by the *_workspace_bytes functions. A seq_lens[b] above max_context breaks the contract;
// the kernels then clamp it to max_context rather than touch memory outside the buffers.
//
//   dsa_indexer_scores  scorer on the FP8 tensor cores (wgmma e4m3 x e4m3 -> f32, 64 keys
//                       as the A operand, a query's heads as B): a block takes a range of
//                       one request's keys and every query of that request, so each key is
//                       read once per step (whole sectors, through a cp.async ring per
//                       warpgroup); the keys of all requests are cut into enough ranges to
//                       fill every SM even at B = 1.
//   dsa_topk            exact select on the order-preserving score key (topk <= 8192) in
//                       separate launches, no grid barrier: a histogram of each row's 11-bit
//                       key prefixes (or the indexer's) gives the threshold's bin; one pass
//                       over the row collects the keys at or above it into a per-row list
//                       (a second 11-bit histogram narrows a crowded bin first, with one
//                       more pass), as one position-ordered run per 4096-slot tile; then
//                       one block per row puts the runs in tile order, selects the topk by
//                       key (ties: the lower position) and writes them in position order,
//                       with no sort. Rows of massive ties
//                       are selected from the row itself in position order. Equal to
//                       cpu::dsa_topk for NaN-free rows.
//   dsa_mla_decode      sparse (top-k slots) or dense (positions 0..pos) MLA decode over
//                       the FP8 latent: fp16 tensor cores (q rounded to fp16 with a
//                       power-of-two scale per row; latent codes are exact in fp16), split
//                       over the keys, then an LSE combine of the splits. From 48 heads
//                       on warpgroup MMAs in groups of 64 heads (the last one padded);
//                       fewer heads, and sparse batches of fewer than 8 (query, group)
//                       pairs, on mma.sync.
//   dsa_decode          the whole step: indexer -> top-k -> sparse MLA.
//
// Inside the top-k and the sparse MLA, kernels after the first are launched with
// programmatic dependent launch (dsa_common.cuh): their blocks may become resident while
// the previous grid finishes and wait for it before reading anything (graph capture keeps
// these as programmatic edges).
//
// Batch invariance: a query's scores and selection never depend on the other requests
// (each score is one fixed sequence of MMAs; the top-k is exact). The MLA's split plan
// does (it follows B, n_q and max_context), unless batch_invariant is set: then every
// query is one split, so its output bits do not depend on the batch (slower at small B
// and long dense contexts).
//
// Tolerances against the CPU reference: scores to the tensor cores' reduced-precision
// accumulation and fp32 summation order (the e4m3 products are exact); attention to the fp16
// rounding of q and of the probabilities
// (~2^-11 relative each) - see tests/gpu/dsa_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/attention/dsa/params.h"

namespace hyserve::cuda {

void dsa_indexer_scores(const DsaIndexerParams& p, cudaStream_t stream);
// Whether dsa_indexer_scores takes a histogram (DsaIndexerParams::histogram) at these
// sizes: its per-query bins must fit shared memory beside the queries.
bool dsa_indexer_takes_histogram(int64_t num_q, int64_t num_heads);
// Whether dsa_decode has the indexer build the top-k's histogram for this batch: where
// it takes one and either the step is small (<= 2M scores) or the histogram's shared
// memory costs the indexer no resident block per SM; else the top-k counts the bins in a
// pass of its own, which measured faster. Reads only the batch's sizes; queries the
// current device.
bool dsa_indexer_fuses_histogram(const DsaBatch& batch, int64_t num_heads);

size_t dsa_topk_workspace_bytes(const DsaTopkParams& p);
void dsa_topk(const DsaTopkParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

size_t dsa_mla_workspace_bytes(const DsaMlaParams& p);
// The workspace covers both plans (batch_invariant needs less).
void dsa_mla_decode(const DsaMlaParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, bool batch_invariant = false);
// Whether dsa_mla_decode runs these sizes on warpgroup MMAs: H >= 48 and, for sparse MLA,
// enough (query, 64-head group) pairs to fill the SMs; dense MLA and the batch-invariant
// mode decide by H alone, so there a query's kernel never depends on the batch.
bool dsa_mla_uses_wgmma(const DsaMlaParams& p, bool batch_invariant = false);

// Workspace of the whole step: scores [B*n_q, max_context] fp32, the top-k's histograms,
// the selected slots (when p.slots is null) and the MLA splits. Depends on B, n_q, Hi,
// H, topk and max_context only.
size_t dsa_decode_workspace_bytes(const DsaDecodeParams& p);
void dsa_decode(const DsaDecodeParams& p, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, bool batch_invariant = false);

}  // namespace hyserve::cuda
