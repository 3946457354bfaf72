// Host-side argument checks shared by the CPU and CUDA FP8-latent ops (params.h).
#pragma once

#include "kernels/attention/latent/params.h"
#include "util/error.h"

namespace hyserve {

inline void check_kv_b(const Weight* kv_b, int64_t num_heads, int64_t dn, int64_t dv,
                       int64_t kv_lora) {
  CHECK(kv_b != nullptr && kv_b->rows == num_heads * (dn + dv) && kv_b->cols == kv_lora,
        "kv_b_proj must be [H*(dn+dv), kv_lora] = [", num_heads * (dn + dv), ", ", kv_lora, "]");
}

inline void check_quantize_e4m3(const QuantizeE4m3Params& p) {
  CHECK(p.n >= 0, "quantize_e4m3: n ", p.n);
  CHECK(p.inv_scale > 0.0f && p.inv_scale < 1e30f, "quantize_e4m3: inv_scale ", p.inv_scale);
  if (p.n > 0) CHECK(p.x != nullptr && p.codes != nullptr, "quantize_e4m3: null x or codes");
}

inline void check_round_bf16(const RoundBf16Params& p) {
  CHECK(p.n >= 0, "round_bf16: n ", p.n);
  if (p.n > 0) CHECK(p.x != nullptr && p.out != nullptr, "round_bf16: null x or out");
}

inline void check_mla_absorb(const MlaAbsorbParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_heads > 0 && p.dn > 0 && p.dr >= 0 && p.dv > 0 && p.kv_lora > 0,
        "mla_absorb_q: T ", p.num_tokens, ", H ", p.num_heads, ", dn ", p.dn, ", dr ", p.dr,
        ", dv ", p.dv, ", kv_lora ", p.kv_lora);
  check_kv_b(p.kv_b, p.num_heads, p.dn, p.dv, p.kv_lora);
  if (p.num_tokens > 0)
    CHECK(p.q != nullptr && p.q_lat != nullptr && (p.q_pe != nullptr || p.dr == 0),
          "mla_absorb_q: null q, q_lat or q_pe");
}

inline void check_mla_project(const MlaProjectParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_heads > 0 && p.dn > 0 && p.dv > 0 && p.kv_lora > 0,
        "mla_project_uv: T ", p.num_tokens, ", H ", p.num_heads, ", dn ", p.dn, ", dv ", p.dv,
        ", kv_lora ", p.kv_lora);
  check_kv_b(p.kv_b, p.num_heads, p.dn, p.dv, p.kv_lora);
  if (p.num_tokens > 0)
    CHECK(p.o_lat != nullptr && p.out != nullptr, "mla_project_uv: null o_lat or out");
}

inline void check_query_slots(const DsaQuerySlotsParams& p) {
  CHECK(p.num_tokens >= 0 && p.topk > 0 && p.block_size > 0 && p.table_stride >= 0,
        "dsa_query_slots: T ", p.num_tokens, ", topk ", p.topk, ", block_size ", p.block_size,
        ", table_stride ", p.table_stride);
  if (p.num_tokens > 0)
    CHECK(p.positions != nullptr && p.q_pos != nullptr && p.block_table != nullptr &&
              p.slots != nullptr && p.seq_lens != nullptr,
          "dsa_query_slots: null pointer");
}

}  // namespace hyserve
