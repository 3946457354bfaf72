// The arguments of one chunk's flash kernel (mla_flash_prefill.cu plans the chunks and
// expands K and V; the mma.sync kernel lives there, the warpgroup one in
// mla_flash_wgmma.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hyserve::cuda {

struct FlashArgs {
  const float* q;          // [T, H, q_width]
  const int64_t* q_pos;    // [T]
  const __nv_bfloat16* k;  // [H, chunk_keys, kDqk]
  const __nv_bfloat16* v;  // [H, chunk_keys, kDv]
  float* out;              // [T, H, dv]: the unnormalized O between chunks
  float* lse;              // [T, H] or null
  float* ml;               // [T, H, 2]: running max (log2 units) and sum between chunks
  int64_t num_tokens, num_heads, q_width, dv, chunk_keys;
  int64_t k0, kc;  // this chunk: keys [k0, k0 + kc)
  float scale_log2;
  bool first, last;
};

// The warpgroup kernel (Hopper wgmma): the 192/128 head sizes (q_width <= 192, dv <= 128),
// blocks of 128 queries of one head.
inline constexpr int kFlashWgmmaRows = 128;
void launch_flash_wgmma(const FlashArgs& a, cudaStream_t stream);

}  // namespace hyserve::cuda
