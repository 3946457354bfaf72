// DSA decode over the packed block cache (MODEL.md §2, §3, §6): the lightning indexer's
// FP8 scores, the exact top-k select, and sparse MLA decode in the absorbed form; plus
// dense MLA decode over the same cache as the baseline. One step of one full-attention
// layer for B requests with n_q query tokens each (n_q > 1: speculative verification).
//
// The packed pool (DESIGN.md "The packed hybrid block cache"), as one layer reads it:
//
//   pool ─┬─ row 0 ─────────────────────────────────────────────────────────────┐
//         │  ... | latent page @ latent_offset | ... | index page @ index_offset | ...
//         ├─ row 1   (row_bytes apart; row_bytes % 256 == 0; both offsets 256-B aligned)
//         └─ ...     (num_blocks rows)
//
//   latent page   [block_size, 576] e4m3: 512 codes of c, then 64 of k_pe;
//                 value = code * latent_scale (one fp32 scale per layer)
//   index page    [block_size, 128] e4m3 key codes (after the Hadamard rotation),
//                 then [block_size] fp32 key scales (power of two):
//                   codes  @ index_offset + j * 128
//                   scale  @ index_offset + block_size * 128 + j * 4
//
// Position p of request b lives in block block_tables[b, p / block_size], slot
// j = p % block_size; its physical slot id is block * block_size + j (what the top-k
// emits and sparse MLA reads). Request b holds seq_lens[b] keys (the new tokens
// included); its query i (0 <= i < n_q) sits at position seq_lens[b] - n_q + i and sees
// keys 0..that position. Everything per request is read from device memory, so a step
// can be captured in a CUDA graph: grids depend on B, n_q, H and the host bound
// max_context >= every seq_lens[b] only.
#pragma once

#include <bit>
#include <cstdint>

#include "core/order_key.h"

#if defined(__CUDACC__)
#define HYSERVE_DSA_HOST_DEVICE __host__ __device__
#else
#define HYSERVE_DSA_HOST_DEVICE
#endif

namespace hyserve {

// Fixed dimensions of K3.1 Pro's MLA latent and indexer key.
constexpr int kDsaLoraDim = 512;                          // kv_lora_rank: c
constexpr int kDsaRopeDim = 64;                           // qk_rope_head_dim: k_pe
constexpr int kDsaLatentDim = kDsaLoraDim + kDsaRopeDim;  // 576 codes = bytes per token
constexpr int kDsaIndexDim = 128;                         // index_head_dim
constexpr int kDsaIndexKeyBytes = kDsaIndexDim + 4;       // codes + fp32 scale
// The largest index_topk the CUDA top-k takes (a row's candidate list, winners and the
// rest of the threshold's bucket, lives in its select block's shared memory);
// models with more keep the generic attention path.
constexpr int64_t kDsaMaxTopk = 8192;

// The top-k's order-preserving key of a score (core/order_key.h, the one tie rule). Its top
// 11 bits are the bins of the top-k's first radix pass.
constexpr int kDsaTopkBins = 2048;
constexpr int kDsaTopkBinShift = 21;

// One full-attention layer's view of the packed pool.
struct DsaCache {
  const uint8_t* pool = nullptr;  // row 0 of the pool (256-byte aligned)
  int64_t row_bytes = 0;          // bytes per block row, a multiple of 256
  int64_t latent_offset = 0;      // this layer's latent page inside a row (256-aligned)
  int64_t index_offset = 0;       // this layer's index page inside a row (256-aligned)
  int64_t num_blocks = 0;         // rows in the pool (for checks)
  int32_t block_size = 0;         // tokens per block: a power of two, 32..2^20 (a row also
                                  // holds a request's KDA states, so hybrid models use large ones)
  float latent_scale = 1.0f;      // latent value = e4m3 code * latent_scale
};

// Byte addresses of one slot's latent, index-key codes and index-key scale.
HYSERVE_DSA_HOST_DEVICE inline const uint8_t* dsa_latent_row(const DsaCache& c, int64_t slot) {
  return c.pool + (slot / c.block_size) * c.row_bytes + c.latent_offset +
         (slot % c.block_size) * kDsaLatentDim;
}
HYSERVE_DSA_HOST_DEVICE inline const uint8_t* dsa_index_codes(const DsaCache& c, int64_t slot) {
  return c.pool + (slot / c.block_size) * c.row_bytes + c.index_offset +
         (slot % c.block_size) * kDsaIndexDim;
}
HYSERVE_DSA_HOST_DEVICE inline const float* dsa_index_scale(const DsaCache& c, int64_t slot) {
  return reinterpret_cast<const float*>(c.pool + (slot / c.block_size) * c.row_bytes +
                                        c.index_offset + int64_t{c.block_size} * kDsaIndexDim +
                                        (slot % c.block_size) * 4);
}

// The requests of one step.
struct DsaBatch {
  const int32_t* block_tables = nullptr;  // [B, max_blocks] block ids
  const int32_t* seq_lens = nullptr;      // [B] keys of each request, new tokens included
  int64_t num_requests = 0;               // B >= 0
  int64_t max_blocks = 0;                 // columns of block_tables
  int64_t num_q = 1;                      // n_q in 1..8, query tokens per request
  int64_t max_context = 0;                // host bound: every seq_lens[b] <= max_context
};

// Physical slot of position pos of request b (block_tables in the caller's memory).
// block_size is a power of two (as in DsaCache): a shift and a mask, not two 64-bit
// divisions (on the GPU those took ~11K cycles of a one-row top-k select's writes).
HYSERVE_DSA_HOST_DEVICE inline int64_t dsa_slot(const DsaBatch& batch, int32_t block_size,
                                                int64_t b, int64_t pos) {
#ifdef __CUDA_ARCH__
  const int shift = __ffs(block_size) - 1;
#else
  const int shift = std::countr_zero(static_cast<uint32_t>(block_size));
#endif
  return int64_t{batch.block_tables[b * batch.max_blocks + (pos >> shift)]} * block_size +
         (pos & (block_size - 1));
}

// Indexer scores (MODEL.md §3.6), for query i of request b and key position p:
//   score[b, i, p] = k_scale[p] * sum_h w[b, i, h] * relu(q8[b, i, h] . k8[p])
// q8 are the query's e4m3 codes (rotated and quantized per head by the caller) and w the
// head weight with the query's power-of-two scale folded in (weights_proj * Hi^-0.5 *
// 128^-0.5 * q_scale). Keys p > position of query i score -inf; p >= seq_lens[b] are
// not written.
struct DsaIndexerParams {
  DsaCache cache;
  DsaBatch batch;
  const uint8_t* q8 = nullptr;     // [B, n_q, Hi, 128] e4m3 codes
  const float* weights = nullptr;  // [B, n_q, Hi] head weights times q scale
  int64_t num_heads = 0;           // Hi: 16, 32 or 64 (a multiple of 16, <= 64)
  float* scores = nullptr;         // [B, n_q, score_stride] out
  int64_t score_stride = 0;        // >= max_context
  // Optional [B, n_q, kDsaTopkBins], zeroed by the caller: the count of each row's visible
  // scores (keys 0..position) by float_order_key >> kDsaTopkBinShift is added here, which is
  // the top-k's first radix pass done while the scores are in registers (DsaTopkParams).
  int* histogram = nullptr;
};

// Exact top-k per (b, i) over the scores of keys 0..position (ties: lower position
// wins, -0 == +0): the min(topk, position + 1) best, written in ascending position
// order, padded with -1.
struct DsaTopkParams {
  DsaBatch batch;
  int32_t block_size = 0;         // of the cache, to turn positions into slots
  const float* scores = nullptr;  // [B, n_q, score_stride]
  int64_t score_stride = 0;
  int64_t topk = 0;              // index_topk (2048)
  int32_t* slots = nullptr;      // [B, n_q, topk] out: physical slot ids, -1 = empty
  int32_t* positions = nullptr;  // [B, n_q, topk] out, optional: positions, -1 = empty
  // Optional [B, n_q, kDsaTopkBins]: the indexer's histogram of these very scores
  // (DsaIndexerParams::histogram); the top-k then skips its first pass over the scores.
  const int* histogram = nullptr;
};

// MLA decode in the absorbed form (MODEL.md §2.6) for query i of request b and head h:
//   logit_s = (q_lat . c_s + q_pe . k_pe_s) * softmax_scale        (c, k_pe dequantized)
//   o_lat   = sum_s softmax(logit)_s c_s,  lse = ln sum_s exp(logit_s)
// over the listed slots (sparse; -1 entries are empty) or over positions 0..position
// (dense). No key: o_lat = 0, lse = -inf. W_UV is applied by the caller.
// q is fp32 (q_lat = q_nope W_UK as the absorb GEMM leaves it); the CUDA kernel rounds
// it to fp16 with a power-of-two scale per row for the tensor cores.
struct DsaMlaParams {
  DsaCache cache;
  DsaBatch batch;
  const float* q_lat = nullptr;    // [B, n_q, H, 512]
  const float* q_pe = nullptr;     // [B, n_q, H, 64]
  const int32_t* slots = nullptr;  // [B, n_q, topk_width] (sparse); null: dense
  int64_t topk_width = 0;          // entries per query in slots
  int64_t num_heads = 0;           // H = num_attention_heads / tp, 1..128
  float softmax_scale = 0.0f;
  float* o_lat = nullptr;  // [B, n_q, H, 512] out
  float* lse = nullptr;    // [B, n_q, H] out
};

// The whole DSA step: indexer -> top-k -> sparse MLA.
struct DsaDecodeParams {
  DsaCache cache;
  DsaBatch batch;
  const uint8_t* index_q8 = nullptr;     // [B, n_q, Hi, 128]
  const float* index_weights = nullptr;  // [B, n_q, Hi]
  int64_t index_num_heads = 0;           // Hi
  int64_t topk = 0;                      // index_topk
  const float* q_lat = nullptr;          // [B, n_q, H, 512]
  const float* q_pe = nullptr;           // [B, n_q, H, 64]
  int64_t num_heads = 0;                 // H
  float softmax_scale = 0.0f;
  float* o_lat = nullptr;    // [B, n_q, H, 512] out
  float* lse = nullptr;      // [B, n_q, H] out
  int32_t* slots = nullptr;  // [B, n_q, topk] out, optional: the selection
};

}  // namespace hyserve
