// Parameters of the DSA lightning indexer's scoring (MODEL.md §3): per query token t
// and key token s,
//   I[t,s] = sum_h w[t,h] * relu(q[t,h] . k[s])                              (fp32)
//   I[t,s] = k_scale[s] * sum_h (w[t,h] * q_scale[t,h]) * relu(q8[t,h] . k8[s])  (fp8)
// where q8/k8 are e4m3 codes (decoded to fp32 for the dot product) with one power-of-two
// scale per query head and per key token. Keys s > q_pos[t] score -inf.
//
// The caller prepares q and k: RoPE (deepseek_v32), and, on the FP8 path, the Hadamard
// rotation (cpu.h hadamard_rotate) of both before scoring or caching keys. The scorer
// rotates nothing.
#pragma once

#include <cstdint>

#include "core/paged.h"

namespace hyserve {

// Block of the ue8m0 FP8 activation quantization; also the largest head_dim the FP8
// scorer takes (one scale per query head and per key token).
constexpr int64_t kIndexerFp8BlockSize = 128;
// Largest finite e4m3 magnitude.
constexpr float kE4m3Max = 448.0f;

// Scores against fp32 keys; with fp8 the scorer quantizes q per head and k per token.
struct IndexerScoreParams {
  const float* q = nullptr;             // [T, Hi, d]
  const float* k = nullptr;             // [S, d], or the page of block 0 when paged
  PagedRows k_pages{};                  // block table of the key pages; default: contiguous
  int64_t table_stride = 0;             // > 0: query t reads k_pages.block_table + t * table_stride
  const float* head_weights = nullptr;  // [T, Hi] weights_proj(x) * Hi^-0.5 * d^-0.5
  const int64_t* q_pos = nullptr;       // [T] key s is visible iff s <= q_pos[t]
  float* scores = nullptr;              // [T, S] out
  int64_t num_tokens = 0;               // T >= 0
  int64_t num_keys = 0;                 // S >= 0
  int64_t num_heads = 0;                // Hi
  int64_t head_dim = 0;                 // d (<= 128 when fp8)
  bool fp8 = false;
};

// Scores against an FP8 index-key cache (keys stored quantized, MODEL.md §6); q is
// quantized per head here. Same result as IndexerScoreParams with fp8 = true when the
// cache holds quantize_fp8_ue8m0 of those keys.
struct IndexerFp8CacheScoreParams {
  const float* q = nullptr;             // [T, Hi, d]
  const uint8_t* k_fp8 = nullptr;       // [S, d] e4m3 codes (page of block 0 when paged)
  const float* k_scales = nullptr;      // [S] power-of-two scale per key (same)
  PagedRows k_pages{};                  // one block table for codes and scales; default: contiguous
  int64_t table_stride = 0;             // > 0: query t reads k_pages.block_table + t * table_stride
  const float* head_weights = nullptr;  // [T, Hi] weights_proj(x) * Hi^-0.5 * d^-0.5
  const int64_t* q_pos = nullptr;       // [T] key s is visible iff s <= q_pos[t]
  float* scores = nullptr;              // [T, S] out
  int64_t num_tokens = 0;               // T >= 0
  int64_t num_keys = 0;                 // S >= 0
  int64_t num_heads = 0;                // Hi
  int64_t head_dim = 0;                 // d <= 128
};

// In-place Hadamard rotation of each row (cpu.h hadamard_rotate).
struct HadamardParams {
  float* x = nullptr;  // [rows, dim]
  int64_t rows = 0;    // >= 0
  int64_t dim = 0;     // a power of two
};

// ue8m0 FP8 quantization of each row, one power-of-two scale per block of 128 values (cpu.h
// quantize_fp8_ue8m0).
struct QuantizeFp8Ue8m0Params {
  const float* x = nullptr;  // [rows, dim]
  int64_t rows = 0;          // >= 0
  int64_t dim = 0;           // > 0
  uint8_t* q = nullptr;      // [rows, dim] e4m3 codes, out
  float* scales = nullptr;   // [rows, ceil(dim / 128)] out
};

// Per query the top-k keys among the causally visible ones (cpu.h causal_topk).
struct CausalTopkParams {
  const float* scores = nullptr;   // [T, S]
  const int64_t* q_pos = nullptr;  // [T] key s is visible iff s <= q_pos[t]
  int64_t num_queries = 0;         // T >= 0
  int64_t num_keys = 0;            // S >= 0
  int64_t topk = 0;                // slots per query
  int32_t* out = nullptr;          // [T, topk] ascending positions, padded with -1
};

}  // namespace hyserve
