// The exact top-k merge of decode context parallelism against one top-k over every rank's
// keys (ranks as threads, Gloo): random scores, a skew that puts most of the top-k on one
// rank (the resend path), heavy ties across ranks, rows shorter than k; and the bytes it
// moves against the generic merge. The same cases through the backend ops
// (kernels/attention/topk_merge, the model's path) on the CPU backend, against both.
#include "parallel/topk_merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/order_key.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "topk_merge_util.h"

namespace hyserve::parallel {
namespace {

using namespace std::chrono_literals;

using test::random_rows;
using test::reference_topk;
using test::Rows;

// Rank r's local top-k of each row: positions p % world == r, sorted by the tie rule.
std::vector<LocalCandidates> local_topk(const Rows& rows, int rank, int world, int64_t k) {
  std::vector<LocalCandidates> out;
  for (const std::vector<float>& scores : rows) {
    std::vector<int64_t> mine;
    for (int64_t p = rank; p < std::ssize(scores); p += world) mine.push_back(p);
    std::sort(mine.begin(), mine.end(), [&](int64_t a, int64_t b) {
      return float_rank_key(scores[static_cast<size_t>(a)], a) >
             float_rank_key(scores[static_cast<size_t>(b)], b);
    });
    if (std::ssize(mine) > k) mine.resize(static_cast<size_t>(k));
    LocalCandidates c;
    for (int64_t p : mine) {
      c.scores.push_back(scores[static_cast<size_t>(p)]);
      c.positions.push_back(p / world);
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct MergeRun {
  std::vector<std::set<int64_t>> selected;  // per row, global positions from every rank
  std::vector<TopkMergeStats> stats;        // per rank
};

MergeRun run_merge(const Rows& rows, int world, int64_t k, bool generic) {
  HashStore store;
  MergeRun run;
  run.selected.resize(rows.size());
  run.stats.resize(static_cast<size_t>(world));
  std::vector<std::vector<std::vector<int32_t>>> picks(static_cast<size_t>(world));
  std::vector<std::vector<LocalCandidates>> local(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    local[static_cast<size_t>(r)] = local_topk(rows, r, world, k);
    threads.emplace_back([&, r] {
      try {
        auto comm = make_cpu_communicator(store, r, world, 30s, "merge");
        auto& stats = run.stats[static_cast<size_t>(r)];
        picks[static_cast<size_t>(r)] =
            generic ? merge_topk_generic(*comm, local[static_cast<size_t>(r)], k, &stats)
                    : merge_topk(*comm, local[static_cast<size_t>(r)], k, &stats);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    if (!errors[static_cast<size_t>(r)].empty()) continue;
    for (size_t row = 0; row < rows.size(); ++row) {
      const LocalCandidates& c = local[static_cast<size_t>(r)][row];
      for (int32_t i : picks[static_cast<size_t>(r)][row]) {
        EXPECT_TRUE(i >= 0 && i < std::ssize(c.positions));
        const bool fresh =
            run.selected[row].insert(c.positions[static_cast<size_t>(i)] * world + r).second;
        EXPECT_TRUE(fresh);
      }
    }
  }
  return run;
}

void expect_exact(const Rows& rows, const MergeRun& run, int64_t k) {
  for (size_t row = 0; row < rows.size(); ++row) {
    EXPECT_EQ(run.selected[row], reference_topk(rows[row], k)) << "row " << row;
  }
}

int64_t total_resent(const MergeRun& run) {
  return run.stats.empty() ? 0 : run.stats[0].resent_rows;
}

class TopkMerge : public testing::TestWithParam<int> {};

TEST_P(TopkMerge, RandomScoresMatchOneTopk) {
  const int world = GetParam();
  const int64_t k = 64;
  std::normal_distribution<float> normal;
  const Rows rows = random_rows({0, 1, 5, 63, 64, 65, 200, 1000, 3000}, 7,
                                [&](std::mt19937& g, int64_t) { return normal(g); });
  for (const bool generic : {false, true}) {
    const MergeRun run = run_merge(rows, world, k, generic);
    expect_exact(rows, run, k);
  }
}

TEST_P(TopkMerge, SkewedScoresTakeTheResendPathAndStayExact) {
  // Rank 0's keys outscore everyone's: it holds all of the top-k, more than it sends.
  const int world = GetParam();
  const int64_t k = 64;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const Rows rows = random_rows({2000, 2000, 500}, 11, [&](std::mt19937& g, int64_t p) {
    return u(g) + (p % world == 0 ? 10.0f : 0.0f);
  });
  const MergeRun run = run_merge(rows, world, k, false);
  expect_exact(rows, run, k);
  EXPECT_EQ(total_resent(run), 3);
}

TEST_P(TopkMerge, TiesAcrossRanksAreBrokenByTheLowerPosition) {
  // Four distinct scores: the threshold is tied on every rank; positions decide.
  const int world = GetParam();
  const int64_t k = 64;
  std::uniform_int_distribution<int> level(0, 3);
  const Rows rows =
      random_rows({100, 400, 1500}, 13, [&](std::mt19937& g, int64_t) { return 0.5f * level(g); });
  expect_exact(rows, run_merge(rows, world, k, false), k);
  // All equal (zero scores, as relu gives): the k lowest positions.
  const Rows zeros = random_rows({300}, 1, [](std::mt19937&, int64_t) { return 0.0f; });
  expect_exact(zeros, run_merge(zeros, world, k, false), k);
}

// The backend ops (CPU) on the same cases: the single-rank top-k, the same rows resent as
// the host merge, and each rank's share equal to the host merge's.
void expect_steps_exact(const Rows& rows, int world, int64_t k, int64_t want_resent = -1) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const test::MergeStepsRun steps = test::run_merge_steps(*cpu, rows, world, k);
  const MergeRun host = run_merge(rows, world, k, false);
  for (size_t row = 0; row < rows.size(); ++row) {
    EXPECT_EQ(steps.selected[row], reference_topk(rows[row], k)) << "row " << row;
    EXPECT_EQ(steps.selected[row], host.selected[row]) << "row " << row;
  }
  EXPECT_EQ(steps.resent_rows, total_resent(host));
  // The generic form: every row resent, the same shares.
  const test::MergeStepsRun generic = test::run_merge_steps(*cpu, rows, world, k, true);
  EXPECT_EQ(generic.resent_rows, std::ssize(rows));
  EXPECT_EQ(generic.per_rank, steps.per_rank);
  if (want_resent >= 0) {
    EXPECT_EQ(steps.resent_rows, want_resent);
  }
}

TEST_P(TopkMerge, BackendStepsMatchOneTopk) {
  const int world = GetParam();
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(0, 3);
  for (const int64_t k : {1, 7, 64}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    expect_steps_exact(random_rows({0, 1, 5, 63, 64, 65, 200, 1000, 3000}, 7,
                                   [&](std::mt19937& g, int64_t) { return normal(g); }),
                       world, k);
    expect_steps_exact(random_rows({2000, 2000, 500}, 11,
                                   [&](std::mt19937& g, int64_t p) {
                                     return u(g) + (p % world == 0 ? 10.0f : 0.0f);
                                   }),
                       world, k, parallel::merge_candidates(k, world) < k ? 3 : 0);
    expect_steps_exact(random_rows({100, 400, 1500}, 13,
                                   [&](std::mt19937& g, int64_t) { return 0.5f * level(g); }),
                       world, k);
    expect_steps_exact(random_rows({300}, 1, [](std::mt19937&, int64_t) { return 0.0f; }), world,
                       k);
  }
}

INSTANTIATE_TEST_SUITE_P(World, TopkMerge, testing::Values(2, 4, 8));

TEST(TopkMergeTraffic, MovesAboutTenTimesFewerBytesThanTheGenericMerge) {
  // W = 8, k = 2048 (DSA's index_topk), 16 rows of 32K-token context, random scores: round 1
  // decides every row; 8 x (4 x 384 + 4) bytes per row and rank vs 8 x 8 x 2048.
  const int world = 8;
  const int64_t k = 2048;
  std::normal_distribution<float> normal;
  const Rows rows = random_rows(std::vector<int64_t>(16, 32768), 21,
                                [&](std::mt19937& g, int64_t) { return normal(g); });
  const MergeRun exact = run_merge(rows, world, k, false);
  const MergeRun generic = run_merge(rows, world, k, true);
  expect_exact(rows, exact, k);
  expect_exact(rows, generic, k);
  EXPECT_EQ(total_resent(exact), 0);
  EXPECT_EQ(merge_candidates(k, world), 384);
  EXPECT_EQ(exact.stats[0].bytes_sent, 16 * (384 + 1) * 4);
  EXPECT_EQ(generic.stats[0].bytes_sent, 16 * 2048 * 8);
  EXPECT_GE(static_cast<double>(generic.stats[0].bytes_sent) / exact.stats[0].bytes_sent, 10.0);
}

}  // namespace
}  // namespace hyserve::parallel
