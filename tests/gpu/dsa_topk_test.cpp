// CUDA DSA top-k (kernels/attention/dsa/cuda.h) against cpu::dsa_topk, exactly (slots and
// positions): ties, short, empty and all-masked rows, 1M rows, rows from lists, refined lists and
// the whole row, ties at the threshold across tiles and chunks, clustered and spread winners,
// misaligned rows. The indexer, MLA and whole-step tests are in dsa_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/attention/dsa/cpu.h"
#include "kernels/attention/dsa/cuda.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}
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

}  // namespace
}  // namespace hyserve
