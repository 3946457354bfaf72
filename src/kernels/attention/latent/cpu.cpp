// CPU reference of the FP8-latent helper ops; see cpu.h.
#include "kernels/attention/latent/cpu.h"

#include <vector>

#include "core/dtype.h"
#include "core/paged.h"
#include "kernels/attention/latent/check.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

// Rows [first, first + n) of w, dequantized: [n, w.cols].
std::vector<float> dequantize_rows(const Weight& w, int64_t first, int64_t n) {
  std::vector<float> rows(static_cast<size_t>(n * w.cols));
  for (int64_t r = 0; r < n; ++r) w.dequantize_row(first + r, rows.data() + r * w.cols);
  return rows;
}

}  // namespace

void quantize_e4m3(const QuantizeE4m3Params& p) {
  validate(p);
  parallel_for(
      p.n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) p.codes[i] = f32_to_e4m3(p.x[i] * p.inv_scale);
      },
      4096);
}

void round_bf16(const RoundBf16Params& p) {
  validate(p);
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = f32_to_bf16(p.x[i]);
}

void mla_absorb_q(const MlaAbsorbParams& p) {
  validate(p);
  if (p.num_tokens == 0) return;
  const int64_t h_all = p.num_heads, dqk = p.dn + p.dr, kv = p.kv_lora;
  parallel_for(h_all, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const std::vector<float> w_uk = dequantize_rows(*p.kv_b, h * (p.dn + p.dv), p.dn);
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const float* q = p.q + (t * h_all + h) * dqk;
        float* q_lat = p.q_lat + (t * h_all + h) * kv;
        for (int64_t l = 0; l < kv; ++l) {
          float acc = 0.0f;
          for (int64_t d = 0; d < p.dn; ++d) acc += q[d] * w_uk[d * kv + l];
          q_lat[l] = acc;
        }
        float* q_pe = p.q_pe + (t * h_all + h) * p.dr;
        for (int64_t i = 0; i < p.dr; ++i) q_pe[i] = q[p.dn + i];
      }
    }
  });
}

void mla_project_uv(const MlaProjectParams& p) {
  validate(p);
  if (p.num_tokens == 0) return;
  const int64_t h_all = p.num_heads, kv = p.kv_lora;
  parallel_for(h_all, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const std::vector<float> w_uv = dequantize_rows(*p.kv_b, h * (p.dn + p.dv) + p.dn, p.dv);
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const float* o = p.o_lat + (t * h_all + h) * kv;
        float* out = p.out + (t * h_all + h) * p.dv;
        for (int64_t j = 0; j < p.dv; ++j) {
          float acc = 0.0f;
          for (int64_t l = 0; l < kv; ++l) acc += w_uv[j * kv + l] * o[l];
          out[j] = acc;
        }
      }
    }
  });
}

void dsa_query_slots(const DsaQuerySlotsParams& p) {
  validate(p);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int32_t* table = p.block_table + t * p.table_stride;
    for (int64_t j = 0; j < p.topk; ++j) {
      const int32_t pos = p.positions[t * p.topk + j];
      CHECK(pos >= -1 && pos <= p.q_pos[t], "dsa_query_slots: query ", t, " (position ", p.q_pos[t],
            ") selects position ", pos);
      p.slots[t * p.topk + j] =
          pos < 0 ? -1 : static_cast<int32_t>(slot_index(table, p.block_size, pos));
    }
    p.seq_lens[t] = static_cast<int32_t>(p.q_pos[t] + 1);
  }
}

}  // namespace hyserve::cpu
