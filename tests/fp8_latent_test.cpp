// The FP8 MLA latent (ModelOptions::latent_cache = kFp8, MODEL.md §6): its helper ops
// against plain loops, the cache layout the DSA kernels read, and the model on it: close
// to the fp32 latent, prefill-then-decode equal to one long prefill, a prefix hit equal to
// a miss, and decode batches on the DSA decode step equal to the generic indexer path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "dsa_model_util.h"
#include "kernels/attention/latent/cpu.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "paged_test_util.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using test::dsa_config;
using test::random_prompt;
using test::same_bits;

std::vector<float> slice(const std::vector<float>& v, size_t begin, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(begin),
          v.begin() + static_cast<std::ptrdiff_t>(begin + n)};
}

TEST(Fp8Latent, QuantizeRoundsToNearestEvenAndSaturates) {
  // Ties (1 + 1/16 between 1 and 1.125 -> 1; 1 + 3/16 -> 1.25), saturation, signed zero,
  // the subnormal grid (2^-10 is half of the smallest step: ties to 0), NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {1.0625f,  1.1875f,   448.0f,  464.0f, -1e6f, 0.0f,  -0.0f,
                                0x1p-10f, 0x1.8p-9f, 3.0e-3f, -17.3f, nan,   1e-30f};
  const std::vector<uint8_t> want = {0x38, 0x3a, 0x7e, 0x7e, 0xfe, 0x00, 0x80,
                                     0x00, 0x02, 0x00, 0x00, 0x7f, 0x00};
  for (const float inv_scale : {1.0f, 0.25f}) {
    std::vector<uint8_t> codes(x.size());
    cpu::quantize_e4m3({x.data(), static_cast<int64_t>(x.size()), inv_scale, codes.data()});
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(codes[i], f32_to_e4m3(x[i] * inv_scale)) << "x " << x[i] << " / " << inv_scale;
      if (inv_scale == 1.0f && i != 9 && i != 10) {
        EXPECT_EQ(codes[i], want[i]) << "x " << x[i];
      }
    }
  }
  // The two values without a hand-written code: the nearest grid point, exactly.
  std::vector<uint8_t> c(2);
  cpu::quantize_e4m3({&x[9], 2, 1.0f, c.data()});
  EXPECT_EQ(e4m3_to_f32(c[0]), 0x1p-8f);  // 3e-3 = 1.536 * 2^-9, on the 2^-9 subnormal grid
  EXPECT_EQ(e4m3_to_f32(c[1]), -18.0f);   // -17.3 on the step-2 grid of [16, 32)
}

// Weight of [rows, cols] fp32 values (dense).
Weight dense_weight(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Weight w;
  w.data = v.data();
  w.rows = rows;
  w.cols = cols;
  w.format = WeightFormat::kDense;
  w.dtype = DType::kF32;
  return w;
}

TEST(Fp8Latent, AbsorbAndProjectEqualPlainLoops) {
  for (const int64_t t_n : {0, 1, 3}) {
    const int64_t h_n = 3, dn = 5, dr = 3, dv = 7, kv = 65;
    const std::vector<float> kv_b = test::random_normal(h_n * (dn + dv) * kv, 1);
    const Weight w = dense_weight(kv_b, h_n * (dn + dv), kv);
    const std::vector<float> q = test::random_normal(t_n * h_n * (dn + dr) + 1, 2);
    std::vector<float> q_lat(t_n * h_n * kv + 1), q_pe(t_n * h_n * dr + 1);
    cpu::mla_absorb_q({q.data(), &w, q_lat.data(), q_pe.data(), t_n, h_n, dn, dr, dv, kv});
    const std::vector<float> o_lat = test::random_normal(t_n * h_n * kv + 1, 3);
    std::vector<float> out(t_n * h_n * dv + 1);
    cpu::mla_project_uv({o_lat.data(), &w, out.data(), t_n, h_n, dn, dv, kv});
    // fp32 sums of <= 65 products of N(0,1) values: within 1e-5 of the double sum
    // relative to the sum of magnitudes.
    for (int64_t t = 0; t < t_n; ++t) {
      for (int64_t h = 0; h < h_n; ++h) {
        const float* qq = &q[(t * h_n + h) * (dn + dr)];
        for (int64_t l = 0; l < kv; ++l) {
          double want = 0, mag = 0;
          for (int64_t d = 0; d < dn; ++d) {
            const double p = double{qq[d]} * kv_b[(h * (dn + dv) + d) * kv + l];
            want += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(q_lat[(t * h_n + h) * kv + l], want, 1e-5 * mag + 1e-30)
              << "q_lat t " << t << " h " << h << " l " << l;
        }
        for (int64_t i = 0; i < dr; ++i) EXPECT_EQ(q_pe[(t * h_n + h) * dr + i], qq[dn + i]);
        for (int64_t j = 0; j < dv; ++j) {
          double want = 0, mag = 0;
          for (int64_t l = 0; l < kv; ++l) {
            const double p =
                double{kv_b[(h * (dn + dv) + dn + j) * kv + l]} * o_lat[(t * h_n + h) * kv + l];
            want += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(out[(t * h_n + h) * dv + j], want, 1e-5 * mag + 1e-30)
              << "out t " << t << " h " << h << " j " << j;
        }
      }
    }
  }
}

TEST(Fp8Latent, QuerySlotsFollowTheBlockTable) {
  const int64_t bs = 4, k = 3;
  const std::vector<int32_t> table = {7, 2, 5};  // positions 0-3 in block 7, 4-7 in 2, ...
  const std::vector<int32_t> positions = {0, -1, -1, 1, 4, 9, 3, 6, -1};
  const std::vector<int64_t> q_pos = {0, 9, 6};
  std::vector<int32_t> slots(9), seq_lens(3);
  cpu::dsa_query_slots(
      {positions.data(), q_pos.data(), table.data(), 0, bs, 3, k, slots.data(), seq_lens.data()});
  EXPECT_EQ(slots, (std::vector<int32_t>{28, -1, -1, 29, 8, 21, 31, 10, -1}));
  EXPECT_EQ(seq_lens, (std::vector<int32_t>{1, 10, 7}));
  // Per-query tables (a decode batch): query t reads row t.
  const std::vector<int32_t> rows = {1, 0, 3, 0, 6, 4};
  const std::vector<int32_t> one = {0, 5, -1, 2, 1, 0};
  const std::vector<int64_t> pos2 = {6, 5};
  std::vector<int32_t> s2(6), l2(2);
  cpu::dsa_query_slots({one.data(), pos2.data(), rows.data(), 2, bs, 2, k, s2.data(), l2.data()});
  EXPECT_EQ(s2, (std::vector<int32_t>{4, 1, -1, 14, 13, 12}));
  // A position the query cannot see is refused.
  const std::vector<int32_t> bad = {2, -1, -1};
  EXPECT_THROW(cpu::dsa_query_slots({bad.data(), q_pos.data(), table.data(), 0, bs, 1, k,
                                     slots.data(), seq_lens.data()}),
               InvalidArgument);
}

TEST(Fp8Latent, CachePlanLays576BytePagesOnTheDsaAlignment) {
  const ModelConfig c = dsa_config("models/tiny-kimi-k3");
  const auto model = test::make_dsa_model(c, LatentCacheDtype::kFp8);
  const CachePlan plan = model->cache_plan();
  EXPECT_EQ(plan.options.latent, LatentCacheDtype::kFp8);
  EXPECT_EQ(plan.row_bytes % 256, 0);
  ASSERT_EQ(static_cast<int64_t>(plan.pages.size()), c.num_mla_layers());
  for (const CachePage& p : plan.pages) {
    EXPECT_EQ(p.latent_bytes, plan.block_size * kDsaLatentDim);
    EXPECT_EQ(p.latent_offset % 256, 0);
    EXPECT_EQ(p.index_offset % 256, 0);
    EXPECT_EQ(p.index_bytes, plan.block_size * kDsaIndexKeyBytes);
  }
}

TEST(Fp8Latent, RefusesModelsTheDsaKernelsCannotRead) {
  auto expect_refusal = [](const ModelConfig& c, const std::string& what) {
    try {
      test::make_dsa_model(c, LatentCacheDtype::kFp8);
      ADD_FAILURE() << "no error for " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype fp8"), std::string::npos) << e.what();
    }
  };
  // No indexer.
  expect_refusal(
      ModelConfig::load(fs::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/kimi_linear_tiny"),
      "kimi_linear");
  // A latent other than 512 + 64 wide.
  expect_refusal(ModelConfig::load(fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3"),
                 "kv_lora_rank 32");
}

class Fp8LatentModel : public testing::TestWithParam<const char*> {};

// Logits of every position of a 24-token prompt (context up to 3x the top-k).
std::vector<float> prompt_logits(const Model& m, const std::vector<int32_t>& prompt) {
  SequenceState s = m.new_sequence();
  std::vector<float> l;
  m.forward(prompt, s, l, /*all_positions=*/true);
  return l;
}

// The first full-attention layer sees the same input in both models, so its attention
// output differs only by the latent's rounding: each cached value within 2^-4 of its
// magnitude (3 mantissa bits, round to nearest; the normalized latents sit in e4m3's
// normal range), i.e. a relative error uniform in +-2^-4 with RMS 2^-4/sqrt(3) = 3.6%.
// The output is a softmax average of those values (averaging shrinks the error) with
// logits perturbed by the same relative amount (grows it a little): bound the relative
// RMS difference by 2^-4, and it must not be 0 (the FP8 path ran). Later layers are not
// compared: a random tiny model's discrete choices (MoE experts, the indexer's top-k)
// flip under any perturbation and amplify it.
void first_attention_close_to_fp32(const char* model, LatentCacheDtype latent, double bound);

// The bf16 latent the same way: 8 significant bits, so within 2^-8 (relative RMS), not 0.
TEST_P(Fp8LatentModel, FirstAttentionCloseToTheFp32Latent) {
  for (const LatentCacheDtype latent : {LatentCacheDtype::kFp8, LatentCacheDtype::kBf16}) {
    first_attention_close_to_fp32(GetParam(), latent,
                                  latent == LatentCacheDtype::kFp8 ? 0x1p-4 : 0x1p-8);
  }
}

void first_attention_close_to_fp32(const char* model, LatentCacheDtype latent, double bound) {
  SCOPED_TRACE(latent_cache_dtype_name(latent));
  const ModelConfig c = dsa_config(model);
  int64_t first = 0;
  while (c.is_kda(first)) ++first;
  const std::string name = "layers." + std::to_string(first) + ".attn";
  std::vector<float> attn[2], logits[2];
  for (int v = 0; v < 2; ++v) {
    const auto m = test::make_dsa_model(c, v == 0 ? latent : LatentCacheDtype::kFp32);
    m->set_dump([&](std::string_view n, const float* data, int64_t rows, int64_t cols) {
      if (n == name) attn[v].assign(data, data + rows * cols);
    });
    logits[v] = prompt_logits(*m, random_prompt(24, 5, c.vocab_size));
  }
  ASSERT_FALSE(attn[0].empty());
  ASSERT_EQ(attn[0].size(), attn[1].size());
  double diff2 = 0, ref2 = 0, worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < attn[0].size(); ++i) {
    const double d = std::fabs(double{attn[0][i]} - attn[1][i]);
    diff2 += d * d;
    ref2 += double{attn[1][i]} * attn[1][i];
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  const double rel_rms = std::sqrt(diff2 / ref2);
  EXPECT_GT(rel_rms, 0.0);
  EXPECT_LT(rel_rms, bound) << name << ": worst element " << worst_at << ": " << attn[0][worst_at]
                            << " vs " << attn[1][worst_at];
  for (const float v : logits[0]) ASSERT_TRUE(std::isfinite(v));
}

// A prefill of n tokens then decode steps == one prefill of all of them: both run every
// query through the same ops over the same FP8 rows (the absorbed form on the DSA sparse
// kernel; the decode steps on the DSA decode step, whose scores equal the generic
// scorer's bitwise). Bitwise without KDA layers; kimi_k3's KDA layers run chunked in the
// long prefill and recurrent in decode (fp32 rounding differences, which can also move
// a latent across an e4m3 rounding boundary): 1e-2 of the largest logit there.
TEST_P(Fp8LatentModel, PrefillThenDecodeEqualsOneLongPrefill) {
  const ModelConfig c = dsa_config(GetParam());
  for (const bool dsa_ops : {true, false}) {
    const auto m =
        test::make_dsa_model(c, LatentCacheDtype::kFp8, nullptr,
                             dsa_ops ? AttentionBackend::kDsaFp8Fused : AttentionBackend::kDsaFp8);
    const std::vector<int32_t> tokens = random_prompt(22, 6, c.vocab_size);
    const std::vector<float> all = prompt_logits(*m, tokens);
    SequenceState s = m->new_sequence();
    std::vector<float> l;
    const size_t prefill = 10, vocab = static_cast<size_t>(c.vocab_size);
    m->forward(std::span<const int32_t>(tokens.data(), prefill), s, l);
    for (size_t i = prefill; i <= tokens.size(); ++i) {
      const std::vector<float> want = slice(all, (i - 1) * vocab, vocab);
      if (c.num_kda_layers() == 0) {
        EXPECT_TRUE(same_bits(l, want)) << "position " << i - 1 << " dsa_ops " << dsa_ops;
      } else {
        float peak = 0, worst = 0;
        for (size_t j = 0; j < vocab; ++j) {
          peak = std::max(peak, std::fabs(want[j]));
          worst = std::max(worst, std::fabs(l[j] - want[j]));
        }
        EXPECT_LE(worst, 1e-2f * peak) << "position " << i - 1 << " dsa_ops " << dsa_ops;
      }
      if (i < tokens.size()) m->forward(std::span<const int32_t>(&tokens[i], 1), s, l);
    }
  }
}

void prefix_hit_equals_miss(const char* model, LatentCacheDtype latent);

// Two sequences in one cache share the first two blocks of a prompt (FP8 and bf16
// latents): the second reads their latents and index keys (and the KDA state snapshot at their end)
// and runs only its suffix. Its logits equal those of the whole prompt run without the shared
// blocks, bitwise (block boundaries are KDA chunk boundaries).
TEST_P(Fp8LatentModel, PrefixHitEqualsMissBitwise) {
  for (const LatentCacheDtype latent : {LatentCacheDtype::kFp8, LatentCacheDtype::kBf16}) {
    prefix_hit_equals_miss(GetParam(), latent);
  }
}

void prefix_hit_equals_miss(const char* model, LatentCacheDtype latent) {
  SCOPED_TRACE(latent_cache_dtype_name(latent));
  const ModelConfig c = dsa_config(model);
  const auto m = test::make_dsa_model(c, latent);
  Workspace ws(&m->backend());
  const CachePlan plan = m->cache_plan();
  const int64_t bs = plan.block_size;
  const bool kda = plan.kda_state_rows > 0;
  auto cache = m->new_cache(16);
  const std::vector<int32_t> prefix = random_prompt(2 * bs, 7, c.vocab_size);
  const std::vector<int32_t> suffix_a = random_prompt(5, 8, c.vocab_size);
  const std::vector<int32_t> suffix_b = random_prompt(9, 9, c.vocab_size);
  std::vector<int32_t> whole_b = prefix;
  whole_b.insert(whole_b.end(), suffix_b.begin(), suffix_b.end());
  auto run = [&](std::span<const int32_t> blocks, int32_t state, int64_t num_computed,
                 std::span<const int32_t> tokens) {
    std::vector<float> l;
    const SequenceInput in{cache.get(), blocks, kda ? state : -1, num_computed, tokens, true};
    m->forward(std::span<const SequenceInput>(&in, 1), l, ws);
    return l;
  };
  // Miss: the whole prompt of B in blocks 0-2 (state row 12).
  if (kda) cache->zero_block(12);
  const std::vector<int32_t> miss_blocks = {0, 1, 2};
  const std::vector<float> miss = run(miss_blocks, 12, 0, whole_b);
  // A: the prefix in blocks 4, 5 (state row 13), snapshot to row 14, then its suffix.
  if (kda) cache->zero_block(13);
  const std::vector<int32_t> a_blocks = {4, 5, 6};
  run(std::span<const int32_t>(a_blocks.data(), 2), 13, 0, prefix);
  if (kda) cache->copy_block(14, 13);
  run(a_blocks, 13, 2 * bs, suffix_a);
  // Hit: B reads blocks 4, 5 and the snapshot, and runs its suffix in block 7.
  if (kda) cache->copy_block(15, 14);
  const std::vector<int32_t> hit_blocks = {4, 5, 7};
  const std::vector<float> hit = run(hit_blocks, 15, 2 * bs, suffix_b);
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  EXPECT_TRUE(same_bits(hit, slice(miss, prefix.size() * vocab, suffix_b.size() * vocab)));
}

// Decode batches (three sequences in one cache, one token each) on the DSA decode step
// give the same tokens as on the generic chunked indexer path, and the same logits
// bitwise: the FP8 scores are the same products summed in the same order, the top-k keeps
// the same set in the same (ascending) order, and the sparse MLA is the same op.
TEST_P(Fp8LatentModel, DsaDecodeOpsEqualTheGenericPath) {
  const ModelConfig c = dsa_config(GetParam());
  std::vector<std::vector<int32_t>> outputs[2];
  std::vector<std::vector<float>> logits[2];
  for (int variant = 0; variant < 2; ++variant) {
    const auto m = test::make_dsa_model(
        c, LatentCacheDtype::kFp8, nullptr,
        variant == 0 ? AttentionBackend::kDsaFp8Fused : AttentionBackend::kDsaFp8);
    ASSERT_EQ(m->attention().backend,
              variant == 0 ? AttentionBackend::kDsaFp8Fused : AttentionBackend::kDsaFp8);
    Workspace ws(&m->backend());
    const CachePlan plan = m->cache_plan();
    const bool kda = plan.kda_state_rows > 0;
    auto cache = m->new_cache(12);
    constexpr int kSeqs = 3;
    std::vector<std::vector<int32_t>> blocks(kSeqs), seqs(kSeqs);
    std::vector<int64_t> done(kSeqs, 0);
    std::vector<int32_t> next(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      blocks[i] = {static_cast<int32_t>(3 * i), static_cast<int32_t>(3 * i + 1)};
      if (kda) cache->zero_block(9 + i);
      seqs[i] = random_prompt(6 + 5 * i, 20 + static_cast<uint32_t>(i), c.vocab_size);
      std::vector<float> l;
      const SequenceInput in{cache.get(), blocks[i], kda ? 9 + i : -1, 0, seqs[i], false};
      m->forward(std::span<const SequenceInput>(&in, 1), l, ws);
      done[i] = static_cast<int64_t>(seqs[i].size());
      next[i] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    }
    for (int step = 0; step < 14; ++step) {
      std::vector<SequenceInput> batch;
      for (int i = 0; i < kSeqs; ++i) {
        batch.push_back({cache.get(), blocks[i], kda ? 9 + i : -1, done[i],
                         std::span<const int32_t>(&next[i], 1), false});
      }
      std::vector<float> l;
      m->forward(batch, l, ws);
      logits[variant].push_back(l);
      std::vector<int32_t> out;
      for (int i = 0; i < kSeqs; ++i) {
        ++done[i];
        const auto row = l.begin() + i * c.vocab_size;
        next[i] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
        out.push_back(next[i]);
      }
      outputs[variant].push_back(out);
    }
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  for (size_t s = 0; s < logits[0].size(); ++s) {
    EXPECT_TRUE(same_bits(logits[0][s], logits[1][s])) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Fp8LatentModel,
                         testing::Values("models/tiny-kimi-k3",
                                         "tests/fixtures/deepseek_v32_tiny"));

}  // namespace
}  // namespace hyserve
