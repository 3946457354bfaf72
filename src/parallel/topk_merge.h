// The exact global top-k of decode context parallelism (DESIGN.md "Parallelism"): rank r of
// W holds the tokens at global positions p with p % W == r (local position p / W) and
// scores its own; per row (query), the top-k over every rank's keys, by the one tie rule
// (score descending, then the lower global position; core/order_key.h), is merged with
// little traffic:
//
//   round 1  every rank sends, per row, its best c = ceil(1.5 k / W) scores as 32-bit order
//            keys (float_order_key; sorted, so a candidate's place in the list stands for
//            its position) and its number of local keys; every rank finds the same
//            threshold T, the k-th largest key of the row.
//   round 2  only for rows where round 1 cannot decide: a rank that sent c keys, has more,
//            and whose c-th key is >= T (its unsent keys may belong to the top-k), or a
//            threshold tie that spans ranks (the positions decide). For those rows every
//            rank resends its full local top-k as 64-bit keys (float_rank_key of the score
//            and the global position) and the top-k is taken over them.
//
// Round 1 moves W x (4c + 4) bytes per row and rank; the generic merge (every rank's full
// top-k as fp32 score + int32 position) moves W x 8k, about 10x more at W = 8, k = 2048.
// Both give exactly the single-rank top-k.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention/topk_merge/params.h"
#include "parallel/communicator.h"

namespace hyserve {
class Backend;
}

namespace hyserve::parallel {

// One rank's local top-k of a row, sorted by (score desc, local position asc); at most k
// entries (fewer when the rank holds fewer keys in the row's causal range).
struct LocalCandidates {
  std::vector<float> scores;
  std::vector<int64_t> positions;  // local positions (global = local * W + rank)
};

struct TopkMergeStats {
  int64_t rows = 0;
  int64_t resent_rows = 0;     // rows that needed round 2
  int64_t bytes_sent = 0;      // by this rank, both rounds
  int64_t bytes_received = 0;  // by this rank (all_gather: W x sent)
};

// The candidates each rank sends in round 1.
int64_t merge_candidates(int64_t k, int world);

// Per row, the indices into this rank's `local[row]` lists that are in the global top-k
// (ascending). Every rank calls it with the same number of rows and the same k.
std::vector<std::vector<int32_t>> merge_topk(Communicator& comm,
                                             std::span<const LocalCandidates> local, int64_t k,
                                             TopkMergeStats* stats = nullptr);

// The generic merge, for comparison: every rank's full local top-k gathered (score and
// position), the top-k taken over them. Same result as merge_topk.
std::vector<std::vector<int32_t>> merge_topk_generic(Communicator& comm,
                                                     std::span<const LocalCandidates> local,
                                                     int64_t k, TopkMergeStats* stats = nullptr);

// p for `rows` rows of this rank's scores and local top-k (selected, in place), k, rank r of
// world: the inputs and the candidate count set, no scratch yet.
TopkMergeParams topk_merge_params(const float* scores, int64_t num_keys, int32_t* selected,
                                  int64_t rows, int64_t k, int rank, int world);

// The merge's scratch for p's rows (round 2's buffers for every row), in one block of
// backend memory: its size, and p's pointers into it (256-byte aligned pieces) with the
// gathered buffers merge_topk_steps takes.
struct MergeScratch {
  uint32_t* gathered = nullptr;
  uint64_t* gathered2 = nullptr;
};
size_t merge_scratch_bytes(const TopkMergeParams& p);
MergeScratch bind_merge_scratch(TopkMergeParams& p, void* scratch);

// The merge as the model runs it, in backend memory (kernels/attention/topk_merge/params.h): the
// backend's steps with comm's all_gathers between them. p's inputs and scratch are set
// except gathered / gathered2, given here writable: gathered [world, rows, c + 1] uint32,
// gathered2 and p.send2 sized for every row ([world, rows, k] and [rows, k] uint64), so
// the memory a step takes does not depend on its data. Reads the number of undecided
// rows back (a host sync). Returns the rows resent; p.resend_all gives the generic merge.
int64_t merge_topk_steps(Backend& backend, Communicator& comm, TopkMergeParams p,
                         uint32_t* gathered, uint64_t* gathered2, TopkMergeStats* stats = nullptr);
inline int64_t merge_topk_steps(Backend& backend, Communicator& comm, const TopkMergeParams& p,
                                const MergeScratch& s, TopkMergeStats* stats = nullptr) {
  return merge_topk_steps(backend, comm, p, s.gathered, s.gathered2, stats);
}

}  // namespace hyserve::parallel
