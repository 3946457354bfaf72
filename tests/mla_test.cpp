// MLA attention over the latent cache: the absorbed form against the expanded form, both
// against a naive double-precision attention written here, the top-k path against the
// dense path, and the empty / invalid cases.
#include "kernels/attention/mla/cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "kernels/attention/indexer/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

struct Sizes {
  int64_t num_tokens, num_keys, num_heads, dn, dr, dv, kv_lora;
};

// Random inputs for one MLA call; q_pos[t] = first_pos + t.
struct Problem {
  Sizes z;
  std::vector<float> q, latent, kv_b_data;
  std::vector<int64_t> q_pos;
  std::vector<int32_t> topk;
  int64_t topk_width = 0;
  Weight kv_b;
  float scale;

  Problem(Sizes sizes, int64_t first_pos, uint32_t seed) : z(sizes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    q.resize(z.num_tokens * z.num_heads * (z.dn + z.dr));
    latent.resize(z.num_keys * (z.kv_lora + z.dr));
    kv_b_data.resize(z.num_heads * (z.dn + z.dv) * z.kv_lora);
    for (float& v : q) v = dist(rng);
    for (float& v : latent) v = dist(rng);
    // Weights ~ N(0, 1/kv_lora) so K and V entries are O(1), as after kv_a_layernorm.
    const float w_std = 1.0f / std::sqrt(static_cast<float>(z.kv_lora));
    for (float& v : kv_b_data) v = dist(rng) * w_std;
    q_pos.resize(z.num_tokens);
    for (int64_t t = 0; t < z.num_tokens; ++t) q_pos[t] = first_pos + t;
    kv_b.format = WeightFormat::kDense;
    kv_b.dtype = DType::kF32;
    kv_b.rows = z.num_heads * (z.dn + z.dv);
    kv_b.cols = z.kv_lora;
    kv_b.data = kv_b_data.data();
    scale = 1.0f / std::sqrt(static_cast<float>(z.dn + z.dr));
  }

  MlaAttentionParams params(std::vector<float>& out, std::vector<float>* lse, bool use_topk) const {
    out.assign(z.num_tokens * z.num_heads * z.dv, std::nanf(""));
    if (lse != nullptr) lse->assign(z.num_tokens * z.num_heads, std::nanf(""));
    return {.q = q.data(),
            .latent = latent.data(),
            .latent_pages = {},
            .kv_b = &kv_b,
            .q_pos = q_pos.data(),
            .topk = use_topk ? topk.data() : nullptr,
            .topk_width = use_topk ? topk_width : 0,
            .out = out.data(),
            .lse = lse != nullptr ? lse->data() : nullptr,
            .num_tokens = z.num_tokens,
            .num_keys = z.num_keys,
            .num_heads = z.num_heads,
            .dn = z.dn,
            .dr = z.dr,
            .dv = z.dv,
            .kv_lora = z.kv_lora,
            .softmax_scale = scale};
  }

  // Keys query t sees: the listed ones with topk, else s <= q_pos[t].
  std::vector<int64_t> keys_of(int64_t t, bool use_topk) const {
    std::vector<int64_t> keys;
    for (int64_t s = 0; s < z.num_keys; ++s) {
      bool on = s <= q_pos[t];
      if (use_topk) {
        on = false;
        for (int64_t i = 0; i < topk_width; ++i) on = on || topk[t * topk_width + i] == s;
      }
      if (on) keys.push_back(s);
    }
    return keys;
  }

  // Naive expanded attention in double: out [T, H, dv], lse [T, H].
  void reference(bool use_topk, std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(z.num_tokens * z.num_heads * z.dv, 0.0);
    lse.assign(z.num_tokens * z.num_heads, -std::numeric_limits<double>::infinity());
    const int64_t lat_w = z.kv_lora + z.dr;
    for (int64_t t = 0; t < z.num_tokens; ++t) {
      const std::vector<int64_t> keys = keys_of(t, use_topk);
      if (keys.empty()) continue;
      for (int64_t h = 0; h < z.num_heads; ++h) {
        const float* qh = &q[(t * z.num_heads + h) * (z.dn + z.dr)];
        const float* w = &kv_b_data[h * (z.dn + z.dv) * z.kv_lora];
        std::vector<double> logits, values;
        for (const int64_t s : keys) {
          const float* c = &latent[s * lat_w];
          double logit = 0;
          for (int64_t d = 0; d < z.dn; ++d) {
            double k = 0;
            for (int64_t l = 0; l < z.kv_lora; ++l) k += double(w[d * z.kv_lora + l]) * c[l];
            logit += qh[d] * k;
          }
          for (int64_t d = 0; d < z.dr; ++d) logit += double(qh[z.dn + d]) * c[z.kv_lora + d];
          logits.push_back(logit * scale);
          for (int64_t d = 0; d < z.dv; ++d) {
            double v = 0;
            for (int64_t l = 0; l < z.kv_lora; ++l) {
              v += double(w[(z.dn + d) * z.kv_lora + l]) * c[l];
            }
            values.push_back(v);
          }
        }
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (const double l : logits) m = std::max(m, l);
        for (const double l : logits) sum += std::exp(l - m);
        lse[t * z.num_heads + h] = m + std::log(sum);
        for (size_t i = 0; i < keys.size(); ++i) {
          const double p = std::exp(logits[i] - m) / sum;
          for (int64_t d = 0; d < z.dv; ++d) {
            out[(t * z.num_heads + h) * z.dv + d] += p * values[i * z.dv + d];
          }
        }
      }
    }
  }
};

// Largest |a - b|, reported with its index; fails past tol.
void expect_close(const std::vector<float>& a, const std::vector<double>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::isinf(b[i]) && a[i] == b[i] ? 0.0 : std::fabs(a[i] - b[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst element " << at << " got " << a[at] << " want "
                        << b[at];
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// Outputs are O(1) and the naive reference is exact to double: fp32 rounding over
// kv_lora-long dot products and softmax measures ~1e-6 here; 2e-5 absolute leaves margin.
constexpr double kTol = 2e-5;

void check_forms(const Problem& pr, bool use_topk, const std::string& what) {
  std::vector<double> ref_out, ref_lse;
  pr.reference(use_topk, ref_out, ref_lse);
  std::vector<float> exp_out, exp_lse, abs_out, abs_lse;
  cpu::mla_attention_expanded(pr.params(exp_out, &exp_lse, use_topk));
  cpu::mla_attention_absorbed(pr.params(abs_out, &abs_lse, use_topk));
  expect_close(exp_out, ref_out, kTol, what + " expanded out");
  expect_close(exp_lse, ref_lse, kTol, what + " expanded lse");
  expect_close(abs_out, ref_out, kTol, what + " absorbed out");
  expect_close(abs_lse, ref_lse, kTol, what + " absorbed lse");
  expect_close(abs_out, to_double(exp_out), kTol, what + " absorbed vs expanded out");
}

TEST(Mla, DenseCausalPrefillBothFormsMatchNaive) {
  for (const int64_t n : {1, 3, 63, 65}) {
    Problem pr({.num_tokens = n,
                .num_keys = n,
                .num_heads = 2,
                .dn = 16,
                .dr = 8,
                .dv = 12,
                .kv_lora = 32},
               0, 100 + n);
    check_forms(pr, false, "prefill n=" + std::to_string(n));
  }
}

TEST(Mla, ChunkedPrefillAgainstLongerCache) {
  // 3 new tokens at positions 62..64 over 65 cached keys; odd head dims.
  Problem pr(
      {.num_tokens = 3, .num_keys = 65, .num_heads = 3, .dn = 7, .dr = 5, .dv = 9, .kv_lora = 33},
      62, 5);
  check_forms(pr, false, "chunk");
}

TEST(Mla, DecodeSingleQuery) {
  for (const int64_t s : {1, 3, 63, 65}) {
    Problem pr({.num_tokens = 1,
                .num_keys = s,
                .num_heads = 4,
                .dn = 16,
                .dr = 8,
                .dv = 16,
                .kv_lora = 64},
               s - 1, 200 + s);
    check_forms(pr, false, "decode S=" + std::to_string(s));
  }
}

TEST(Mla, NopeHeadsWithZeroRopeDims) {
  Problem pr(
      {.num_tokens = 5, .num_keys = 5, .num_heads = 2, .dn = 8, .dr = 0, .dv = 8, .kv_lora = 16}, 0,
      9);
  check_forms(pr, false, "dr=0");
}

// kv_b's LoRA adapters in low-rank form (params.h lora_slots / kv_b_lora): each query attends
// as with the merged weights W + s B A of its slot's adapter (the naive reference on the
// merged kv_b, per slot), over dense and top-k keys; a query of slot -1 or of a slot without
// matrices is bitwise the call without adapters. The expanded form refuses them.
TEST(Mla, KvBLoraLowRankFormEqualsTheMergedWeights) {
  const Sizes z{
      .num_tokens = 9, .num_keys = 9, .num_heads = 3, .dn = 16, .dr = 8, .dv = 12, .kv_lora = 32};
  for (const int variant : {0, 1, 2}) {
    // 0: dense; 1: top-k; 2: dense, the call's heads the second half of B's rows
    // (kv_b_lora_row0: kv_b a view of some heads of the adapted weight).
    const bool use_topk = variant == 1;
    const int64_t row0 = variant == 2 ? z.num_heads * (z.dn + z.dv) : 0;
    SCOPED_TRACE("variant " + std::to_string(variant));
    Problem pr(z, 0, 77);
    if (use_topk) {
      pr.topk_width = 4;
      pr.topk.assign(z.num_tokens * pr.topk_width, -1);
      // Query t: keys t, t - 2, t - 4 (those >= 0), a -1 slot after them.
      for (int64_t t = 0; t < z.num_tokens; ++t) {
        for (int64_t i = 0; i < 3 && t - 2 * i >= 0; ++i) {
          pr.topk[t * pr.topk_width + i] = static_cast<int32_t>(t - 2 * i);
        }
      }
    }
    // Slots: 0 (rank 4), 1 (no matrices), 2 (rank 64, rsLoRA-like scale).
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t rows = z.num_heads * (z.dn + z.dv);
    const std::vector<int64_t> ranks = {4, 0, 64};
    const std::vector<float> scales = {2.0f, 0.0f, 0.25f};
    std::vector<std::vector<float>> a(3), b(3);
    std::vector<LoraMatrices> table(3);
    for (size_t k = 0; k < 3; ++k) {
      if (ranks[k] == 0) continue;
      a[k].resize(static_cast<size_t>(ranks[k] * z.kv_lora));
      b[k].resize(static_cast<size_t>((row0 + rows) * ranks[k]));
      for (float& v : a[k]) v = dist(rng) / std::sqrt(static_cast<float>(z.kv_lora));
      for (float& v : b[k]) v = 0.2f * dist(rng);
      table[k] = {a[k].data(), b[k].data(), ranks[k], scales[k]};
    }
    const std::vector<int32_t> slots = {0, -1, 2, 1, 0, 2, -1, 0, 2};
    std::vector<float> base_out, base_lse, out, lse;
    cpu::mla_attention_absorbed(pr.params(base_out, &base_lse, use_topk));
    MlaAttentionParams p = pr.params(out, &lse, use_topk);
    p.lora_slots = slots.data();
    p.kv_b_lora = {table.data(), 3};
    p.kv_b_lora_row0 = row0;
    cpu::mla_attention_absorbed(p);
    // The naive reference on each slot's merged kv_b.
    std::vector<std::vector<double>> want_out(3), want_lse(3);
    for (size_t k = 0; k < 3; ++k) {
      Problem merged = pr;
      merged.kv_b.data = merged.kv_b_data.data();
      for (int64_t r = 0; r < rows && ranks[k] > 0; ++r) {
        for (int64_t c = 0; c < z.kv_lora; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < ranks[k]; ++j) {
            acc += double(b[k][(row0 + r) * ranks[k] + j]) * a[k][j * z.kv_lora + c];
          }
          merged.kv_b_data[r * z.kv_lora + c] += static_cast<float>(scales[k] * acc);
        }
      }
      merged.reference(use_topk, want_out[k], want_lse[k]);
    }
    double worst = 0, adapted = 0;
    for (int64_t t = 0; t < z.num_tokens; ++t) {
      const int32_t slot = slots[t];
      const int64_t n = z.num_heads * z.dv, first = t * n;
      if (slot < 0 || ranks[slot] == 0) {
        EXPECT_EQ(0, std::memcmp(&out[first], &base_out[first], n * 4)) << "query " << t;
        EXPECT_EQ(0,
                  std::memcmp(&lse[t * z.num_heads], &base_lse[t * z.num_heads], z.num_heads * 4))
            << "query " << t;
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        worst = std::max(worst, std::fabs(out[first + i] - want_out[slot][first + i]));
        adapted = std::max(adapted, std::fabs(base_out[first + i] - want_out[slot][first + i]));
      }
      for (int64_t h = 0; h < z.num_heads; ++h) {
        const int64_t i = t * z.num_heads + h;
        if (std::isinf(want_lse[slot][i])) {
          EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity());
        } else {
          worst = std::max(worst, std::fabs(lse[i] - want_lse[slot][i]));
        }
      }
    }
    EXPECT_LE(worst, kTol);
    EXPECT_GT(adapted, 100 * kTol) << "the adapters change the outputs";
    // The expanded form refuses them.
    EXPECT_THROW(cpu::mla_attention_expanded(p), Error);
    p.kv_b_lora = {};
    EXPECT_THROW(cpu::mla_attention_absorbed(p), Error);  // slots without a table
  }
}

// Random subsets per query, listed unsorted, with -1 slots in between.
TEST(Mla, TopkSelectionBothFormsMatchNaive) {
  for (const int64_t n : {1, 3, 63, 65}) {
    Problem pr({.num_tokens = n,
                .num_keys = n,
                .num_heads = 2,
                .dn = 16,
                .dr = 8,
                .dv = 12,
                .kv_lora = 32},
               0, 300 + n);
    std::mt19937 rng(n);
    pr.topk_width = 7;
    pr.topk.assign(n * pr.topk_width, -1);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> visible(t + 1);
      for (int32_t s = 0; s <= t; ++s) visible[s] = s;
      std::shuffle(visible.begin(), visible.end(), rng);
      const int64_t take = std::min<int64_t>(5, t + 1);
      std::vector<int32_t> slots(pr.topk_width, -1);
      for (int64_t i = 0; i < take; ++i) slots[i] = visible[i];
      std::shuffle(slots.begin(), slots.end(), rng);
      std::copy(slots.begin(), slots.end(), pr.topk.begin() + t * pr.topk_width);
    }
    check_forms(pr, true, "topk n=" + std::to_string(n));
  }
}

// DSA with context <= index_topk equals dense MLA: causal_topk lists every visible key,
// and each form gives bitwise the same output and lse on both paths.
TEST(Mla, DsaWithShortContextEqualsDenseBitwise) {
  for (const int64_t n : {1, 3, 63, 65}) {
    Problem pr({.num_tokens = n,
                .num_keys = n,
                .num_heads = 3,
                .dn = 16,
                .dr = 8,
                .dv = 12,
                .kv_lora = 32},
               0, 400 + n);
    std::mt19937 rng(n);
    std::normal_distribution<float> dist;
    std::vector<float> scores(n * n);
    for (float& v : scores) v = dist(rng);
    pr.topk_width = 80;
    pr.topk.resize(n * pr.topk_width);
    cpu::causal_topk(scores.data(), pr.q_pos.data(), n, n, pr.topk_width, pr.topk.data());
    for (const bool absorbed : {false, true}) {
      const auto run = absorbed ? cpu::mla_attention_absorbed : cpu::mla_attention_expanded;
      std::vector<float> dense_out, dense_lse, sparse_out, sparse_lse;
      run(pr.params(dense_out, &dense_lse, false));
      run(pr.params(sparse_out, &sparse_lse, true));
      EXPECT_EQ(0, std::memcmp(dense_out.data(), sparse_out.data(), dense_out.size() * 4))
          << (absorbed ? "absorbed" : "expanded") << " n=" << n;
      EXPECT_EQ(0, std::memcmp(dense_lse.data(), sparse_lse.data(), dense_lse.size() * 4))
          << (absorbed ? "absorbed" : "expanded") << " n=" << n;
    }
  }
}

// The bf16 latent (--kv-cache-dtype bf16): reading bf16 bits gives bitwise what the fp32
// path gives over the same values rounded to bf16, in both forms, dense and top-k; setting
// both latents (or neither) is refused.
TEST(Mla, Bf16LatentEqualsFp32OfTheRoundedValues) {
  Problem pr(
      {.num_tokens = 5, .num_keys = 9, .num_heads = 3, .dn = 16, .dr = 8, .dv = 12, .kv_lora = 32},
      4, 21);
  pr.topk_width = 4;
  pr.topk = {0, 3, 4, -1, 1, 2, 5, 4, 6, 0, 3, -1, 2, 4, 6, 7, 0, 1, 5, 8};  // q_pos 4..8
  std::vector<uint16_t> bits(pr.latent.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(pr.latent[i]);
  for (size_t i = 0; i < bits.size(); ++i) pr.latent[i] = bf16_to_f32(bits[i]);
  for (const bool use_topk : {false, true}) {
    for (const auto run : {cpu::mla_attention_expanded, cpu::mla_attention_absorbed}) {
      std::vector<float> want, want_lse, got, got_lse;
      run(pr.params(want, &want_lse, use_topk));
      MlaAttentionParams p = pr.params(got, &got_lse, use_topk);
      p.latent = nullptr;
      p.latent_bf16 = bits.data();
      run(p);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << use_topk;
      EXPECT_EQ(0, std::memcmp(want_lse.data(), got_lse.data(), want_lse.size() * 4)) << use_topk;
    }
  }
  std::vector<float> out;
  MlaAttentionParams both = pr.params(out, nullptr, false);
  both.latent_bf16 = bits.data();
  EXPECT_THROW(cpu::mla_attention_absorbed(both), Error);
  both.latent = nullptr;
  both.latent_bf16 = nullptr;
  EXPECT_THROW(cpu::mla_attention_absorbed(both), Error);
}

TEST(Mla, NoVisibleKeyGivesZerosAndMinusInfLse) {
  Problem pr(
      {.num_tokens = 3, .num_keys = 4, .num_heads = 2, .dn = 4, .dr = 2, .dv = 3, .kv_lora = 8}, 0,
      11);
  pr.q_pos = {-1, 1, -1};  // tokens 0 and 2 see nothing on the dense path
  pr.topk_width = 2;
  pr.topk = {-1, -1, 0, 1, -1, -1};  // and nothing on the top-k path
  for (const bool use_topk : {false, true}) {
    for (const auto run : {cpu::mla_attention_expanded, cpu::mla_attention_absorbed}) {
      std::vector<float> out, lse;
      run(pr.params(out, &lse, use_topk));
      for (const int64_t t : {0, 2}) {
        for (int64_t h = 0; h < 2; ++h) {
          EXPECT_EQ(lse[t * 2 + h], -std::numeric_limits<float>::infinity());
          for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[(t * 2 + h) * 3 + d], 0.0f);
        }
      }
      EXPECT_TRUE(std::isfinite(lse[2])) << "token 1 sees keys 0..1";
    }
  }
  // lse may be null; an empty cache is allowed.
  std::vector<float> out;
  cpu::mla_attention_absorbed(pr.params(out, nullptr, false));
  MlaAttentionParams p = pr.params(out, nullptr, false);
  p.num_keys = 0;
  p.latent = nullptr;
  cpu::mla_attention_expanded(p);
  for (const float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Mla, RefusesInvalidTopkAndShapes) {
  Problem pr(
      {.num_tokens = 2, .num_keys = 3, .num_heads = 1, .dn = 4, .dr = 2, .dv = 3, .kv_lora = 8}, 1,
      12);  // q_pos = {1, 2}
  pr.topk_width = 2;
  std::vector<float> out;
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{2, -1, 0, 1},  // future key
                                          std::vector<int32_t>{0, 1, 3, -1},  // >= num_keys
                                          std::vector<int32_t>{1, 1, 0, -1},  // duplicate
                                          std::vector<int32_t>{-2, 0, 0, 1}}) {
    pr.topk = bad;
    EXPECT_THROW(cpu::mla_attention_absorbed(pr.params(out, nullptr, true)), InvalidArgument);
    EXPECT_THROW(cpu::mla_attention_expanded(pr.params(out, nullptr, true)), InvalidArgument);
  }
  pr.topk = {-1, 1, 2, -1};
  EXPECT_NO_THROW(cpu::mla_attention_absorbed(pr.params(out, nullptr, true)));
  MlaAttentionParams p = pr.params(out, nullptr, false);
  p.dv = 4;  // kv_b has H*(dn+3) rows
  EXPECT_THROW(cpu::mla_attention_expanded(p), InvalidArgument);
  p = pr.params(out, nullptr, false);
  p.kv_b = nullptr;
  EXPECT_THROW(cpu::mla_attention_absorbed(p), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
