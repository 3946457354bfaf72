// The DCP position rule (core/dcp_position.h) and ParallelLayout (parallel/parallel_layout.h):
// every position has exactly one owner and one local slot there, the functions invert one
// another, and the layout refuses sizes, ranks and communicators that do not fit together.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dcp_position.h"
#include "parallel/make_communicator.h"
#include "parallel/parallel_layout.h"
#include "parallel/store.h"
#include "util/error.h"

namespace hyserve {
namespace {

using namespace std::chrono_literals;
using parallel::ParallelLayout;

TEST(DcpPosition, EveryPositionHasOneOwnerAndSlot) {
  for (int64_t world : {1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 1, 2, 5, 17, 64}) {
      std::vector<int64_t> counted(static_cast<size_t>(world), 0);
      for (int64_t p = 0; p < n; ++p) {
        const int64_t r = dcp_owner(p, world);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, world);
        // Slots are dense per rank: position p is the slot-th position rank r owns.
        EXPECT_EQ(dcp_local_slot(p, world), counted[static_cast<size_t>(r)]) << p << " " << world;
        EXPECT_EQ(dcp_position(dcp_local_slot(p, world), r, world), p);
        ++counted[static_cast<size_t>(r)];
      }
      int64_t total = 0;
      for (int64_t r = 0; r < world; ++r) {
        EXPECT_EQ(dcp_local_count(n, r, world), counted[static_cast<size_t>(r)])
            << "n " << n << " rank " << r << " of " << world;
        total += dcp_local_count(n, r, world);
      }
      EXPECT_EQ(total, n);
    }
  }
}

TEST(DcpPosition, CausalBoundIsTheLastLocalKeyAtOrBeforeTheQuery) {
  for (int64_t world : {1, 2, 3, 5}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      for (int64_t q = 0; q < 40; ++q) {
        int64_t last = -1;
        for (int64_t p = 0; p <= q; ++p)
          if (dcp_owner(p, world) == rank) last = dcp_local_slot(p, world);
        EXPECT_EQ(dcp_causal_bound(q, rank, world), last) << q << " " << rank << "/" << world;
        // The keys a query sees on this rank are the rank's local count of q + 1 positions.
        EXPECT_EQ(dcp_causal_bound(q, rank, world) + 1, dcp_local_count(q + 1, rank, world));
      }
    }
  }
}

TEST(ParallelLayout, MakePlacesRanksInConsecutiveGroups) {
  const ParallelLayout l = ParallelLayout::make(5, 8, 2, true);
  EXPECT_EQ(l.tp.rank, 5);
  EXPECT_EQ(l.tp.size, 8);
  EXPECT_EQ(l.dcp.rank, 1);
  EXPECT_EQ(l.dcp.size, 2);
  EXPECT_EQ(l.dcp_group(), 2);
  EXPECT_TRUE(l.expert_parallel);
  EXPECT_TRUE(l.dcp.owns(3));
  EXPECT_FALSE(l.dcp.owns(4));
  EXPECT_EQ(l.dcp.local_count(7), 3);  // positions 1, 3, 5
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelLayout, RefusesSizesThatDoNotFit) {
  EXPECT_EQ(error_of([] { ParallelLayout::check_sizes(4, 3, "--tp", "--dcp"); }),
            "--dcp 3 must divide --tp 4 (DCP groups are made of the TP group's ranks, as in "
            "vLLM)");
  EXPECT_NE(error_of([] { ParallelLayout::check_sizes(0, 1); }).find("at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { ParallelLayout::check_sizes(4, 0); }).find("must divide"),
            std::string::npos);
  EXPECT_EQ(error_of([] { ParallelLayout::check_sizes(8, 4); }), "");
  EXPECT_NE(error_of([] { ParallelLayout::make(4, 4, 1, false); }).find("rank 4 of 4"),
            std::string::npos);
}

TEST(ParallelLayout, ValidateWantsEveryGroupsCommunicator) {
  EXPECT_EQ(error_of([] { ParallelLayout::make(0, 1, 1, false).validate(); }), "");
  // TP 2 without a communicator.
  EXPECT_NE(error_of([] {
              ParallelLayout::make(1, 2, 1, false).validate();
            }).find("needs its group's communicator"),
            std::string::npos);
  // A DCP rank that is not tp.rank % W.
  EXPECT_NE(error_of([] {
              ParallelLayout l = ParallelLayout::make(0, 1, 1, false);
              l.dcp.rank = 1;
              l.validate();
            }).find("decode context parallelism"),
            std::string::npos);
  // A communicator of the wrong size.
  parallel::HashStore store;
  auto one = parallel::make_cpu_communicator(store, 0, 1, 10s, "one");
  EXPECT_NE(error_of([&] {
              ParallelLayout l = ParallelLayout::make(0, 2, 2, false);
              l.tp.comm = one.get();
              l.dcp.comm = one.get();
              l.validate();
            }).find("needs its group's communicator"),
            std::string::npos);
}

}  // namespace
}  // namespace hyserve
