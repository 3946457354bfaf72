// ParallelLayout: where this process sits in the parallel schemes of DESIGN.md
// "Parallelism", in one place, validated once:
//
//   TP   rank r of N: 1/N of every layer's heads and MLP width (model/tensor_parallel.h)
//   DCP  groups of W consecutive TP ranks (W divides N); rank r is rank r % W of group r / W
//        and caches the positions p with dcp_owner(p, W) == r % W (core/dcp_position.h)
//   EP   routed experts whole on their ranks (E / N each) instead of 1/N of every one
//
//   TP ranks     0   1   2   3   4   5   6   7      (N = 8, W = 2)
//   DCP group    0   0   1   1   2   2   3   3
//   DCP rank     0   1   0   1   0   1   0   1
//
// The communicators are not owned (the worker that made them keeps them alive).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dcp_position.h"

namespace hyserve::parallel {

class Communicator;

struct TensorParallel {
  int rank = 0;
  int size = 1;
  // The group's collectives (size > 1); not owned.
  Communicator* comm = nullptr;
};

// Decode context parallelism (DESIGN.md "Parallelism"): rank `rank` of a group of `size`
// consecutive TP ranks caches every size-th position (the cache plan's layout,
// kv/block_table.h). Each MLA layer gathers the group's query heads, attends with all of
// them over the rank's own positions, and the partial outputs meet again by log-sum-exp
// (each rank keeps its heads'); DSA layers merge the indexer's top-k exactly
// (parallel/topk_merge.h). KDA layers are as under TP (heads split).
struct ContextParallel {
  int rank = 0;
  int size = 1;
  // The DCP group's collectives (size > 1); not owned.
  Communicator* comm = nullptr;

  // core/dcp_position.h's rule for this rank.
  bool owns(int64_t pos) const { return dcp_owner(pos, size) == rank; }
  // How many of positions [0, num_positions) this rank caches.
  int64_t local_count(int64_t num_positions) const {
    return dcp_local_count(num_positions, rank, size);
  }
};

struct ParallelLayout {
  TensorParallel tp;
  ContextParallel dcp;
  // Expert parallelism within the TP group (vLLM's --enable-expert-parallel).
  bool expert_parallel = false;

  // The layout of TP rank tp_rank of tp_size with DCP groups of dcp_size, no communicators
  // yet. Throws InvalidArgument (check_sizes) when the sizes do not fit together.
  static ParallelLayout make(int tp_rank, int tp_size, int dcp_size, bool expert_parallel);
  // The one check of the sizes: tp_size >= 1, 1 <= dcp_size, dcp_size divides tp_size;
  // the message names them as the caller does (serve: its flags).
  static void check_sizes(int64_t tp_size, int64_t dcp_size,
                          std::string_view tp_name = "the tensor parallel size",
                          std::string_view dcp_name = "the decode context parallel size");
  // Sizes as check_sizes, ranks in range, dcp.rank == tp.rank % dcp.size, and every group of
  // more than one rank has its communicator of that size and rank.
  void validate() const;
  // The DCP group this rank belongs to (its communicator's name among the TP group's).
  int dcp_group() const { return tp.rank / dcp.size; }
};

}  // namespace hyserve::parallel
