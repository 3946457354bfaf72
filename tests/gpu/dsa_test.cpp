// CUDA DSA decode (kernels/attention/dsa/cuda.h) against the CPU reference over the same packed
// pool bytes: indexer scores within the FP8 tensor cores' accumulation tolerance; sparse
// and dense MLA o_lat / lse within the fp16 tolerance; the whole step. The top-k's own
// tests are in dsa_topk_test.cpp.
#include "kernels/attention/dsa/cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "dsa_test_pool.h"
#include "gpu/gpu_test_util.h"
#include "kernels/attention/dsa/cpu.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::DsaTestPool;
using test::make_dsa_test_pool;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

// The pool, tables and queries of a DsaTestPool on the device.
struct DevicePool {
  DeviceBuffer pool, tables, lens, q8, weights, q_lat, q_pe;
  explicit DevicePool(const DsaTestPool& t)
      : pool(to_device(t.pool)),
        tables(to_device(t.block_tables)),
        lens(to_device(t.seq_lens)),
        q8(to_device(t.q8)),
        weights(to_device(t.weights)),
        q_lat(to_device(t.q_lat)),
        q_pe(to_device(t.q_pe)) {}
  DsaBatch batch(const DsaTestPool& t) const {
    return t.batch(tables.as<int32_t>(), lens.as<int32_t>());
  }
  DsaCache cache(const DsaTestPool& t) const { return t.cache_at(pool.as<uint8_t>()); }
};

std::string describe(const DsaTestPool& t) {
  std::ostringstream os;
  os << "block_size " << t.block_size << ", n_q " << t.num_q << ", H " << t.heads << ", Hi "
     << t.index_heads << ", seq_lens {";
  for (size_t i = 0; i < t.seq_lens.size(); ++i) os << (i ? "," : "") << t.seq_lens[i];
  return os.str() + "}";
}

// ---------------------------------------------------------------- indexer

// The indexer's scores [rows, stride] (12345 where it writes nothing); with a histogram
// (zeroed by the caller) it also counts the visible scores' bins there.
std::vector<float> gpu_scores(const DsaTestPool& t, const DevicePool& d, int64_t stride,
                              int* histogram = nullptr) {
  const int64_t rows = t.num_requests() * t.num_q;
  std::vector<float> init(rows * stride, 12345.0f);
  DeviceBuffer scores = to_device(init);
  cuda::dsa_indexer_scores({.cache = d.cache(t),
                            .batch = d.batch(t),
                            .q8 = d.q8.as<uint8_t>(),
                            .weights = d.weights.as<float>(),
                            .num_heads = t.index_heads,
                            .scores = scores.as<float>(),
                            .score_stride = stride,
                            .histogram = histogram},
                           nullptr);
  sync();
  return to_host<float>(scores, init.size());
}

// Tolerance of one score: the e4m3 products are exact, but the FP8 tensor cores add them
// with a reduced-precision accumulator (about 2^-13 relative to the running sum), and the
// heads are summed in another order: 2^-10 of the sum of |terms| covers both.
double score_bound(const DsaTestPool& t, int64_t row, int64_t b, int64_t pos) {
  const int64_t block = t.block_tables[b * t.max_blocks + pos / t.block_size];
  const uint8_t* page = t.pool.data() + block * t.cache.row_bytes + t.cache.index_offset;
  const uint8_t* k = page + (pos % t.block_size) * kDsaIndexDim;
  float k_scale;
  std::memcpy(&k_scale, page + t.block_size * kDsaIndexDim + (pos % t.block_size) * 4, 4);
  double sum = 0.0;
  for (int64_t h = 0; h < t.index_heads; ++h) {
    double dot = 0.0;
    for (int d = 0; d < kDsaIndexDim; ++d) {
      dot +=
          std::fabs(double{test::e4m3_value(t.q8[(row * t.index_heads + h) * kDsaIndexDim + d])} *
                    test::e4m3_value(k[d]));
    }
    sum += std::fabs(t.weights[row * t.index_heads + h]) * dot;
  }
  return sum * k_scale;
}

void expect_scores_match(const DsaTestPool& t, int64_t stride, const std::vector<float>& got) {
  const int64_t rows = t.num_requests() * t.num_q;
  std::vector<float> want(rows * stride, 12345.0f);
  cpu::dsa_indexer_scores({.cache = t.cache_at(t.pool.data()),
                           .batch = t.host_batch(),
                           .q8 = t.q8.data(),
                           .weights = t.weights.data(),
                           .num_heads = t.index_heads,
                           .scores = want.data(),
                           .score_stride = stride});
  double worst = 0.0;
  int64_t worst_at = -1;
  for (int64_t b = 0; b < t.num_requests(); ++b) {
    for (int64_t i = 0; i < t.num_q; ++i) {
      const int64_t row = b * t.num_q + i;
      for (int64_t pos = 0; pos < stride; ++pos) {
        const float g = got[row * stride + pos], w = want[row * stride + pos];
        if (pos >= t.seq_lens[b] || std::isinf(w)) {
          ASSERT_EQ(g, w) << "exact element differs at request " << b << ", query " << i
                          << ", position " << pos << " (seq_len " << t.seq_lens[b]
                          << "; 12345 = untouched, -inf = masked); " << describe(t);
          continue;
        }
        const double excess =
            std::fabs(double{g} - w) / (score_bound(t, row, b, pos) * 0x1p-10 + 1e-30);
        if (excess > worst || std::isnan(g)) {
          worst = std::isnan(g) ? INFINITY : excess;
          worst_at = row * stride + pos;
        }
      }
    }
  }
  EXPECT_LE(worst, 1.0) << "worst score at request " << worst_at / stride / t.num_q << ", query "
                        << worst_at / stride % t.num_q << ", position " << worst_at % stride
                        << ": got " << got[worst_at] << ", want " << want[worst_at]
                        << " (error / tolerance = " << worst << "); " << describe(t);
}

TEST(DsaGpu, IndexerScoresMatchCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (const int64_t block_size : {32, 64, 128}) {  // 32: a 64-key tile spans two blocks
    for (const int64_t num_q : {1, 2, 8}) {
      for (const int64_t hi : {32, 64, 16, 48}) {
        if (num_q == 8 && (hi == 16 || hi == 48)) continue;
        DsaTestPool t =
            make_dsa_test_pool({1, 3, 63, 65, 321, 2049}, block_size, num_q, 8, hi, ++seed, 7);
        DevicePool d(t);
        const int64_t stride = t.max_context + 3;
        expect_scores_match(t, stride, gpu_scores(t, d, stride));
      }
    }
  }
}

TEST(DsaGpu, IndexerScoresShortAndEmptyRequests) {
  REQUIRE_GPU();
  // seq_len 0 and seq_len < n_q (the first queries see no key), B = 1 with a long row.
  for (const auto& lens : std::vector<std::vector<int32_t>>{{0, 2, 5}, {4000}, {1}}) {
    DsaTestPool t = make_dsa_test_pool(lens, 64, 4, 8, 32, 99 + lens.size());
    DevicePool d(t);
    expect_scores_match(t, t.max_context, gpu_scores(t, d, t.max_context));
  }
}

// The histogram the indexer builds for the top-k counts exactly its own visible scores by
// their top 11 order-key bits, for every n_q the fusion supports.
TEST(DsaGpu, IndexerHistogramCountsItsOwnScores) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  for (const int64_t num_q : {1, 2, 4, 8}) {
    for (const int64_t hi : {32, 64}) {
      if (!cuda::dsa_indexer_takes_histogram(num_q, hi)) continue;
      DsaTestPool t = make_dsa_test_pool({1, 3, 65, 2049, 40000}, 64, num_q, 8, hi, ++seed, 7);
      DevicePool d(t);
      const int64_t rows = t.num_requests() * num_q, stride = t.max_context;
      const std::vector<int> zeros(rows * kDsaTopkBins, 0);
      DeviceBuffer hist = to_device(zeros);
      const std::vector<float> got_scores = gpu_scores(t, d, stride, hist.as<int>());
      const std::vector<int> got = to_host<int>(hist, zeros.size());
      std::vector<int> want(zeros.size(), 0);
      for (int64_t b = 0; b < t.num_requests(); ++b) {
        for (int64_t i = 0; i < num_q; ++i) {
          const int64_t row = b * num_q + i, visible = t.seq_lens[b] - num_q + i + 1;
          for (int64_t pos = 0; pos < visible; ++pos) {
            ++want[row * kDsaTopkBins +
                   (float_order_key(got_scores[row * stride + pos]) >> kDsaTopkBinShift)];
          }
        }
      }
      ASSERT_EQ(got, want) << "n_q " << num_q << ", heads " << hi << "; " << describe(t);
    }
  }
}

// ---------------------------------------------------------------- MLA

struct MlaResult {
  std::vector<float> o_lat, lse;
  bool wgmma = false;  // which kernel ran (the tests check both are covered)
};

constexpr float kSoftmaxScale = 4.0f;  // sharp enough that the softmax is far from uniform

MlaResult cpu_mla(const DsaTestPool& t, const int32_t* slots, int64_t width) {
  const int64_t heads = t.num_requests() * t.num_q * t.heads;
  MlaResult r{std::vector<float>(heads * kDsaLoraDim), std::vector<float>(heads)};
  cpu::dsa_mla_decode({.cache = t.cache_at(t.pool.data()),
                       .batch = t.host_batch(),
                       .q_lat = t.q_lat.data(),
                       .q_pe = t.q_pe.data(),
                       .slots = slots,
                       .topk_width = width,
                       .num_heads = t.heads,
                       .softmax_scale = kSoftmaxScale,
                       .o_lat = r.o_lat.data(),
                       .lse = r.lse.data()});
  return r;
}

MlaResult gpu_mla(const DsaTestPool& t, const DevicePool& d, const int32_t* d_slots, int64_t width,
                  bool batch_invariant = false) {
  const int64_t heads = t.num_requests() * t.num_q * t.heads;
  DeviceBuffer o = to_device(std::vector<float>(heads * kDsaLoraDim, 12345.0f));
  DeviceBuffer lse = to_device(std::vector<float>(heads, 12345.0f));
  const DsaMlaParams p{.cache = d.cache(t),
                       .batch = d.batch(t),
                       .q_lat = d.q_lat.as<float>(),
                       .q_pe = d.q_pe.as<float>(),
                       .slots = d_slots,
                       .topk_width = width,
                       .num_heads = t.heads,
                       .softmax_scale = kSoftmaxScale,
                       .o_lat = o.as<float>(),
                       .lse = lse.as<float>()};
  DeviceBuffer ws(std::max<size_t>(256, cuda::dsa_mla_workspace_bytes(p)));
  cuda::dsa_mla_decode(p, ws.data(), ws.size(), nullptr, batch_invariant);
  sync();
  return {to_host<float>(o, heads * kDsaLoraDim), to_host<float>(lse, heads),
          cuda::dsa_mla_uses_wgmma(p, batch_invariant)};
}

// Tolerance: q is rounded to fp16 (2^-12 relative) and the probabilities too (2^-12), so
// a logit is off by at most ~2^-12 * sum|q c| * scale (about 1e-3 for these inputs, whose
// logits spread over ~+-10) and o_lat by that much relative to max |c| = 3.75 *
// latent_scale. lse: 1e-2 absolute; o_lat: 1e-2 * max |c| absolute + 1e-2 relative.
// Heads with no key must be exactly o = 0, lse = -inf.
void expect_mla_matches(const DsaTestPool& t, const MlaResult& got, const MlaResult& want,
                        const std::string& what) {
  const int64_t heads = t.num_requests() * t.num_q * t.heads;
  for (int64_t k = 0; k < heads; ++k) {
    if (std::isinf(want.lse[k]) || std::isinf(got.lse[k])) {
      ASSERT_EQ(got.lse[k], want.lse[k])
          << what << ": lse of request " << k / t.heads / t.num_q << ", query "
          << k / t.heads % t.num_q << ", head " << k % t.heads << "; " << describe(t);
      for (int d = 0; d < kDsaLoraDim; ++d) {
        ASSERT_EQ(got.o_lat[k * kDsaLoraDim + d], 0.0f) << what << ": empty head " << k;
      }
    }
  }
  const float c_max = 3.75f * t.cache.latent_scale;
  const testing::AssertionResult lse_ok = test::all_close(got.lse, want.lse, 1e-2f, 0.0f);
  const testing::AssertionResult o_ok =
      test::all_close(got.o_lat, want.o_lat, 1e-2f * c_max, 1e-2f);
  auto where = [&](const testing::AssertionResult& r, int64_t width) {
    // all_close names the flat index; decode it.
    const std::string msg = r.message();
    const auto pos = msg.find("worst element ");
    if (pos == std::string::npos) return msg;
    const int64_t idx = std::stoll(msg.substr(pos + 14));
    const int64_t head = idx / width;
    std::ostringstream os;
    os << msg << " = request " << head / t.heads / t.num_q << ", query " << head / t.heads % t.num_q
       << ", head " << head % t.heads;
    if (width > 1) os << ", dim " << idx % width;
    return os.str();
  };
  EXPECT_TRUE(lse_ok) << what << " lse: " << where(lse_ok, 1) << "; " << describe(t);
  EXPECT_TRUE(o_ok) << what << " o_lat: " << where(o_ok, kDsaLoraDim) << "; " << describe(t);
}

// A random selection per query: up to `width` distinct visible positions (as slots), in
// random order, padded with -1 at random places.
std::vector<int32_t> random_selection(const DsaTestPool& t, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t rows = t.num_requests() * t.num_q;
  std::vector<int32_t> slots(rows * width, -1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / t.num_q, i = r % t.num_q;
    const int64_t visible = std::max<int64_t>(0, t.seq_lens[b] - t.num_q + i + 1);
    std::vector<int64_t> pos(visible);
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);
    const int64_t n = std::min<int64_t>(visible, static_cast<int64_t>(rng() % (width + 1)));
    std::vector<int32_t> row(width, -1);
    for (int64_t j = 0; j < n; ++j) {
      row[j] = static_cast<int32_t>(dsa_slot(t.host_batch(), t.cache.block_size, b, pos[j]));
    }
    std::shuffle(row.begin(), row.end(), rng);
    std::copy(row.begin(), row.end(), slots.begin() + r * width);
  }
  return slots;
}

TEST(DsaGpu, SparseMlaMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  std::set<std::pair<int64_t, bool>> kernels;  // (heads, wgmma) that ran
  for (const int64_t block_size : {64, 128}) {
    for (const int64_t heads : {8, 12, 16, 32, 48, 64, 96, 128}) {
      for (const int64_t num_q : {1, 2, 8}) {
        if (heads >= 96 && num_q == 8) continue;
        DsaTestPool t =
            make_dsa_test_pool({1, 3, 63, 65, 321, 2049}, block_size, num_q, heads, 32, ++seed);
        DevicePool d(t);
        for (const int64_t width : {1, 65, 2048}) {
          const std::vector<int32_t> slots = random_selection(t, width, ++seed);
          DeviceBuffer d_slots = to_device(slots);
          const MlaResult got = gpu_mla(t, d, d_slots.as<int32_t>(), width);
          kernels.insert({heads, got.wgmma});
          expect_mla_matches(t, got, cpu_mla(t, slots.data(), width),
                             "sparse (width " + std::to_string(width) + ")");
        }
      }
    }
  }
  // 64 heads at 6 queries run on mma.sync, at 12 and 48 on warpgroup MMAs; 48 and 96 heads
  // on warpgroup MMAs pad their last group.
  for (const auto& want : std::vector<std::pair<int64_t, bool>>{
           {64, false}, {64, true}, {48, true}, {96, true}, {128, true}, {32, false}}) {
    EXPECT_TRUE(kernels.count(want)) << "untested: " << want.first << " heads on "
                                     << (want.second ? "warpgroup MMAs" : "mma.sync");
  }
}

TEST(DsaGpu, SparseMlaAllInvalidRows) {
  REQUIRE_GPU();
  for (const int64_t heads : {16, 64}) {
    // Batch-invariant 64 heads: the wgmma kernel; the rest: mma.sync.
    for (const bool batch_invariant : {false, true}) {
      DsaTestPool t = make_dsa_test_pool({100, 5}, 64, 2, heads, 32, 77);
      DevicePool d(t);
      const std::vector<int32_t> slots(2 * 2 * 2048, -1);
      DeviceBuffer d_slots = to_device(slots);
      const MlaResult got = gpu_mla(t, d, d_slots.as<int32_t>(), 2048, batch_invariant);
      EXPECT_EQ(got.wgmma, heads == 64 && batch_invariant);
      for (float l : got.lse) ASSERT_EQ(l, kNegInf) << "heads " << heads;
      for (float o : got.o_lat) ASSERT_EQ(o, 0.0f) << "heads " << heads;
    }
  }
}

TEST(DsaGpu, DenseMlaMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  std::set<std::pair<int64_t, bool>> kernels;  // (heads, wgmma) that ran
  for (const int64_t block_size : {64, 128}) {
    for (const int64_t heads : {8, 16, 32, 64, 12, 96}) {
      for (const int64_t num_q : {1, 3}) {
        // Includes seq_len 1 < n_q (queries with no key) and a long request (many splits).
        DsaTestPool t = make_dsa_test_pool({1, 3, 63, 65, 321, 2049, 9000}, block_size, num_q,
                                           heads, 32, ++seed);
        DevicePool d(t);
        const MlaResult got = gpu_mla(t, d, nullptr, 0);
        kernels.insert({heads, got.wgmma});
        expect_mla_matches(t, got, cpu_mla(t, nullptr, 0), "dense");
      }
    }
  }
  // Dense MLA: 64 and 96 heads always on warpgroup MMAs, fewer heads on mma.sync.
  EXPECT_TRUE(kernels.count({64, true}) && kernels.count({96, true}) &&
              kernels.count({32, false}) && !kernels.count({64, false}))
      << "a kernel path went untested";
}

// ---------------------------------------------------------------- whole step

// The whole step's outputs on the device ([B * n_q, H, 512] o_lat, [B * n_q, H] lse,
// [B * n_q, topk] slots) and its Params over the pool's inputs.
struct StepRun {
  int64_t rows, heads;
  DeviceBuffer o, lse, slots;
  DsaDecodeParams p;
  StepRun(const DsaTestPool& t, const DevicePool& d, int64_t topk)
      : rows(t.num_requests() * t.num_q),
        heads(rows * t.heads),
        o(sizeof(float) * heads * kDsaLoraDim),
        lse(sizeof(float) * heads),
        slots(sizeof(int32_t) * rows * topk),
        p{.cache = d.cache(t),
          .batch = d.batch(t),
          .index_q8 = d.q8.as<uint8_t>(),
          .index_weights = d.weights.as<float>(),
          .index_num_heads = t.index_heads,
          .topk = topk,
          .q_lat = d.q_lat.as<float>(),
          .q_pe = d.q_pe.as<float>(),
          .num_heads = t.heads,
          .softmax_scale = kSoftmaxScale,
          .o_lat = o.as<float>(),
          .lse = lse.as<float>(),
          .slots = slots.as<int32_t>()} {}
};

TEST(DsaGpu, WholeStepMatchesItsPartsAndCpu) {
  REQUIRE_GPU();
  uint64_t seed = 700;
  std::set<bool> fused;  // whether the indexer built the top-k's histogram
  // (n_q, index heads): (1, 64) fuses the histogram, (4, 64) cannot.
  for (const auto& [num_q, index_heads] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {4, 32}, {1, 64}, {4, 64}}) {
    for (const int64_t topk : {64, 2048}) {
      DsaTestPool t =
          make_dsa_test_pool({1, 65, 321, 2049, 5000}, 64, num_q, 16, index_heads, ++seed);
      fused.insert(cuda::dsa_indexer_fuses_histogram(t.host_batch(), index_heads));
      DevicePool d(t);
      StepRun run(t, d, topk);
      const int64_t rows = run.rows, heads = run.heads;
      const DsaDecodeParams& p = run.p;
      DeviceBuffer &o = run.o, &lse = run.lse, &slots = run.slots;
      DeviceBuffer ws(cuda::dsa_decode_workspace_bytes(p));
      cuda::dsa_decode(p, ws.data(), ws.size(), nullptr);
      sync();
      // The selection equals the CPU top-k over the GPU's own scores (the scores differ
      // from the CPU's by summation order, which may reorder near-ties).
      const std::vector<float> scores = gpu_scores(t, d, t.max_context);
      std::vector<int32_t> want_slots(rows * topk);
      cpu::dsa_topk({.batch = t.host_batch(),
                     .block_size = t.cache.block_size,
                     .scores = scores.data(),
                     .score_stride = t.max_context,
                     .topk = topk,
                     .slots = want_slots.data(),
                     .positions = nullptr});
      const std::vector<int32_t> got_slots = to_host<int32_t>(slots, want_slots.size());
      for (size_t k = 0; k < want_slots.size(); ++k) {
        ASSERT_EQ(got_slots[k], want_slots[k])
            << "selection of row " << k / topk << ", entry " << k % topk << "; topk " << topk
            << "; " << describe(t);
      }
      const MlaResult got{to_host<float>(o, heads * kDsaLoraDim), to_host<float>(lse, heads)};
      expect_mla_matches(t, got, cpu_mla(t, want_slots.data(), topk),
                         "whole step (topk " + std::to_string(topk) + ")");
    }
  }
  EXPECT_EQ(fused.size(), 2u) << "the step ran only with the histogram "
                              << (fused.count(true) ? "fused" : "of the top-k's own");
}

// Batch-invariant mode: each request's step run alone (B = 1, max_context = its own
// length) gives the same selection, o_lat and lse bits as inside the batch, whose split
// plan (from B, n_q and max_context) would otherwise differ.
TEST(DsaGpu, WholeStepBatchInvariantRequestAloneEqualsInBatch) {
  REQUIRE_GPU();
  for (const int64_t num_q : {1, 2}) {
    DsaTestPool t = make_dsa_test_pool({1, 65, 2049, 9000, 30000}, 64, num_q, 16, 32, 950 + num_q);
    DevicePool d(t);
    const int64_t topk = 2048;
    StepRun run(t, d, topk);
    const int64_t rows = run.rows, heads = run.heads;
    const DsaDecodeParams& p = run.p;
    DeviceBuffer &o = run.o, &lse = run.lse, &slots = run.slots;
    DeviceBuffer ws(cuda::dsa_decode_workspace_bytes(p));
    cuda::dsa_decode(p, ws.data(), ws.size(), nullptr, /*batch_invariant=*/true);
    sync();
    const std::vector<float> all_o = to_host<float>(o, heads * kDsaLoraDim);
    const std::vector<float> all_lse = to_host<float>(lse, heads);
    const std::vector<int32_t> all_slots = to_host<int32_t>(slots, rows * topk);
    const MlaResult whole{all_o, all_lse};
    expect_mla_matches(t, whole, cpu_mla(t, all_slots.data(), topk), "batch-invariant step");
    for (int64_t b = 0; b < t.num_requests(); ++b) {
      DsaDecodeParams one = p;
      one.batch.block_tables += b * one.batch.max_blocks;
      one.batch.seq_lens += b;
      one.batch.num_requests = 1;
      one.batch.max_context = t.seq_lens[b];
      one.index_q8 += b * num_q * t.index_heads * kDsaIndexDim;
      one.index_weights += b * num_q * t.index_heads;
      one.q_lat += b * num_q * t.heads * kDsaLoraDim;
      one.q_pe += b * num_q * t.heads * kDsaRopeDim;
      DeviceBuffer o1(sizeof(float) * num_q * t.heads * kDsaLoraDim);
      DeviceBuffer l1(sizeof(float) * num_q * t.heads), s1(sizeof(int32_t) * num_q * topk);
      one.o_lat = o1.as<float>();
      one.lse = l1.as<float>();
      one.slots = s1.as<int32_t>();
      DeviceBuffer ws1(cuda::dsa_decode_workspace_bytes(one));
      cuda::dsa_decode(one, ws1.data(), ws1.size(), nullptr, /*batch_invariant=*/true);
      sync();
      const std::vector<int32_t> got_slots = to_host<int32_t>(s1, num_q * topk);
      const std::vector<float> got_o = to_host<float>(o1, num_q * t.heads * kDsaLoraDim);
      const std::vector<float> got_lse = to_host<float>(l1, num_q * t.heads);
      ASSERT_EQ(0, std::memcmp(got_slots.data(), all_slots.data() + b * num_q * topk,
                               got_slots.size() * sizeof(int32_t)))
          << "selection of request " << b << "; " << describe(t);
      ASSERT_EQ(0, std::memcmp(got_o.data(), all_o.data() + b * num_q * t.heads * kDsaLoraDim,
                               got_o.size() * sizeof(float)))
          << "o_lat of request " << b << "; " << describe(t);
      ASSERT_EQ(0, std::memcmp(got_lse.data(), all_lse.data() + b * num_q * t.heads,
                               got_lse.size() * sizeof(float)))
          << "lse of request " << b << "; " << describe(t);
    }
  }
}

// The step reads every per-request value from device memory: captured once in a CUDA
// graph, then replayed after the lengths change, it must give exactly what a direct call
// with the new lengths gives.
TEST(DsaGpu, WholeStepReplaysFromACudaGraph) {
  REQUIRE_GPU();
  DsaTestPool t = make_dsa_test_pool({3000, 700, 1}, 64, 2, 16, 32, 901);
  DevicePool d(t);
  const int64_t topk = 256;
  StepRun run(t, d, topk);
  const int64_t rows = run.rows, heads = run.heads;
  const DsaDecodeParams& p = run.p;
  DeviceBuffer &o = run.o, &lse = run.lse, &slots = run.slots;
  DeviceBuffer ws(cuda::dsa_decode_workspace_bytes(p));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::dsa_decode(p, ws.data(), ws.size(), stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // New lengths (within max_context), then replay vs. a direct call.
  const std::vector<int32_t> new_lens = {2999, 1500, 2};
  d.lens.upload(new_lens.data(), new_lens.size() * sizeof(int32_t));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> graph_o = to_host<float>(o, heads * kDsaLoraDim);
  const std::vector<float> graph_lse = to_host<float>(lse, heads);
  const std::vector<int32_t> graph_slots = to_host<int32_t>(slots, rows * topk);
  cuda::dsa_decode(p, ws.data(), ws.size(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(graph_slots, to_host<int32_t>(slots, rows * topk)) << "selection differs";
  EXPECT_EQ(0, std::memcmp(graph_o.data(), to_host<float>(o, heads * kDsaLoraDim).data(),
                           graph_o.size() * sizeof(float)))
      << "o_lat differs (the step must be deterministic)";
  EXPECT_EQ(0, std::memcmp(graph_lse.data(), to_host<float>(lse, heads).data(),
                           graph_lse.size() * sizeof(float)))
      << "lse differs";
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace hyserve
