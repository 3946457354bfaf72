// Round 1's verdict on one row of the top-k merge (params.h), shared by the CPU and CUDA
// steps: from each rank's counts against the threshold T (the k-th largest key sent), how
// many of `rank`'s sorted keys are in the global top-k, or -1 when round 2 must decide.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hyserve {

struct TopkMergeCounts {
  int64_t sent = 0;        // keys the rank sent: min(c, its local top-k)
  int64_t above = 0;       // sent keys > T
  int64_t tied = 0;        // sent keys == T
  bool unsent_in = false;  // it kept keys back and its c-th sent is >= T: they may be in
};

// all_in: at most k keys were sent in all (every one is in; T unused). counts_of(r): rank
// r's counts.
template <typename CountsOf>
HYSERVE_HOST_DEVICE int64_t topk_merge_verdict(int world, int rank, int64_t k, bool all_in,
                                               CountsOf counts_of) {
  int64_t num_above = 0, num_tied = 0;
  int tied_ranks = 0, tied_rank = -1;
  bool undecided = false;
  TopkMergeCounts mine;
  for (int r = 0; r < world; ++r) {
    const TopkMergeCounts n = counts_of(r);
    undecided = undecided || n.unsent_in;
    num_above += n.above;
    num_tied += n.tied;
    if (n.tied > 0) {
      ++tied_ranks;
      tied_rank = r;
    }
    if (r == rank) mine = n;
  }
  // Ties at T cut by k across ranks: the positions decide, which round 1 lacks.
  const int64_t slots = k - num_above;
  const bool all_tied_in = num_tied <= slots;
  if (undecided || (!all_in && !all_tied_in && tied_ranks > 1)) return -1;
  // Keys above T, and of those at T all or (one rank's, in position order) the first
  // `slots`: always a prefix of the sorted list.
  if (all_in) return mine.sent;
  if (all_tied_in) return mine.above + mine.tied;
  return mine.above + (tied_rank == rank ? (slots < mine.tied ? slots : mine.tied) : 0);
}

}  // namespace hyserve
