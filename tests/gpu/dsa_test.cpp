// CUDA DSA decode (kernels/dsa/cuda.h) against the CPU reference over the same packed
// pool bytes: indexer scores within the FP8 tensor cores' accumulation tolerance; the
// top-k exactly (slots and positions, ties, short, empty and all-masked rows, 1M rows, ties
// at the threshold across tiles and chunks, clustered and spread winners, misaligned rows);
// sparse and dense MLA o_lat / lse within the fp16 tolerance; the whole step.
#include "kernels/dsa/cuda.h"

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
#include "kernels/dsa/cpu.h"

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

// ---------------------------------------------------------------- top-k

// Block tables only (no pool) for top-k tests: request b owns blocks in a shuffled order.
struct TopkCase {
  std::vector<int32_t> seq_lens;
  int64_t num_q, block_size, topk;
  bool ties = false;
  bool all_equal = false;  // every visible score 0.5
  bool mixed = false;      // request b: tied levels, a continuum, all 0.5 for b % 3 = 0, 1, 2
  // Floats per row (0: max_context). Not a multiple of 4: rows start at every misalignment.
  int64_t stride = 0;
  // Scores from (row, position, visible positions, rng) instead of the kinds above.
  std::function<float(int64_t, int64_t, int64_t, std::mt19937_64&)> score = nullptr;
};

float uniform(std::mt19937_64& rng, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

void expect_topk_matches(const TopkCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t num_requests = static_cast<int64_t>(c.seq_lens.size());
  const int64_t max_context = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  const int64_t max_blocks = std::max<int64_t>(1, (max_context + c.block_size - 1) / c.block_size);
  std::vector<int32_t> tables(num_requests * max_blocks);
  std::iota(tables.begin(), tables.end(), 3);
  std::shuffle(tables.begin(), tables.end(), rng);
  const int64_t rows = num_requests * c.num_q;
  const int64_t stride = c.stride != 0 ? c.stride : std::max<int64_t>(1, max_context);
  ASSERT_GE(stride, max_context);
  // Scores: few levels (ties everywhere, with +0, -0, -inf), a continuum or c.score; beyond
  // each row's visible range, huge values that must never be selected.
  const float levels[] = {0.0f, -0.0f, 1.5f, -2.25f, 3.0f, kNegInf, 1e-30f, -1e-30f};
  std::uniform_real_distribution<float> uni(-10.0f, 10.0f);
  std::vector<float> scores(rows * stride);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / c.num_q, i = r % c.num_q;
    const int64_t visible = std::max<int64_t>(0, c.seq_lens[b] - c.num_q + i + 1);
    const bool all_equal = c.mixed ? b % 3 == 2 : c.all_equal;
    const bool ties = c.mixed ? b % 3 == 0 : c.ties;
    for (int64_t p = 0; p < stride; ++p) {
      float& s = scores[r * stride + p];
      if (p >= visible) {
        s = 1e30f;
      } else if (c.score) {
        s = c.score(r, p, visible, rng);
      } else {
        s = all_equal ? 0.5f : (ties ? levels[rng() % 8] : uni(rng));
      }
    }
  }
  DsaBatch batch{.block_tables = tables.data(),
                 .seq_lens = c.seq_lens.data(),
                 .num_requests = num_requests,
                 .max_blocks = max_blocks,
                 .num_q = c.num_q,
                 .max_context = max_context};
  std::vector<int32_t> want_slots(rows * c.topk), want_pos(rows * c.topk);
  cpu::dsa_topk({.batch = batch,
                 .block_size = static_cast<int32_t>(c.block_size),
                 .scores = scores.data(),
                 .score_stride = stride,
                 .topk = c.topk,
                 .slots = want_slots.data(),
                 .positions = want_pos.data()});
  DeviceBuffer d_tables = to_device(tables), d_lens = to_device(c.seq_lens),
               d_scores = to_device(scores);
  std::vector<int32_t> junk(rows * c.topk, 777777);
  DeviceBuffer d_slots = to_device(junk), d_pos = to_device(junk);
  batch.block_tables = d_tables.as<int32_t>();
  batch.seq_lens = d_lens.as<int32_t>();
  const DsaTopkParams p{.batch = batch,
                        .block_size = static_cast<int32_t>(c.block_size),
                        .scores = d_scores.as<float>(),
                        .score_stride = stride,
                        .topk = c.topk,
                        .slots = d_slots.as<int32_t>(),
                        .positions = d_pos.as<int32_t>()};
  DeviceBuffer ws(cuda::dsa_topk_workspace_bytes(p));
  // Twice: the second run checks that the workspace needs no cleaning between steps.
  for (int run = 0; run < 2; ++run) {
    cuda::dsa_topk(p, ws.data(), ws.size(), nullptr);
    sync();
    const std::vector<int32_t> got_slots = to_host<int32_t>(d_slots, want_slots.size());
    const std::vector<int32_t> got_pos = to_host<int32_t>(d_pos, want_pos.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < c.topk; ++j) {
        const int64_t k = r * c.topk + j;
        ASSERT_TRUE(got_pos[k] == want_pos[k] && got_slots[k] == want_slots[k])
            << "run " << run << ", row " << r << " (request " << r / c.num_q << ", query "
            << r % c.num_q << ", seq_len " << c.seq_lens[r / c.num_q] << "), entry " << j
            << ": got position " << got_pos[k] << " slot " << got_slots[k] << ", want position "
            << want_pos[k] << " slot " << want_slots[k] << "; topk " << c.topk << ", n_q "
            << c.num_q << ", block_size " << c.block_size << ", stride " << stride
            << (c.ties ? ", tied scores" : "");
      }
    }
  }
}

TEST(DsaGpu, TopkExactWithTiesShortAndMaskedRows) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (const int64_t block_size : {64, 128}) {
    for (const int64_t num_q : {1, 3, 8}) {
      for (const int64_t topk : {1, 64, 2048}) {
        for (const bool ties : {true, false}) {
          expect_topk_matches({{1, 3, 63, 65, 321, 2049, 5000, 2}, num_q, block_size, topk, ties},
                              ++seed);
        }
      }
    }
  }
}

// Many rows (640, more than one select block per SM) of many lengths: each row's chunks
// and list in their own part of the workspace.
TEST(DsaGpu, TopkMoreRowsThanBlocks) {
  REQUIRE_GPU();
  std::mt19937_64 rng(42);
  std::vector<int32_t> lens(80);
  for (auto& l : lens) l = static_cast<int32_t>(1 + rng() % 6000);
  lens[3] = 0;
  lens[7] = 2049;
  for (const int64_t topk : {64, 2048}) {
    expect_topk_matches({lens, 8, 64, topk, true}, 11 + topk);
    expect_topk_matches({lens, 8, 128, topk, false}, 12 + topk);
  }
}

TEST(DsaGpu, TopkAllInvalidAndEmptyRows) {
  REQUIRE_GPU();
  expect_topk_matches({{0, 0}, 1, 64, 2048, true}, 1);
  expect_topk_matches({{0, 1, 2}, 4, 64, 16, false}, 2);  // queries before any key
}

TEST(DsaGpu, TopkAllEqualScoresKeepLowestPositions) {
  REQUIRE_GPU();
  // Every visible score tied: the lowest positions win.
  TopkCase c{{70000}, 2, 64, 2048, true, true};
  expect_topk_matches(c, 5);
}

// A row is selected from a list of its keys at or above the threshold's 11-bit bin when
// that list fits 20480 entries (short rows, a 100K continuum), else from the list narrowed
// to the threshold's 22-bit bucket (a 256K+ continuum, whose top bin holds ~10% of the
// keys), else from the row itself in position order ("full": tens of thousands of keys
// tied at the threshold). Rows of every path in one launch (n_q 1 and 4); then launches
// of list and refined-list rows only, and of list rows only.
TEST(DsaGpu, TopkRowsFromListsRefinedListsOrTheWholeRow) {
  REQUIRE_GPU();
  // Kinds by request: ties, continuum, all equal, ties, continuum, all equal, ...
  const std::vector<int32_t> lens = {300000, 300000, 300000, 5000, 70000, 2049, 1, 1 << 18, 30000};
  for (const int64_t num_q : {1, 4}) {
    for (const int64_t topk : {2048, 100}) {
      expect_topk_matches({lens, num_q, 64, topk, false, false, true}, 30 + num_q + topk);
    }
  }
  expect_topk_matches({{1 << 18, 5000}, 1, 64, 2048, false}, 41);   // refined list + list
  expect_topk_matches({{1 << 18, 5000}, 3, 128, 2048, false}, 42);  // the same, n_q 3
  expect_topk_matches({{100000, 20000}, 2, 64, 2048, false}, 43);   // lists only
}

TEST(DsaGpu, TopkMillionKeys) {
  REQUIRE_GPU();
  expect_topk_matches({{1 << 20}, 1, 64, 2048, false}, 7);
  expect_topk_matches({{1 << 20, 300000}, 2, 128, 2048, true}, 8);
}

// Score generators for expect_topk_matches: (row, position, visible positions, rng). A
// key's 11-bit bin is a quarter octave of the score ([7, 8) for example), its 22-bit bucket
// 1/2048 of that; the row kinds named below are those of a 1M row.

// ~1/1000 of the keys in [20, 30), ~1/100 tied at 7.0 (alone in their bin), the rest in
// [-10, 5): a list row whose threshold is the tie, which holds more keys than needed.
float tied_at_threshold(int64_t, int64_t, int64_t, std::mt19937_64& rng) {
  const uint64_t kind = rng() % 1000;
  if (kind == 0) return uniform(rng, 20.0f, 30.0f);
  return kind <= 10 ? 7.0f : uniform(rng, -10.0f, 5.0f);
}

// The same with the tie at 7.5, above ~1/25 of the keys in [7, 7.4) that crowd its bin: a
// refined list row whose threshold is the tie.
float tied_in_crowded_bin(int64_t, int64_t, int64_t, std::mt19937_64& rng) {
  const uint64_t kind = rng() % 1000;
  if (kind == 0) return uniform(rng, 20.0f, 30.0f);
  if (kind <= 10) return 7.5f;
  return kind <= 50 ? uniform(rng, 7.0f, 7.4f) : uniform(rng, -10.0f, 5.0f);
}

// ~1/700 of the keys in [100, 1000) (many bins, in every tile), ~1/25 in [7, 8), the rest
// in [-10, 5): a refined list row whose list holds the bins above the threshold's.
float above_crowded_bin(int64_t, int64_t, int64_t, std::mt19937_64& rng) {
  const uint64_t kind = rng() % 700;
  if (kind == 0) return uniform(rng, 100.0f, 1000.0f);
  return kind <= 28 ? uniform(rng, 7.0f, 8.0f) : uniform(rng, -10.0f, 5.0f);
}

// The last 3000 positions in [10, 20), above the rest: the winners in one tile or two.
float clustered_at_end(int64_t, int64_t p, int64_t visible, std::mt19937_64& rng) {
  return p >= visible - 3000 ? uniform(rng, 10.0f, 20.0f) : uniform(rng, -10.0f, 10.0f);
}

// The last 3000 positions in [7.9, 8), ~1/80 of the others in [7, 7.9): a list of ~16000
// keys of the bin [7, 8) spread over the row, the winners in its last tile or two.
float clustered_in_long_list(int64_t, int64_t p, int64_t visible, std::mt19937_64& rng) {
  if (p >= visible - 3000) return uniform(rng, 7.9f, 8.0f);
  return rng() % 80 == 0 ? uniform(rng, 7.0f, 7.9f) : uniform(rng, -10.0f, 7.0f);
}

// Every 512th position in [10, 20), above the rest: 2048 winners, 8 in every tile.
float spread_every_512(int64_t, int64_t p, int64_t, std::mt19937_64& rng) {
  return p % 512 == 0 ? uniform(rng, 10.0f, 20.0f) : uniform(rng, -10.0f, 10.0f);
}

// More keys tied at the threshold than the winners need, in every tile (4096 slots) and
// chunk of the row: the lowest positions among them win, whichever runs hold them. One 1M
// row (chunks of one tile) and 8 rows of ~1M (chunks of several tiles); list and refined
// list rows; topk 2048 and 8192.
TEST(DsaGpu, TopkTiesAtTheThresholdSpanTilesAndChunks) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (const auto score : {tied_at_threshold, tied_in_crowded_bin}) {
    for (const int64_t topk : {2048, 8192}) {
      expect_topk_matches(
          {.seq_lens = {1 << 20}, .num_q = 1, .block_size = 64, .topk = topk, .score = score},
          ++seed);
      expect_topk_matches({.seq_lens = {1 << 20, 1 << 20},
                           .num_q = 4,
                           .block_size = 128,
                           .topk = topk,
                           .score = score},
                          ++seed);
    }
  }
}

// The winners come out in position order whether they sit in one tile (a short list, or a
// long one whose other keys are spread over the row) or a few in every tile.
TEST(DsaGpu, TopkWinnersClusteredInOneTileOrSpreadOverAll) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (const auto score : {clustered_at_end, clustered_in_long_list, spread_every_512}) {
    expect_topk_matches(
        {.seq_lens = {1 << 20}, .num_q = 1, .block_size = 64, .topk = 2048, .score = score},
        ++seed);
    expect_topk_matches({.seq_lens = {1 << 20, 200000},
                         .num_q = 2,
                         .block_size = 128,
                         .topk = 2048,
                         .score = score},
                        ++seed);
  }
}

// Refine rows: refine_kernel, not collect_kernel, appends the keys of the bins above the
// threshold's, which lie in every tile, with the top of the threshold's bin.
TEST(DsaGpu, TopkRefinedRowsTakeTheBinsAboveFromEveryTile) {
  REQUIRE_GPU();
  uint64_t seed = 350;
  for (const int64_t topk : {2048, 8192}) {
    expect_topk_matches({.seq_lens = {1 << 20},
                         .num_q = 1,
                         .block_size = 64,
                         .topk = topk,
                         .score = above_crowded_bin},
                        ++seed);
    expect_topk_matches({.seq_lens = {1 << 20, 600000},
                         .num_q = 2,
                         .block_size = 128,
                         .topk = topk,
                         .score = above_crowded_bin},
                        ++seed);
  }
}

// Misaligned rows (score_stride 1 or 2 mod 4: row r starts r * stride mod 4 floats past a
// 16-byte boundary), none a whole number of tiles long: their first and last tiles are
// partial, and an entry's tile follows from its position + head.
TEST(DsaGpu, TopkMisalignedRowsOfPartialTiles) {
  REQUIRE_GPU();
  const std::vector<int32_t> lens = {300007, 100001, 77777, 5003, 70001, 2051};
  expect_topk_matches({.seq_lens = lens,
                       .num_q = 3,
                       .block_size = 64,
                       .topk = 2048,
                       .mixed = true,
                       .stride = 300009},
                      401);
  expect_topk_matches(
      {.seq_lens = lens, .num_q = 3, .block_size = 64, .topk = 100, .ties = true, .stride = 300010},
      402);
  uint64_t seed = 410;
  for (const auto score : {tied_at_threshold, tied_in_crowded_bin, above_crowded_bin,
                           clustered_at_end, spread_every_512}) {
    expect_topk_matches({.seq_lens = {1000003, 999999},
                         .num_q = 2,
                         .block_size = 64,
                         .topk = 2048,
                         .stride = 1000005,
                         .score = score},
                        ++seed);
  }
}

// 64 requests of 100K-300K keys (chunks of several tiles), their kinds by request: ties at
// the threshold of a list or refined list row, clustered winners, bins above a crowded one.
TEST(DsaGpu, TopkSixtyFourLongRows) {
  REQUIRE_GPU();
  std::mt19937_64 len_rng(77);
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = static_cast<int32_t>(100000 + len_rng() % 200000);
  const auto score = [](int64_t row, int64_t p, int64_t visible, std::mt19937_64& rng) {
    switch (row % 4) {
      case 0:
        return tied_at_threshold(row, p, visible, rng);
      case 1:
        return tied_in_crowded_bin(row, p, visible, rng);
      case 2:
        return clustered_at_end(row, p, visible, rng);
      default:
        return above_crowded_bin(row, p, visible, rng);
    }
  };
  expect_topk_matches(
      {.seq_lens = lens, .num_q = 1, .block_size = 64, .topk = 2048, .score = score}, 501);
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
