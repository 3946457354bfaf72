// The decode-context-parallel position rule (DESIGN.md "Parallelism"), written once for the
// host code (the block table, the model, the decode step) and the kernels (dcp_localize):
//
//   a sequence's position p lives on rank p % W of its DCP group of W ranks, at that rank's
//   local slot p / W; rank r's local key j is position j * W + r.
//
//   positions   0  1  2  3  4  5  6  7 ...        (W = 3)
//   rank        0  1  2  0  1  2  0  1
//   local slot  0  0  0  1  1  1  2  2
//
// parallel/parallel_layout.h's ContextParallel answers these for its own rank.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hyserve {

// The rank of the DCP group that caches position p.
HYSERVE_HOST_DEVICE inline int64_t dcp_owner(int64_t pos, int64_t world) {
  return pos % world;
}

// Position p's slot among its owner's positions.
HYSERVE_HOST_DEVICE inline int64_t dcp_local_slot(int64_t pos, int64_t world) {
  return pos / world;
}

// The position of rank's local key j.
HYSERVE_HOST_DEVICE inline int64_t dcp_position(int64_t local, int64_t rank, int64_t world) {
  return local * world + rank;
}

// How many of positions [0, num_positions) rank caches.
HYSERVE_HOST_DEVICE inline int64_t dcp_local_count(int64_t num_positions, int64_t rank,
                                                   int64_t world) {
  return num_positions > rank ? (num_positions - rank + world - 1) / world : 0;
}

// The last of rank's local keys a query at position p sees (its causal bound among them),
// or -1 when rank caches no position <= p.
HYSERVE_HOST_DEVICE inline int64_t dcp_causal_bound(int64_t pos, int64_t rank, int64_t world) {
  return pos >= rank ? (pos - rank) / world : -1;
}

}  // namespace hyserve
