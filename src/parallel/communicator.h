// Communicator: the collectives tensor and context parallelism need, over a group of
// ranks (one process per GPU, or per CPU shard). Implementations wrap a collective library
// (never hand-written collectives): NCCL for the CUDA backend (parallel/cuda/), Gloo for
// the CPU backend (parallel/gloo/).
//
// Buffers are in the backend's memory: host memory for Gloo, device memory for NCCL,
// where the collective is issued on the backend's stream (ordered with its ops, not
// waited for). Every rank calls the same collectives in the same order with the same sizes.
// A peer that died, or a collective that does not finish within the timeout, throws
// CommError naming the rank when it is known; the group is unusable afterwards.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/error.h"

namespace hyserve::parallel {

// A collective failed: a peer died or hung, or the library reported an error.
class CommError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0..n) = op over ranks of every rank's data[0..n), in place. The order of the
  // sum across ranks is the library's (it may depend on n); all_gather and a local sum
  // in rank order give a fixed one.
  virtual void all_reduce(float* data, int64_t n, ReduceOp op = ReduceOp::kSum) = 0;
  // recv[r * bytes .. (r + 1) * bytes) = rank r's send[0..bytes).
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // recv[r * bytes ..) = rank r's send[rank() * bytes ..): block i of send goes to rank i.
  virtual void all_to_all(const void* send, void* recv, size_t bytes) = 0;
  // data[0..bytes) = root's data[0..bytes) on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Returns once every rank has called it (and, for a device communicator, once the
  // collectives issued before it are done).
  virtual void barrier() = 0;
};

}  // namespace hyserve::parallel
