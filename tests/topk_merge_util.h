// Helpers of the top-k merge tests: rows of scores over global positions, the single-rank
// top-k they must equal, and a driver that runs the merge steps of kernels/attention/topk_merge on
// a backend for `world` ranks in one process (the all_gathers done by concatenation), as
// Model::merge_selection runs them on each rank.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "core/order_key.h"
#include "kernels/attention/topk_merge/params.h"
#include "parallel/topk_merge.h"

namespace hyserve::test {

// Scores of every global position of each row.
using Rows = std::vector<std::vector<float>>;

inline Rows random_rows(const std::vector<int64_t>& lengths, uint32_t seed,
                        const std::function<float(std::mt19937&, int64_t)>& score) {
  std::mt19937 rng(seed);
  Rows rows;
  for (int64_t n : lengths) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) s[static_cast<size_t>(p)] = score(rng, p);
    rows.push_back(std::move(s));
  }
  return rows;
}

// The positions of `candidates` in the tie rule's order (score desc, position asc).
inline void sort_by_rank(std::vector<int64_t>& candidates, const std::vector<float>& scores,
                         int64_t world, int64_t rank) {
  std::sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) {
    return float_rank_key(scores[static_cast<size_t>(a * world + rank)], a) >
           float_rank_key(scores[static_cast<size_t>(b * world + rank)], b);
  });
}

inline std::set<int64_t> reference_topk(const std::vector<float>& scores, int64_t k) {
  std::vector<int64_t> all(scores.size());
  for (size_t p = 0; p < all.size(); ++p) all[p] = static_cast<int64_t>(p);
  sort_by_rank(all, scores, 1, 0);
  if (std::ssize(all) > k) all.resize(static_cast<size_t>(k));
  return {all.begin(), all.end()};
}

// Rank r's scores of its keys (positions p % world == r at local p / world, every row
// num_keys wide) and its local top-k as causal_topk leaves it (ascending, -1 padded).
struct RankInputs {
  int64_t num_keys = 1;
  std::vector<float> scores;      // [rows, num_keys]
  std::vector<int32_t> selected;  // [rows, k]
};

inline RankInputs rank_inputs(const Rows& rows, int rank, int world, int64_t k) {
  RankInputs in;
  for (const auto& r : rows) {
    in.num_keys = std::max<int64_t>(in.num_keys, (std::ssize(r) + world - 1) / world);
  }
  const auto num_rows = std::ssize(rows);
  in.scores.assign(static_cast<size_t>(num_rows * in.num_keys), 0.0f);
  in.selected.assign(static_cast<size_t>(num_rows * k), -1);
  for (int64_t row = 0; row < num_rows; ++row) {
    const std::vector<float>& s = rows[static_cast<size_t>(row)];
    std::vector<int64_t> mine;
    for (int64_t p = rank; p < std::ssize(s); p += world) {
      in.scores[static_cast<size_t>(row * in.num_keys + p / world)] = s[static_cast<size_t>(p)];
      mine.push_back(p / world);
    }
    sort_by_rank(mine, s, world, rank);
    if (std::ssize(mine) > k) mine.resize(static_cast<size_t>(k));
    std::sort(mine.begin(), mine.end());
    for (size_t i = 0; i < mine.size(); ++i) {
      in.selected[static_cast<size_t>(row * k) + i] = static_cast<int32_t>(mine[i]);
    }
  }
  return in;
}

struct MergeStepsRun {
  std::vector<std::set<int64_t>> selected;     // per row, global positions from every rank
  std::vector<std::vector<int32_t>> per_rank;  // each rank's selected [rows, k]
  int64_t resent_rows = 0;
};

// The merge steps on `b` (host or device memory) for every rank of `world`; resend_all: the
// generic merge (every row through round 2).
inline MergeStepsRun run_merge_steps(Backend& b, const Rows& rows, int world, int64_t k,
                                     bool resend_all = false) {
  const auto num_rows = std::ssize(rows);
  struct Rank {
    DeviceAllocation scores, selected, scratch;
    TopkMergeParams p;
    parallel::MergeScratch s;
  };
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    const RankInputs in = rank_inputs(rows, r, world, k);
    rank.scores = DeviceAllocation(&b, std::max<size_t>(in.scores.size() * 4, 8));
    rank.selected = DeviceAllocation(&b, std::max<size_t>(in.selected.size() * 4, 8));
    b.upload(rank.scores.data(), in.scores.data(), in.scores.size() * 4);
    b.upload(rank.selected.data(), in.selected.data(), in.selected.size() * 4);
    rank.p = parallel::topk_merge_params(static_cast<const float*>(rank.scores.data()), in.num_keys,
                                         static_cast<int32_t*>(rank.selected.data()), num_rows, k,
                                         r, world);
    rank.p.resend_all = resend_all;
    rank.scratch = DeviceAllocation(&b, parallel::merge_scratch_bytes(rank.p));
    rank.s = parallel::bind_merge_scratch(rank.p, rank.scratch.data());
    rank.p.gathered = rank.s.gathered;
    rank.p.gathered2 = rank.s.gathered2;
  }
  // all_gather: rank r's message at [r * bytes, (r + 1) * bytes) of every rank's buffer.
  const auto all_gather = [&](size_t bytes, auto&& src_of, auto&& dst_of) {
    std::vector<uint8_t> all(static_cast<size_t>(world) * bytes);
    for (int r = 0; r < world; ++r) {
      b.download(all.data() + static_cast<size_t>(r) * bytes, src_of(ranks[static_cast<size_t>(r)]),
                 bytes);
    }
    for (Rank& r : ranks) b.upload(dst_of(r), all.data(), all.size());
  };
  const auto stride = static_cast<size_t>(ranks[0].p.candidates + 1);
  for (Rank& r : ranks) b.topk_merge_pack(r.p);
  all_gather(
      static_cast<size_t>(num_rows) * stride * 4, [](Rank& r) { return r.p.send; },
      [](Rank& r) { return r.s.gathered; });
  MergeStepsRun run;
  for (Rank& r : ranks) b.topk_merge_decide(r.p);
  std::vector<int32_t> undecided(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    b.download(&undecided[static_cast<size_t>(r)], ranks[static_cast<size_t>(r)].p.num_undecided,
               4);
  }
  for (int32_t u : undecided) EXPECT_EQ(u, undecided[0]) << "ranks disagree on round 2";
  run.resent_rows = undecided[0];
  if (run.resent_rows > 0) {
    for (Rank& r : ranks) {
      r.p.num_resend = run.resent_rows;
      b.topk_merge_resend_pack(r.p);
    }
    all_gather(
        static_cast<size_t>(run.resent_rows * k) * 8, [](Rank& r) { return r.p.send2; },
        [](Rank& r) { return r.s.gathered2; });
    for (Rank& r : ranks) b.topk_merge_resend_decide(r.p);
  }
  run.selected.resize(rows.size());
  const size_t rk = static_cast<size_t>(num_rows * k);
  for (int r = 0; r < world; ++r) {
    std::vector<int32_t> sel(rk);
    b.download(sel.data(), ranks[static_cast<size_t>(r)].p.selected, rk * 4);
    for (int64_t row = 0; row < num_rows; ++row) {
      int32_t last = -1;
      bool padded = false;
      for (int64_t i = 0; i < k; ++i) {
        const int32_t pos = sel[static_cast<size_t>(row * k + i)];
        if (pos < 0) {
          padded = true;
          continue;
        }
        EXPECT_FALSE(padded) << "rank " << r << " row " << row << ": an entry after -1";
        EXPECT_GT(pos, last) << "rank " << r << " row " << row << ": not ascending";
        last = pos;
        const bool fresh = run.selected[static_cast<size_t>(row)].insert(pos * world + r).second;
        EXPECT_TRUE(fresh);
      }
    }
    run.per_rank.push_back(std::move(sel));
  }
  return run;
}

}  // namespace hyserve::test
