// validate(Params) of the attention wing's ops (kernels/attention/*/check.h): per op, one
// bad field refused with InvalidArgument naming the op and the field, by validate and by
// the CPU op (which calls it first), and one call accepted. The CUDA launchers call the
// same validate first (tests/gpu keep their refusal cases).
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention/dsa/check.h"
#include "kernels/attention/dsa/cpu.h"
#include "kernels/attention/indexer/check.h"
#include "kernels/attention/indexer/cpu.h"
#include "kernels/attention/latent/check.h"
#include "kernels/attention/latent/cpu.h"
#include "kernels/attention/merge/check.h"
#include "kernels/attention/merge/cpu.h"
#include "kernels/attention/mla/check.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/attention/topk_merge/check.h"
#include "kernels/attention/topk_merge/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

// fn throws InvalidArgument whose message holds "<op>:" and the field's name.
void expect_refused(const std::function<void()>& fn, const std::string& op,
                    const std::string& field) {
  try {
    fn();
    ADD_FAILURE() << op << " accepted a bad " << field;
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(op + ":"), std::string::npos) << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
  }
}

// Refused by validate and by the CPU op alike.
template <typename Params, typename CpuOp>
void expect_both_refuse(const Params& p, CpuOp cpu_op, const std::string& op,
                        const std::string& field) {
  expect_refused([&] { validate(p); }, op, field);
  expect_refused([&] { cpu_op(p); }, op, field);
}

// --- indexer --------------------------------------------------------------------------

TEST(AttentionValidate, HadamardRotate) {
  std::vector<float> x(8, 1.0f);
  HadamardParams p{.x = x.data(), .rows = 1, .dim = 8};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::hadamard_rotate(p));
  p.dim = 6;
  expect_both_refuse(
      p, [](const HadamardParams& q) { cpu::hadamard_rotate(q); }, "hadamard_rotate", "dim");
  p.dim = 8;
  p.x = nullptr;
  expect_both_refuse(
      p, [](const HadamardParams& q) { cpu::hadamard_rotate(q); }, "hadamard_rotate", "x");
}

TEST(AttentionValidate, QuantizeFp8Ue8m0) {
  std::vector<float> x(4, 1.0f), scales(1);
  std::vector<uint8_t> q(4);
  QuantizeFp8Ue8m0Params p{
      .x = x.data(), .rows = 1, .dim = 4, .q = q.data(), .scales = scales.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::quantize_fp8_ue8m0(p));
  p.dim = 0;
  expect_both_refuse(
      p, [](const QuantizeFp8Ue8m0Params& r) { cpu::quantize_fp8_ue8m0(r); }, "quantize_fp8_ue8m0",
      "dim");
  p.dim = 4;
  p.scales = nullptr;
  expect_both_refuse(
      p, [](const QuantizeFp8Ue8m0Params& r) { cpu::quantize_fp8_ue8m0(r); }, "quantize_fp8_ue8m0",
      "scales");
}

// One query (position 1) over two keys of dimension 4, one head.
struct ScoreBuffers {
  std::vector<float> q = std::vector<float>(4, 0.5f), k = std::vector<float>(8, 0.25f);
  std::vector<float> w = {1.0f}, scores = std::vector<float>(2);
  std::vector<float> k_scales = {1.0f, 1.0f};
  std::vector<uint8_t> k_fp8 = std::vector<uint8_t>(8, 0x38);
  std::vector<int64_t> q_pos = {1};
};

TEST(AttentionValidate, IndexerScores) {
  ScoreBuffers b;
  IndexerScoreParams p{.q = b.q.data(),
                       .k = b.k.data(),
                       .head_weights = b.w.data(),
                       .q_pos = b.q_pos.data(),
                       .scores = b.scores.data(),
                       .num_tokens = 1,
                       .num_keys = 2,
                       .num_heads = 1,
                       .head_dim = 4};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::indexer_scores(p));
  p.fp8 = true;
  p.head_dim = 256;
  expect_both_refuse(
      p, [](const IndexerScoreParams& r) { cpu::indexer_scores(r); }, "indexer_scores", "head_dim");
  p.head_dim = 4;
  p.k = nullptr;
  expect_both_refuse(
      p, [](const IndexerScoreParams& r) { cpu::indexer_scores(r); }, "indexer_scores", "null k");
}

TEST(AttentionValidate, IndexerScoresFp8Cache) {
  ScoreBuffers b;
  IndexerFp8CacheScoreParams p{.q = b.q.data(),
                               .k_fp8 = b.k_fp8.data(),
                               .k_scales = b.k_scales.data(),
                               .head_weights = b.w.data(),
                               .q_pos = b.q_pos.data(),
                               .scores = b.scores.data(),
                               .num_tokens = 1,
                               .num_keys = 2,
                               .num_heads = 1,
                               .head_dim = 4};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::indexer_scores_fp8_cache(p));
  p.k_scales = nullptr;
  expect_both_refuse(
      p, [](const IndexerFp8CacheScoreParams& r) { cpu::indexer_scores_fp8_cache(r); },
      "indexer_scores_fp8_cache", "k_scales");
  p.k_scales = b.k_scales.data();
  p.table_stride = -1;
  expect_both_refuse(
      p, [](const IndexerFp8CacheScoreParams& r) { cpu::indexer_scores_fp8_cache(r); },
      "indexer_scores_fp8_cache", "table_stride");
}

TEST(AttentionValidate, CausalTopk) {
  const std::vector<float> scores = {3.0f, 1.0f, 2.0f};
  const std::vector<int64_t> q_pos = {2};
  std::vector<int32_t> out(2);
  CausalTopkParams p{.scores = scores.data(),
                     .q_pos = q_pos.data(),
                     .num_queries = 1,
                     .num_keys = 3,
                     .topk = 2,
                     .out = out.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::causal_topk(p));
  EXPECT_EQ(out, (std::vector<int32_t>{0, 2}));
  p.topk = 0;
  expect_both_refuse(
      p, [](const CausalTopkParams& r) { cpu::causal_topk(r); }, "causal_topk", "topk");
  p.topk = 2;
  p.out = nullptr;
  expect_both_refuse(
      p, [](const CausalTopkParams& r) { cpu::causal_topk(r); }, "causal_topk", "out");
}

// --- MLA ------------------------------------------------------------------------------

// H = 1, dn = dv = 2, dr = 1, kv_lora = 2: kv_b [4, 2] fp32.
struct MlaBuffers {
  std::vector<float> kv_b_data = std::vector<float>(8, 0.5f);
  Weight kv_b{.rows = 4, .cols = 2, .data = kv_b_data.data()};
  std::vector<float> q = std::vector<float>(3, 1.0f);        // [1, 1, dn + dr]
  std::vector<float> latent = std::vector<float>(6, 0.25f);  // [2, kv_lora + dr]
  std::vector<int64_t> q_pos = {1};
  std::vector<float> out = std::vector<float>(2), lse = std::vector<float>(1);

  MlaAttentionParams params() {
    return {.q = q.data(),
            .latent = latent.data(),
            .kv_b = &kv_b,
            .q_pos = q_pos.data(),
            .out = out.data(),
            .lse = lse.data(),
            .num_tokens = 1,
            .num_keys = 2,
            .num_heads = 1,
            .dn = 2,
            .dr = 1,
            .dv = 2,
            .kv_lora = 2,
            .softmax_scale = 0.5f};
  }
};

TEST(AttentionValidate, MlaAttention) {
  MlaBuffers b;
  MlaAttentionOpParams p{.attn = b.params(), .absorbed = true};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::mla_attention(p));
  p.absorbed = false;
  EXPECT_NO_THROW(cpu::mla_attention(p));
  p.attn.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_both_refuse(
      p, [](const MlaAttentionOpParams& r) { cpu::mla_attention(r); }, "mla_attention",
      "softmax_scale");
  p.attn = b.params();
  p.attn.latent_bf16 = reinterpret_cast<const uint16_t*>(b.latent.data());
  expect_both_refuse(
      p, [](const MlaAttentionOpParams& r) { cpu::mla_attention(r); }, "mla_attention",
      "latent_bf16");
  // Only the expanded form refuses per-query block tables.
  p.attn = b.params();
  p.attn.table_stride = 4;
  expect_both_refuse(
      p, [](const MlaAttentionOpParams& r) { cpu::mla_attention(r); }, "mla_attention",
      "table_stride");
  p.absorbed = true;
  EXPECT_NO_THROW(validate(p));
}

// --- DCP merge and combine ------------------------------------------------------------

TEST(AttentionValidate, AttentionMerge) {
  const std::vector<float> parts = {1.0f, 2.0f, 3.0f, 4.0f}, lses = {0.0f, 0.0f};
  std::vector<float> out(2), lse(1);
  AttentionMergeParams p{.parts = parts.data(),
                         .lses = lses.data(),
                         .num_parts = 2,
                         .rows = 1,
                         .width = 2,
                         .out = out.data(),
                         .lse = lse.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::attention_merge(p));
  EXPECT_EQ(out, (std::vector<float>{2.0f, 3.0f}));
  p.num_parts = 0;
  expect_both_refuse(
      p, [](const AttentionMergeParams& r) { cpu::attention_merge(r); }, "attention_merge",
      "num_parts");
  p.num_parts = 2;
  p.lses = nullptr;
  expect_both_refuse(
      p, [](const AttentionMergeParams& r) { cpu::attention_merge(r); }, "attention_merge", "lses");
}

TEST(AttentionValidate, TopkMergeSteps) {
  // One row, k = 2 of 3 local keys, one rank: pack, then decide from its own message.
  const std::vector<float> scores = {1.0f, 3.0f, 2.0f};
  std::vector<int32_t> selected = {1, 2};
  std::vector<uint64_t> sorted(2);
  std::vector<uint32_t> send(3);
  std::vector<int32_t> take(1);
  int32_t num_undecided = -1;
  TopkMergeParams p{.scores = scores.data(),
                    .num_keys = 3,
                    .selected = selected.data(),
                    .rows = 1,
                    .k = 2,
                    .candidates = 2,
                    .sorted = sorted.data(),
                    .send = send.data(),
                    .gathered = send.data(),
                    .take = take.data(),
                    .num_undecided = &num_undecided};
  for (const TopkMergeStep step : {TopkMergeStep::kPack, TopkMergeStep::kDecide,
                                   TopkMergeStep::kResendPack, TopkMergeStep::kResendDecide}) {
    EXPECT_NO_THROW(validate(p, step));
  }
  EXPECT_NO_THROW(cpu::topk_merge_pack(p));
  EXPECT_NO_THROW(cpu::topk_merge_decide(p));
  EXPECT_EQ(num_undecided, 0);
  EXPECT_EQ(selected, (std::vector<int32_t>{1, 2}));

  TopkMergeParams bad = p;
  bad.k = 0;
  expect_refused([&] { cpu::topk_merge_pack(bad); }, "topk_merge_pack", "k 0");
  bad = p;
  bad.num_undecided = nullptr;
  expect_refused([&] { cpu::topk_merge_decide(bad); }, "topk_merge_decide", "num_undecided");
  bad = p;
  bad.num_resend = 2;  // more than the rows
  expect_refused([&] { cpu::topk_merge_resend_pack(bad); }, "topk_merge_resend_pack", "num_resend");
  bad = p;
  bad.num_resend = 1;  // gathered2 needed
  expect_refused([&] { cpu::topk_merge_resend_decide(bad); }, "topk_merge_resend_decide",
                 "gathered2");
  bad = p;
  bad.rank = 1;
  expect_refused([&] { validate(bad, TopkMergeStep::kDecide); }, "topk_merge_decide", "rank");
}

// --- FP8 latent -----------------------------------------------------------------------

TEST(AttentionValidate, QuantizeE4m3) {
  const std::vector<float> x = {1.0f, -2.0f};
  std::vector<uint8_t> codes(2);
  QuantizeE4m3Params p{.x = x.data(), .n = 2, .inv_scale = 1.0f, .codes = codes.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::quantize_e4m3(p));
  p.inv_scale = 0.0f;
  expect_both_refuse(
      p, [](const QuantizeE4m3Params& r) { cpu::quantize_e4m3(r); }, "quantize_e4m3", "inv_scale");
}

TEST(AttentionValidate, RoundBf16) {
  const std::vector<float> x = {1.0f, -2.0f};
  std::vector<uint16_t> out(2);
  RoundBf16Params p{.x = x.data(), .n = 2, .out = out.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::round_bf16(p));
  p.out = nullptr;
  expect_both_refuse(
      p, [](const RoundBf16Params& r) { cpu::round_bf16(r); }, "round_bf16", "out");
}

TEST(AttentionValidate, MlaAbsorbQ) {
  MlaBuffers b;
  std::vector<float> q_lat(2), q_pe(1);
  MlaAbsorbParams p{.q = b.q.data(),
                    .kv_b = &b.kv_b,
                    .q_lat = q_lat.data(),
                    .q_pe = q_pe.data(),
                    .num_tokens = 1,
                    .num_heads = 1,
                    .dn = 2,
                    .dr = 1,
                    .dv = 2,
                    .kv_lora = 2};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::mla_absorb_q(p));
  p.dv = 3;  // kv_b has H*(dn+2) rows
  expect_both_refuse(
      p, [](const MlaAbsorbParams& r) { cpu::mla_absorb_q(r); }, "mla_absorb_q", "kv_b");
  p.dv = 2;
  Weight bad_format = b.kv_b;
  bad_format.dtype = DType::kE4M3;  // not a dense dtype
  p.kv_b = &bad_format;
  expect_both_refuse(
      p, [](const MlaAbsorbParams& r) { cpu::mla_absorb_q(r); }, "mla_absorb_q", "kv_b");
}

TEST(AttentionValidate, MlaProjectUv) {
  MlaBuffers b;
  const std::vector<float> o_lat = {1.0f, 2.0f};
  std::vector<float> out(2);
  MlaProjectParams p{.o_lat = o_lat.data(),
                     .kv_b = &b.kv_b,
                     .out = out.data(),
                     .num_tokens = 1,
                     .num_heads = 1,
                     .dn = 2,
                     .dv = 2,
                     .kv_lora = 2};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::mla_project_uv(p));
  p.out = nullptr;
  expect_both_refuse(
      p, [](const MlaProjectParams& r) { cpu::mla_project_uv(r); }, "mla_project_uv", "out");
}

TEST(AttentionValidate, DsaQuerySlots) {
  const std::vector<int32_t> positions = {0, 1}, table = {3};
  const std::vector<int64_t> q_pos = {1};
  std::vector<int32_t> slots(2), seq_lens(1);
  DsaQuerySlotsParams p{.positions = positions.data(),
                        .q_pos = q_pos.data(),
                        .block_table = table.data(),
                        .block_size = 4,
                        .num_tokens = 1,
                        .topk = 2,
                        .slots = slots.data(),
                        .seq_lens = seq_lens.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::dsa_query_slots(p));
  EXPECT_EQ(slots, (std::vector<int32_t>{12, 13}));
  p.block_size = 0;
  expect_both_refuse(
      p, [](const DsaQuerySlotsParams& r) { cpu::dsa_query_slots(r); }, "dsa_query_slots",
      "block_size");
}

// --- DSA decode over the packed cache -------------------------------------------------

// A valid one-block cache (block_size 64): the latent page, then the index page.
DsaCache dsa_cache(const uint8_t* pool) {
  return {.pool = pool,
          .row_bytes = 64 * kDsaLatentDim + 64 * kDsaIndexKeyBytes,
          .latent_offset = 0,
          .index_offset = 64 * kDsaLatentDim,
          .num_blocks = 1,
          .block_size = 64,
          .latent_scale = 1.0f};
}

TEST(AttentionValidate, DsaMlaDecode) {
  std::vector<uint8_t> pool(64 * (kDsaLatentDim + kDsaIndexKeyBytes));
  const std::vector<int32_t> table = {0}, seq_lens = {1};
  std::vector<float> q_lat(kDsaLoraDim, 0.1f), q_pe(kDsaRopeDim, 0.1f), o_lat(kDsaLoraDim), lse(1);
  DsaMlaParams p{.cache = dsa_cache(pool.data()),
                 .batch = {.block_tables = table.data(),
                           .seq_lens = seq_lens.data(),
                           .num_requests = 1,
                           .max_blocks = 1,
                           .num_q = 1,
                           .max_context = 1},
                 .q_lat = q_lat.data(),
                 .q_pe = q_pe.data(),
                 .num_heads = 1,
                 .softmax_scale = 0.5f,
                 .o_lat = o_lat.data(),
                 .lse = lse.data()};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(validate_sizes(p));
  EXPECT_NO_THROW(cpu::dsa_mla_decode(p));
  EXPECT_EQ(lse[0], std::log(1.0f));  // one key: its logit is 0 (zero codes)
  DsaMlaParams bad = p;
  bad.softmax_scale = 0.0f;
  expect_both_refuse(
      bad, [](const DsaMlaParams& r) { cpu::dsa_mla_decode(r); }, "dsa_mla_decode",
      "softmax_scale");
  bad = p;
  bad.cache.row_bytes = 1000;
  expect_both_refuse(
      bad, [](const DsaMlaParams& r) { cpu::dsa_mla_decode(r); }, "dsa_mla_decode", "row_bytes");
  bad = p;
  bad.batch.num_q = 9;
  expect_both_refuse(
      bad, [](const DsaMlaParams& r) { cpu::dsa_mla_decode(r); }, "dsa_mla_decode", "num_q");
  // Sizes only (workspace planning): no buffer needed.
  bad = p;
  bad.batch.block_tables = nullptr;
  EXPECT_NO_THROW(validate_sizes(bad));
  expect_refused([&] { validate(bad); }, "dsa_mla_decode", "block_tables");
}

TEST(AttentionValidate, DsaDecode) {
  DsaDecodeParams p{.cache = {},
                    .batch = {.num_requests = 0, .num_q = 1},
                    .index_num_heads = 16,
                    .topk = 4,
                    .num_heads = 1,
                    .softmax_scale = 0.5f};
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(cpu::dsa_decode(p));
  p.topk = 0;
  expect_both_refuse(
      p, [](const DsaDecodeParams& r) { cpu::dsa_decode(r); }, "dsa_decode", "topk");
  p.topk = 4;
  p.batch.num_requests = 1;
  p.batch.max_blocks = 1;
  const std::vector<int32_t> table = {0}, seq_lens = {1};
  p.batch.block_tables = table.data();
  p.batch.seq_lens = seq_lens.data();
  p.batch.max_context = 1;
  expect_both_refuse(
      p, [](const DsaDecodeParams& r) { cpu::dsa_decode(r); }, "dsa_decode", "pool");
}

}  // namespace
}  // namespace hyserve
