// CPU reference of DSA decode over the packed cache (kernels/attention/dsa/cpu.h): sparse MLA over
// a top-k that holds every visible key equals dense MLA bitwise; the top-k tie rule
// (higher score, then lower position); short, empty and all-masked rows; indexer scores
// against the formula of MODEL.md §3.6 computed independently.
#include "kernels/attention/dsa/cpu.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "dsa_test_pool.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::DsaTestPool;
using test::make_dsa_test_pool;

struct MlaOut {
  std::vector<float> o_lat, lse;
};

MlaOut run_mla(const DsaTestPool& t, const int32_t* slots, int64_t topk_width) {
  const int64_t rows = t.num_requests() * t.num_q * t.heads;
  MlaOut out{std::vector<float>(rows * kDsaLoraDim, 7.0f), std::vector<float>(rows, 7.0f)};
  cpu::dsa_mla_decode({.cache = t.cache_at(t.pool.data()),
                       .batch = t.host_batch(),
                       .q_lat = t.q_lat.data(),
                       .q_pe = t.q_pe.data(),
                       .slots = slots,
                       .topk_width = topk_width,
                       .num_heads = t.heads,
                       .softmax_scale = 0.5f,
                       .o_lat = out.o_lat.data(),
                       .lse = out.lse.data()});
  return out;
}

std::vector<int32_t> run_topk(const DsaTestPool& t, const std::vector<float>& scores,
                              int64_t stride, int64_t topk, std::vector<int32_t>* positions) {
  std::vector<int32_t> slots(t.num_requests() * t.num_q * topk, 12345);
  if (positions != nullptr) positions->assign(slots.size(), 12345);
  cpu::dsa_topk({.batch = t.host_batch(),
                 .block_size = static_cast<int32_t>(t.block_size),
                 .scores = scores.data(),
                 .score_stride = stride,
                 .topk = topk,
                 .slots = slots.data(),
                 .positions = positions != nullptr ? positions->data() : nullptr});
  return slots;
}

TEST(DsaCpu, SparseOverEveryVisibleKeyEqualsDenseBitwise) {
  for (const int64_t block_size : {64, 128}) {
    for (const int64_t num_q : {1, 3}) {
      DsaTestPool t = make_dsa_test_pool({1, 3, 65, 130, 2}, block_size, num_q, 4, 16, 11);
      // Scores: anything; topk >= every length keeps every visible key.
      const int64_t stride = t.max_context;
      std::vector<float> scores(t.num_requests() * num_q * stride, 1.0f);
      const int64_t topk = 200;
      const std::vector<int32_t> slots = run_topk(t, scores, stride, topk, nullptr);
      const MlaOut sparse = run_mla(t, slots.data(), topk);
      const MlaOut dense = run_mla(t, nullptr, 0);
      EXPECT_EQ(0, std::memcmp(sparse.o_lat.data(), dense.o_lat.data(), sparse.o_lat.size() * 4))
          << "block_size " << block_size << ", num_q " << num_q;
      EXPECT_EQ(0, std::memcmp(sparse.lse.data(), dense.lse.data(), sparse.lse.size() * 4));
      // Request 0 with n_q = 3 has no key for its first two queries.
      if (num_q == 3) {
        EXPECT_EQ(dense.lse[0], -std::numeric_limits<float>::infinity());
        EXPECT_EQ(dense.o_lat[0], 0.0f);
      }
    }
  }
}

TEST(DsaCpu, WholeStepWithTopkOverContextEqualsDense) {
  DsaTestPool t = make_dsa_test_pool({5, 64, 100}, 64, 2, 8, 32, 12);
  const int64_t rows = t.num_requests() * t.num_q * t.heads;
  std::vector<float> o(rows * kDsaLoraDim), lse(rows);
  cpu::dsa_decode({.cache = t.cache_at(t.pool.data()),
                   .batch = t.host_batch(),
                   .index_q8 = t.q8.data(),
                   .index_weights = t.weights.data(),
                   .index_num_heads = t.index_heads,
                   .topk = 128,
                   .q_lat = t.q_lat.data(),
                   .q_pe = t.q_pe.data(),
                   .num_heads = t.heads,
                   .softmax_scale = 0.5f,
                   .o_lat = o.data(),
                   .lse = lse.data()});
  const MlaOut dense = run_mla(t, nullptr, 0);
  EXPECT_EQ(0, std::memcmp(o.data(), dense.o_lat.data(), o.size() * 4));
  EXPECT_EQ(0, std::memcmp(lse.data(), dense.lse.data(), lse.size() * 4));
}

TEST(DsaCpu, TopkTieRuleLowerPositionWinsAndPadding) {
  DsaTestPool t = make_dsa_test_pool({10, 2, 0}, 64, 1, 4, 16, 13);
  const int64_t stride = t.max_context;
  std::vector<float> scores(3 * stride, -1.0f);
  // Request 0: positions 2, 5, 7 tie at 3.0 (above the rest), 0 and 9 tie at 1.0, -0/+0.
  float* s = scores.data();
  s[0] = 1.0f, s[1] = 0.0f, s[2] = 3.0f, s[3] = -0.0f, s[4] = -5.0f;
  s[5] = 3.0f, s[6] = 0.0f, s[7] = 3.0f, s[8] = -std::numeric_limits<float>::infinity();
  s[9] = 1.0f;
  std::vector<int32_t> pos;
  const std::vector<int32_t> slots = run_topk(t, scores, stride, 4, &pos);
  // Three 3.0s, then the 1.0 at position 0 beats the one at 9; ascending order.
  EXPECT_EQ((std::vector<int32_t>{0, 2, 5, 7}), std::vector<int32_t>(pos.begin(), pos.begin() + 4));
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(slots[j], t.block_tables[0] * 64 + pos[j]) << j;
  }
  // top-6: the zeros at 1 (+0), 3 (-0) and 6 (+0) tie for the last place; 1 wins. top-7: 1, 3.
  const std::vector<int32_t> slots6 = run_topk(t, scores, stride, 6, &pos);
  EXPECT_EQ((std::vector<int32_t>{0, 1, 2, 5, 7, 9}),
            std::vector<int32_t>(pos.begin(), pos.begin() + 6));
  const std::vector<int32_t> slots7 = run_topk(t, scores, stride, 7, &pos);
  EXPECT_EQ((std::vector<int32_t>{0, 1, 2, 3, 5, 7, 9}),
            std::vector<int32_t>(pos.begin(), pos.begin() + 7));
  // Request 1: 2 keys, top-7 -> both then -1; request 2: no key at all.
  EXPECT_EQ((std::vector<int32_t>{0, 1, -1, -1, -1, -1, -1}),
            std::vector<int32_t>(pos.begin() + 7, pos.begin() + 14));
  EXPECT_EQ(slots7[7 + 2], -1);
  EXPECT_EQ((std::vector<int32_t>(7, -1)), std::vector<int32_t>(pos.begin() + 14, pos.end()));
}

TEST(DsaCpu, TopkRefusesVisibleNan) {
  DsaTestPool t = make_dsa_test_pool({4}, 64, 1, 4, 16, 14);
  std::vector<float> scores(4, 0.0f);
  scores[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(run_topk(t, scores, 4, 2, nullptr), InvalidArgument);
}

TEST(DsaCpu, IndexerScoresMatchFormulaAndMaskFutureKeys) {
  const int64_t num_q = 2;
  DsaTestPool t = make_dsa_test_pool({3, 70}, 64, num_q, 4, 16, 15);
  const int64_t stride = t.max_context + 5;
  std::vector<float> scores(t.num_requests() * num_q * stride, 42.0f);
  cpu::dsa_indexer_scores({.cache = t.cache_at(t.pool.data()),
                           .batch = t.host_batch(),
                           .q8 = t.q8.data(),
                           .weights = t.weights.data(),
                           .num_heads = t.index_heads,
                           .scores = scores.data(),
                           .score_stride = stride});
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < num_q; ++i) {
      const int64_t row = b * num_q + i;
      const int64_t position = t.seq_lens[b] - num_q + i;
      for (int64_t p = 0; p < t.seq_lens[b]; ++p) {
        const float got = scores[row * stride + p];
        if (p > position) {
          EXPECT_EQ(got, -std::numeric_limits<float>::infinity());
          continue;
        }
        const int64_t block = t.block_tables[b * t.max_blocks + p / 64];
        const uint8_t* page = t.pool.data() + block * t.cache.row_bytes + t.cache.index_offset;
        float k_scale;
        std::memcpy(&k_scale, page + 64 * 128 + (p % 64) * 4, 4);
        // In double; fp32 summation error is bounded relative to the sum of |terms|.
        double want = 0.0, magnitude = 0.0;
        for (int64_t h = 0; h < t.index_heads; ++h) {
          double dot = 0.0, abs_dot = 0.0;
          for (int d = 0; d < 128; ++d) {
            const double term = double{e4m3_to_f32(t.q8[(row * t.index_heads + h) * 128 + d])} *
                                e4m3_to_f32(page[(p % 64) * 128 + d]);
            dot += term;
            abs_dot += std::fabs(term);
          }
          want += double{t.weights[row * t.index_heads + h]} * std::max(dot, 0.0);
          magnitude += std::fabs(t.weights[row * t.index_heads + h]) * abs_dot;
        }
        want *= k_scale;
        magnitude *= k_scale;
        EXPECT_NEAR(got, want, 1e-5 * magnitude) << "b " << b << " i " << i << " p " << p;
      }
      EXPECT_EQ(scores[row * stride + t.seq_lens[b]], 42.0f) << "wrote past seq_len";
    }
  }
}

// The optional histogram (the top-k's first radix pass, fused into the indexer) counts the
// visible scores of each row by their top 11 order-key bits.
TEST(DsaCpu, IndexerHistogramCountsVisibleScores) {
  const int64_t num_q = 3;
  DsaTestPool t = make_dsa_test_pool({2, 70, 129}, 64, num_q, 4, 16, 16);
  const int64_t rows = t.num_requests() * num_q, stride = t.max_context;
  std::vector<float> scores(rows * stride);
  std::vector<int> hist(rows * kDsaTopkBins, 0);
  cpu::dsa_indexer_scores({.cache = t.cache_at(t.pool.data()),
                           .batch = t.host_batch(),
                           .q8 = t.q8.data(),
                           .weights = t.weights.data(),
                           .num_heads = t.index_heads,
                           .scores = scores.data(),
                           .score_stride = stride,
                           .histogram = hist.data()});
  std::vector<int> want(hist.size(), 0);
  for (int64_t b = 0; b < t.num_requests(); ++b) {
    for (int64_t i = 0; i < num_q; ++i) {
      const int64_t row = b * num_q + i;
      for (int64_t p = 0; p <= t.seq_lens[b] - num_q + i; ++p) {
        // The order key sorts like the float, so the bin order is the score order.
        const float x = scores[row * stride + p];
        ++want[row * kDsaTopkBins + (float_order_key(x) >> kDsaTopkBinShift)];
      }
    }
  }
  EXPECT_EQ(hist, want);
  EXPECT_LT(float_order_key(-1.0f), float_order_key(-0.5f));
  EXPECT_EQ(float_order_key(-0.0f), float_order_key(0.0f));
  EXPECT_LT(float_order_key(0.0f), float_order_key(1e-30f));
  EXPECT_LT(float_order_key(2.0f), float_order_key(std::numeric_limits<float>::infinity()));
}

}  // namespace
}  // namespace hyserve
