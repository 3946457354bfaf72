// validate(Params) of MLA attention (params.h): what both the CPU forms (cpu.cpp) and the
// CUDA launcher (cuda/mla_absorbed.cu) require, checked on the host before either runs.
// Reads no pointed-to data: the top-k list's entries (in range, visible, no duplicates)
// are checked by the CPU op only, which reads them on the host; the CUDA kernels skip bad
// entries (cuda.h). The launcher adds only its workspace, grid and shared-memory limits.
#pragma once

#include <cmath>

#include "kernels/attention/mla/params.h"
#include "util/error.h"

namespace hyserve {

inline void validate(const MlaAttentionParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_keys >= 0, "mla_attention: num_tokens ", p.num_tokens,
        ", num_keys ", p.num_keys);
  CHECK(p.num_heads > 0 && p.dn > 0 && p.dr >= 0 && p.dv > 0 && p.kv_lora > 0,
        "mla_attention: bad MLA sizes: num_heads ", p.num_heads, ", dn ", p.dn, ", dr ", p.dr,
        ", dv ", p.dv, ", kv_lora ", p.kv_lora);
  CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f, "mla_attention: softmax_scale ",
        p.softmax_scale);
  CHECK(p.table_stride >= 0, "mla_attention: table_stride ", p.table_stride);
  CHECK(p.kv_b != nullptr && !p.kv_b->empty(), "mla_attention: kv_b is null");
  CHECK(p.kv_b->rows == p.num_heads * (p.dn + p.dv) && p.kv_b->cols == p.kv_lora,
        "mla_attention: kv_b is [", p.kv_b->rows, ", ", p.kv_b->cols, "], expected [",
        p.num_heads * (p.dn + p.dv), ", ", p.kv_lora, "]");
  try {
    p.kv_b->check_layout();
  } catch (const Error& e) {
    HYSERVE_THROW(InvalidArgument, "mla_attention: kv_b: ", e.what());
  }
  if (p.num_tokens > 0) {
    CHECK(p.q != nullptr && p.q_pos != nullptr && p.out != nullptr,
          "mla_attention: null q, q_pos or out");
  }
  if (p.num_keys > 0) {
    CHECK((p.latent != nullptr) != (p.latent_bf16 != nullptr),
          "mla_attention: exactly one of latent and latent_bf16 must be set");
  }
  if (p.topk != nullptr) CHECK(p.topk_width > 0, "mla_attention: topk_width ", p.topk_width);
  CHECK(p.lora_slots == nullptr || !p.kv_b_lora.empty(),
        "mla_attention: LoRA slots without kv_b's adapter table");
  CHECK(p.kv_b_lora_row0 >= 0, "mla_attention: kv_b_lora_row0 ", p.kv_b_lora_row0);
}

// The backend op: the expanded form reads one block table for every query.
inline void validate(const MlaAttentionOpParams& p) {
  validate(p.attn);
  CHECK(p.absorbed || p.attn.table_stride == 0,
        "mla_attention: the expanded MLA form reads one block table (table_stride ",
        p.attn.table_stride, ")");
  CHECK(p.absorbed || p.attn.lora_slots == nullptr,
        "mla_attention: kv_b's LoRA adapters in low-rank form need the absorbed form");
}

}  // namespace hyserve
