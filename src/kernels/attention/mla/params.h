// Parameters of MLA attention over the latent cache (MODEL.md §2.5-2.6), dense causal
// or restricted to the DSA indexer's top-k keys (§3.7). One signature, two CPU forms
// (cpu.h): expanded (K, V built per head from the latent) and absorbed (kv_b folded
// into the query and the output). Both must agree.
//
//   latent row s:  [ c_s (kv_lora, normalized) | k_pe_s (dr, roped) ]
//   q row (t, h):  [ q_nope (dn)                | q_pe (dr, roped)   ]
//   kv_b rows of head h: [h*(dn+dv), h*(dn+dv)+dn) = W_UK, the next dv rows = W_UV
//
// Key s is visible to query t iff s <= q_pos[t] (and s < num_keys). With topk, query t
// attends exactly over the listed positions (softmax over that set); -1 slots are empty.
// A query with no key gets out = 0 and lse = -inf.
//
// Latent row s is read at latent_pages.row(latent, s, kv_lora + dr): contiguous [S, width]
// by default, or the pages of the packed block cache (core/paged.h); fp32 or bf16 values.
#pragma once

#include <cstdint>

#include "core/paged.h"
#include "core/weight.h"
#include "kernels/lora/params.h"

namespace hyserve {

struct MlaAttentionParams {
  const float* q = nullptr;       // [T, H, dn + dr]
  const float* latent = nullptr;  // [S, kv_lora + dr], or the page of block 0 when paged
  // A bf16 latent (--kv-cache-dtype bf16): the same rows as bf16 bits, read in place of
  // `latent` (exactly one of the two is set when num_keys > 0); every product and sum is
  // still fp32.
  const uint16_t* latent_bf16 = nullptr;
  PagedRows latent_pages{};  // block table of the latent pages; default: contiguous
  // Batched decode: query t reads its own block table, latent_pages.block_table +
  // t * table_stride (sequences of one query each; absorbed form). 0: one table for all.
  int64_t table_stride = 0;
  const Weight* kv_b = nullptr;    // [H*(dn+dv), kv_lora] kv_b_proj, any Weight format
  const int64_t* q_pos = nullptr;  // [T] position of each query
  // A host-side hint, -1 when unknown: q_pos[t] == q_pos_first + t for every t (a prefill chunk
  // of one sequence), so that a device kernel may skip keys no query sees. Never changes the
  // result; the CPU ops ignore it.
  int64_t q_pos_first = -1;
  const int32_t* topk = nullptr;  // [T, topk_width] key positions, -1 = empty; null = dense
  int64_t topk_width = 0;         // slots per query when topk is set
  float* out = nullptr;           // [T, H, dv]
  float* lse = nullptr;           // [T, H] ln sum exp of the scaled logits; may be null
  int64_t num_tokens = 0;         // T >= 0
  int64_t num_keys = 0;           // S >= 0
  int64_t num_heads = 0;          // H
  int64_t dn = 0;                 // qk_nope_head_dim
  int64_t dr = 0;                 // qk_rope_head_dim (present even when NoPE)
  int64_t dv = 0;                 // v_head_dim
  int64_t kv_lora = 0;            // kv_lora_rank
  float softmax_scale = 0.0f;     // (dn+dr)^-0.5, times mscale^2 with YaRN
  // LoRA adapters on kv_b (issue 48), applied in their low-rank form, absorbed form only: an
  // adapter (A [r, kv_lora], B [H*(dn+dv), r], scale s) makes W_UK' = W_UK + s B_UK A and
  // W_UV' = W_UV + s B_UV A, so query t of slot lora_slots[t] attends with
  //   q_abs += s (q_nope B_UK(h)) A        and   out += s B_UV(h) (A o_lat)
  // (B_UK(h), B_UV(h): B's rows of head h's W_UK, W_UV). Null lora_slots: none; a slot of -1,
  // or one without matrices in kv_b_lora: that query's kv_b is the base. (The CPU backend
  // attends with a merged copy W + s B A instead: model/lora_table.h.)
  const int32_t* lora_slots = nullptr;  // [T]
  LoraModule kv_b_lora{};
  // B's row of the call's kv_b row 0 (kv_b a view of some heads' rows of the adapted kv_b).
  int64_t kv_b_lora_row0 = 0;
};

// The backend's MLA op: the CPU computes the form asked for (cpu.h); the GPU runs the
// absorbed form always (the two agree).
struct MlaAttentionOpParams {
  MlaAttentionParams attn;
  bool absorbed = false;  // absorbed (kv_b folded into q and out), else expanded
};

}  // namespace hyserve
