// The CPU backend's Communicator, over Gloo's TCP transport. The ranks meet through a
// Store (keys under prefix + "/"), then every pair of ranks holds a TCP connection
// (connectFullMesh). Gloo's errors (a peer that died, a timeout) become CommError naming
// this rank and the group size, and the peer when Gloo's message names it; after one the
// communicator refuses further collectives.
//
// The ranks are processes (or threads) of one host: Gloo's device listens on 127.0.0.1.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace hyserve::parallel {

// Blocks until all size ranks have joined (or timeout: CommError). timeout also bounds
// every collective. Size 1 needs no peers and makes no Gloo calls.
std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int size,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& prefix);

}  // namespace hyserve::parallel
