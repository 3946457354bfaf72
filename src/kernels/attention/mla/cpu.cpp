// CPU reference of MLA attention; see cpu.h. Parallel over heads: each head decodes
// its kv_b rows once and then runs every query, so a head's result does not depend on
// the thread count.
#include "kernels/attention/mla/cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention/mla/check.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

// The top-k list's entries, read on the host (validate reads no data).
void check_topk_entries(const MlaAttentionParams& p) {
  if (p.topk == nullptr) return;
  std::vector<int32_t> row;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    row.assign(p.topk + t * p.topk_width, p.topk + (t + 1) * p.topk_width);
    for (const int32_t s : row) {
      if (s == -1) continue;
      CHECK(s >= 0 && s < p.num_keys && s <= p.q_pos[t], "mla_attention: query ", t, " (position ",
            p.q_pos[t], ") lists key ", s, " of ", p.num_keys);
    }
    std::sort(row.begin(), row.end());
    for (size_t i = 1; i < row.size(); ++i) {
      CHECK(row[i] == -1 || row[i] != row[i - 1], "mla_attention: query ", t, " lists key ", row[i],
            " twice");
    }
  }
}

// The keys query t attends, in ascending position order.
void gather_keys(const MlaAttentionParams& p, int64_t t, std::vector<int64_t>& keys) {
  keys.clear();
  if (p.topk == nullptr) {
    const int64_t last = std::min(p.q_pos[t], p.num_keys - 1);
    for (int64_t s = 0; s <= last; ++s) keys.push_back(s);
    return;
  }
  for (int64_t i = 0; i < p.topk_width; ++i) {
    const int32_t s = p.topk[t * p.topk_width + i];
    if (s >= 0) keys.push_back(s);
  }
  std::sort(keys.begin(), keys.end());
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Turns logits into softmax probabilities in place and returns ln(sum(exp(logits))).
float softmax(std::vector<float>& logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  float sum = 0.0f;
  for (float& l : logits) {
    l = std::exp(l - max_logit);
    sum += l;
  }
  for (float& l : logits) l /= sum;
  return max_logit + std::log(sum);
}

// kv_b rows of head h as fp32: [dn + dv, kv_lora], W_UK rows then W_UV rows.
std::vector<float> decode_head_weights(const MlaAttentionParams& p, int64_t h) {
  const int64_t rows = p.dn + p.dv;
  std::vector<float> w(static_cast<size_t>(rows * p.kv_lora));
  for (int64_t r = 0; r < rows; ++r) p.kv_b->dequantize_row(h * rows + r, &w[r * p.kv_lora]);
  return w;
}

const float* q_row(const MlaAttentionParams& p, int64_t t, int64_t h) {
  return p.q + (t * p.num_heads + h) * (p.dn + p.dr);
}
// Latent row s as query t sees it (its own block table in batched decode), as fp32: a bf16
// row is widened into `scratch` (kv_lora + dr floats).
const float* latent_row(const MlaAttentionParams& p, int64_t t, int64_t s,
                        std::vector<float>& scratch) {
  const int64_t width = p.kv_lora + p.dr;
  const PagedRows pages = p.latent_pages.for_query(t, p.table_stride);
  if (p.latent_bf16 == nullptr) return pages.row(p.latent, s, width);
  const uint16_t* row = pages.row(p.latent_bf16, s, width);
  scratch.resize(static_cast<size_t>(width));
  for (int64_t i = 0; i < width; ++i) scratch[static_cast<size_t>(i)] = bf16_to_f32(row[i]);
  return scratch.data();
}

// Writes out = 0 and lse = -inf for a query that sees no key.
void write_empty(const MlaAttentionParams& p, int64_t t, int64_t h) {
  std::fill_n(p.out + (t * p.num_heads + h) * p.dv, p.dv, 0.0f);
  if (p.lse != nullptr) {
    p.lse[t * p.num_heads + h] = -std::numeric_limits<float>::infinity();
  }
}

void expanded_head(const MlaAttentionParams& p, int64_t h) {
  const int64_t kv_width = p.dn + p.dv;
  const std::vector<float> w = decode_head_weights(p, h);
  // kv rows = [k_nope (dn) | v (dv)] = W c_s, of the keys some query attends only (sparse
  // attention reads top-k of a long context), packed in key order: kv_index[s] is key s's row.
  std::vector<int32_t> kv_index(static_cast<size_t>(p.num_keys), -1);
  std::vector<int64_t> keys;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    gather_keys(p, t, keys);
    for (const int64_t s : keys) kv_index[s] = 0;
  }
  int32_t num_rows = 0;
  for (int32_t& index : kv_index) {
    if (index == 0) index = num_rows++;
  }
  std::vector<float> kv(static_cast<size_t>(num_rows * kv_width));
  std::vector<float> row;
  for (int64_t s = 0; s < p.num_keys; ++s) {
    if (kv_index[s] < 0) continue;
    const float* c = latent_row(p, 0, s, row);
    float* kv_s = &kv[kv_index[s] * kv_width];
    for (int64_t j = 0; j < kv_width; ++j) kv_s[j] = dot(&w[j * p.kv_lora], c, p.kv_lora);
  }
  std::vector<float> probs;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    gather_keys(p, t, keys);
    if (keys.empty()) {
      write_empty(p, t, h);
      continue;
    }
    const float* q_nope = q_row(p, t, h);
    const float* q_pe = q_nope + p.dn;
    probs.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t s = keys[i];
      const float nope = dot(q_nope, &kv[kv_index[s] * kv_width], p.dn);
      const float pe = dot(q_pe, latent_row(p, 0, s, row) + p.kv_lora, p.dr);
      probs[i] = (nope + pe) * p.softmax_scale;
    }
    const float lse = softmax(probs);
    float* out = p.out + (t * p.num_heads + h) * p.dv;
    std::fill_n(out, p.dv, 0.0f);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* v = &kv[kv_index[keys[i]] * kv_width + p.dn];
      for (int64_t d = 0; d < p.dv; ++d) out[d] += probs[i] * v[d];
    }
    if (p.lse != nullptr) p.lse[t * p.num_heads + h] = lse;
  }
}

// Query t's adapter on kv_b (params.h), or null.
const LoraMatrices* kv_b_lora(const MlaAttentionParams& p, int64_t t) {
  if (p.lora_slots == nullptr) return nullptr;
  const int32_t slot = p.lora_slots[t];
  CHECK(slot >= -1 && slot < p.kv_b_lora.num_slots, "mla_attention: LoRA slot ", slot, " of ",
        p.kv_b_lora.num_slots);
  if (slot < 0) return nullptr;
  const LoraMatrices& m = p.kv_b_lora.slots[slot];
  if (m.empty()) return nullptr;
  CHECK(m.rank > 0 && m.rank <= kMaxLoraRank && m.b != nullptr, "mla_attention: kv_b adapter of ",
        "rank ", m.rank);
  return &m;
}

void absorbed_head(const MlaAttentionParams& p, int64_t h) {
  const std::vector<float> w = decode_head_weights(p, h);
  const float* w_uk = w.data();                     // [dn, kv_lora]
  const float* w_uv = w.data() + p.dn * p.kv_lora;  // [dv, kv_lora]
  std::vector<int64_t> keys;
  std::vector<float> probs;
  std::vector<float> q_lat(static_cast<size_t>(p.kv_lora));
  std::vector<float> o_lat(static_cast<size_t>(p.kv_lora));
  std::vector<float> u_lat(static_cast<size_t>(kMaxLoraRank));
  std::vector<float> row;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    gather_keys(p, t, keys);
    if (keys.empty()) {
      write_empty(p, t, h);
      continue;
    }
    const float* q_nope = q_row(p, t, h);
    const float* q_pe = q_nope + p.dn;
    std::fill(q_lat.begin(), q_lat.end(), 0.0f);
    for (int64_t d = 0; d < p.dn; ++d) {
      for (int64_t l = 0; l < p.kv_lora; ++l) q_lat[l] += q_nope[d] * w_uk[d * p.kv_lora + l];
    }
    // kv_b's adapter: q_lat += s (q_nope B_UK(h)) A; u = q_nope B_UK(h) [r].
    const LoraMatrices* m = kv_b_lora(p, t);
    const int64_t b_row0 = p.kv_b_lora_row0 + h * (p.dn + p.dv);
    if (m != nullptr) {
      for (int64_t j = 0; j < m->rank; ++j) {
        float u = 0.0f;
        for (int64_t d = 0; d < p.dn; ++d) u += q_nope[d] * m->b[(b_row0 + d) * m->rank + j];
        u_lat[j] = u;
      }
      for (int64_t l = 0; l < p.kv_lora; ++l) {
        float acc = 0.0f;
        for (int64_t j = 0; j < m->rank; ++j) acc += u_lat[j] * m->a[j * p.kv_lora + l];
        q_lat[l] += m->scale * acc;
      }
    }
    probs.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* c = latent_row(p, t, keys[i], row);
      probs[i] =
          (dot(q_lat.data(), c, p.kv_lora) + dot(q_pe, c + p.kv_lora, p.dr)) * p.softmax_scale;
    }
    const float lse = softmax(probs);
    std::fill(o_lat.begin(), o_lat.end(), 0.0f);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* c = latent_row(p, t, keys[i], row);
      for (int64_t l = 0; l < p.kv_lora; ++l) o_lat[l] += probs[i] * c[l];
    }
    float* out = p.out + (t * p.num_heads + h) * p.dv;
    for (int64_t d = 0; d < p.dv; ++d) out[d] = dot(&w_uv[d * p.kv_lora], o_lat.data(), p.kv_lora);
    // kv_b's adapter: out += s B_UV(h) (A o_lat).
    if (m != nullptr) {
      for (int64_t j = 0; j < m->rank; ++j)
        u_lat[j] = dot(m->a + j * p.kv_lora, o_lat.data(), p.kv_lora);
      for (int64_t d = 0; d < p.dv; ++d) {
        const float* b = m->b + (b_row0 + p.dn + d) * m->rank;
        float acc = 0.0f;
        for (int64_t j = 0; j < m->rank; ++j) acc += b[j] * u_lat[j];
        out[d] += m->scale * acc;
      }
    }
    if (p.lse != nullptr) p.lse[t * p.num_heads + h] = lse;
  }
}

template <typename HeadFn>
void run_heads(const MlaAttentionParams& p, HeadFn head_fn) {
  check_topk_entries(p);
  if (p.num_tokens == 0) return;
  parallel_for(p.num_heads, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) head_fn(p, h);
  });
}

// The positions hint (params.h q_pos_first) is not used here, only checked: a device kernel
// that trusts it must not be given a wrong one.
void check_q_pos_first(const MlaAttentionParams& p) {
  if (p.q_pos_first < 0) return;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    CHECK(p.q_pos[t] == p.q_pos_first + t, "mla_attention: q_pos_first ", p.q_pos_first,
          " but query ", t, " is at position ", p.q_pos[t]);
  }
}

}  // namespace

void mla_attention_expanded(const MlaAttentionParams& p) {
  validate(MlaAttentionOpParams{.attn = p, .absorbed = false});
  check_q_pos_first(p);
  run_heads(p, expanded_head);
}

void mla_attention_absorbed(const MlaAttentionParams& p) {
  validate(p);
  check_q_pos_first(p);
  run_heads(p, absorbed_head);
}

}  // namespace hyserve::cpu
