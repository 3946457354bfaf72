// Ops around the FP8 MLA latent cache (MODEL.md §2, §6; the packed layout and the sparse
// MLA kernel are kernels/attention/dsa/params.h): quantizing the new latents to e4m3 (or rounding
// them to bf16 for the bf16 cache), the absorbed
// form's two per-head products with kv_b_proj (q_lat = q_nope W_UK before the sparse MLA
// kernel, out = W_UV o_lat after it), and turning a top-k list of positions into the
// physical slots that kernel reads.
//
//   kv_b rows of head h: [h*(dn+dv), h*(dn+dv)+dn) = W_UK [dn, kv_lora], the next dv
//   rows = W_UV [dv, kv_lora] (kernels/attention/mla/params.h)
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace hyserve {

// codes[i] = e4m3(x[i] * inv_scale): round to nearest even on the e4m3 grid, saturating
// at +-448 (core/dtype.h f32_to_e4m3; NaN -> 0x7f).
struct QuantizeE4m3Params {
  const float* x = nullptr;  // [n]
  int64_t n = 0;             // >= 0
  float inv_scale = 1.0f;    // 1 / latent scale
  uint8_t* codes = nullptr;  // [n] out
};

// out[i] = the bf16 bits of x[i], rounded to nearest even (NaN stays a quiet NaN), as
// core/dtype.h f32_to_bf16: the bf16 latent cache's rows.
struct RoundBf16Params {
  const float* x = nullptr;  // [n]
  int64_t n = 0;             // >= 0
  uint16_t* out = nullptr;   // [n] out
};

// q_lat[t, h] = q_nope[t, h] W_UK_h (kv_lora wide), q_pe[t, h] copied out of q.
struct MlaAbsorbParams {
  const float* q = nullptr;      // [T, H, dn + dr]
  const Weight* kv_b = nullptr;  // [H*(dn+dv), kv_lora] kv_b_proj, any Weight format
  float* q_lat = nullptr;        // [T, H, kv_lora] out
  float* q_pe = nullptr;         // [T, H, dr] out
  int64_t num_tokens = 0;        // T >= 0
  int64_t num_heads = 0;         // H
  int64_t dn = 0;                // qk_nope_head_dim
  int64_t dr = 0;                // qk_rope_head_dim
  int64_t dv = 0;                // v_head_dim
  int64_t kv_lora = 0;           // kv_lora_rank
};

// out[t, h] = W_UV_h o_lat[t, h] (dv wide).
struct MlaProjectParams {
  const float* o_lat = nullptr;  // [T, H, kv_lora]
  const Weight* kv_b = nullptr;  // [H*(dn+dv), kv_lora]
  float* out = nullptr;          // [T, H, dv] out
  int64_t num_tokens = 0;        // T >= 0
  int64_t num_heads = 0;         // H
  int64_t dn = 0;
  int64_t dv = 0;
  int64_t kv_lora = 0;
};

// Query t as one sparse-MLA request (DsaBatch with n_q = 1): its selected positions
// turned into physical slots through its block table, and its key count.
//   slots[t, j]  = block_table_t[p / block_size] * block_size + p % block_size, p =
//                  positions[t, j]; -1 stays -1
//   seq_lens[t]  = q_pos[t] + 1
struct DsaQuerySlotsParams {
  const int32_t* positions = nullptr;    // [T, topk] key positions, -1 = empty
  const int64_t* q_pos = nullptr;        // [T] position of each query
  const int32_t* block_table = nullptr;  // block ids; query t reads block_table + t * table_stride
  int64_t table_stride = 0;              // 0: one table for every query
  int64_t block_size = 0;                // tokens per block
  int64_t num_tokens = 0;                // T >= 0
  int64_t topk = 0;                      // entries per query
  int32_t* slots = nullptr;              // [T, topk] out
  int32_t* seq_lens = nullptr;           // [T] out
};

}  // namespace hyserve
