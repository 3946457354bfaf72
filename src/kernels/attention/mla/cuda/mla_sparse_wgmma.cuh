// Sparse MLA (the DSA top-k) over the bf16 latent on Hopper's warpgroup MMAs: the attend step
// of mla_attention_absorbed (mla_absorbed.cu runs absorb_q before it and the combine and W_UV
// projection after it, one split per query), in mla_sparse_wgmma.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/paged.h"

namespace hyserve::cuda {

// The latent this kernel takes: kv_lora 512 + dr 64 (K3, DeepSeek-V3.2).
inline constexpr int kMlaSparseLora = 512;
inline constexpr int kMlaSparseWidth = 576;
// Heads per block (the wgmma's M); the last group of a call padded with zero rows.
inline constexpr int kMlaSparseHeads = 64;

struct MlaSparseWgmmaArgs {
  const float* q_abs;           // [T*H, 576]: [q_nope W_UK | q_pe] of each (query, head)
  const __nv_bfloat16* latent;  // page of block 0 (or [S, 576])
  PagedRows pages;              // the latent's pages
  int64_t table_stride;         // > 0: query t reads its own block table (params.h)
  const int32_t* topk;          // [T, topk_width] key positions, -1 = empty
  int64_t topk_width;
  const int64_t* q_pos;  // [T]
  int64_t num_tokens, num_keys, num_heads;
  float scale_log2;  // softmax_scale * log2(e)
  float* part_o;     // [T*H, 512]: the unnormalized o_lat (one split)
  float* part_ml;    // [T*H, 2]: running max (natural-log units) and sum, as the combine reads
};

// Grid (T * ceil(H / 64)) blocks, one SM each.
void launch_mla_sparse_wgmma(const MlaSparseWgmmaArgs& a, cudaStream_t stream);

}  // namespace hyserve::cuda
