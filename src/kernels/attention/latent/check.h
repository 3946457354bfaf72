// validate(Params) of the FP8-latent ops (params.h): what both the CPU op (cpu.cpp) and the
// CUDA launcher (cuda/latent.cu) require, checked on the host before either runs. Reads
// no pointed-to data (on CUDA it is device memory); the launcher adds only its grid and
// shared-memory limits. Messages name the op and the field.
#pragma once

#include "kernels/attention/latent/params.h"
#include "util/error.h"

namespace hyserve {

// kv_b_proj of H heads: [H*(dn+dv), kv_lora], in a valid stored format.
inline void validate_kv_b(const char* op, const Weight* kv_b, int64_t num_heads, int64_t dn,
                          int64_t dv, int64_t kv_lora) {
  CHECK(kv_b != nullptr && kv_b->rows == num_heads * (dn + dv) && kv_b->cols == kv_lora, op,
        ": kv_b_proj must be [H*(dn+dv), kv_lora] = [", num_heads * (dn + dv), ", ", kv_lora, "]");
  try {
    kv_b->check_layout();
  } catch (const Error& e) {
    HYSERVE_THROW(InvalidArgument, op, ": kv_b: ", e.what());
  }
}

inline void validate(const QuantizeE4m3Params& p) {
  CHECK(p.n >= 0, "quantize_e4m3: n ", p.n);
  CHECK(p.inv_scale > 0.0f && p.inv_scale < 1e30f, "quantize_e4m3: inv_scale ", p.inv_scale);
  if (p.n > 0) CHECK(p.x != nullptr && p.codes != nullptr, "quantize_e4m3: null x or codes");
}

inline void validate(const RoundBf16Params& p) {
  CHECK(p.n >= 0, "round_bf16: n ", p.n);
  if (p.n > 0) CHECK(p.x != nullptr && p.out != nullptr, "round_bf16: null x or out");
}

inline void validate(const MlaAbsorbParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_heads > 0 && p.dn > 0 && p.dr >= 0 && p.dv > 0 && p.kv_lora > 0,
        "mla_absorb_q: num_tokens ", p.num_tokens, ", num_heads ", p.num_heads, ", dn ", p.dn,
        ", dr ", p.dr, ", dv ", p.dv, ", kv_lora ", p.kv_lora);
  validate_kv_b("mla_absorb_q", p.kv_b, p.num_heads, p.dn, p.dv, p.kv_lora);
  if (p.num_tokens > 0)
    CHECK(p.q != nullptr && p.q_lat != nullptr && (p.q_pe != nullptr || p.dr == 0),
          "mla_absorb_q: null q, q_lat or q_pe");
}

inline void validate(const MlaProjectParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_heads > 0 && p.dn > 0 && p.dv > 0 && p.kv_lora > 0,
        "mla_project_uv: num_tokens ", p.num_tokens, ", num_heads ", p.num_heads, ", dn ", p.dn,
        ", dv ", p.dv, ", kv_lora ", p.kv_lora);
  validate_kv_b("mla_project_uv", p.kv_b, p.num_heads, p.dn, p.dv, p.kv_lora);
  if (p.num_tokens > 0)
    CHECK(p.o_lat != nullptr && p.out != nullptr, "mla_project_uv: null o_lat or out");
}

// The positions themselves are checked by the CPU op only (it reads them on the host;
// the CUDA kernel trusts them, cuda.h).
inline void validate(const DsaQuerySlotsParams& p) {
  CHECK(p.num_tokens >= 0 && p.topk > 0 && p.block_size > 0 && p.table_stride >= 0,
        "dsa_query_slots: num_tokens ", p.num_tokens, ", topk ", p.topk, ", block_size ",
        p.block_size, ", table_stride ", p.table_stride);
  if (p.num_tokens > 0)
    CHECK(p.positions != nullptr && p.q_pos != nullptr && p.block_table != nullptr &&
              p.slots != nullptr && p.seq_lens != nullptr,
          "dsa_query_slots: null positions, q_pos, block_table, slots or seq_lens");
}

}  // namespace hyserve
