// Workspace: the forward pass's scratch memory, a bump allocator over device
// memory. reset() at the start of a forward; mark()/rewind() free what a
// per-sequence step took. It grows by adding blocks (never moving earlier ones)
// until freeze(); after that a request beyond capacity is an error, so a frozen
// workspace (CUDA graphs, the hot path) never allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/device.h"

namespace hyserve {

class Workspace {
 public:
  // Every take is rounded up to a multiple of this (its address stays aligned to it).
  static constexpr size_t kAlignBytes = 256;

  explicit Workspace(Device* device) : device_(device) {}

  struct Mark {
    size_t block;
    size_t offset;
  };

  void reset();
  Mark mark() const { return {current_, offset_}; }
  void rewind(Mark m);

  float* floats(int64_t n) { return static_cast<float*>(take(static_cast<size_t>(n) * 4)); }
  int32_t* ints(int64_t n) { return static_cast<int32_t*>(take(static_cast<size_t>(n) * 4)); }
  int64_t* longs(int64_t n) { return static_cast<int64_t*>(take(static_cast<size_t>(n) * 8)); }
  uint8_t* bytes(int64_t n) { return static_cast<uint8_t*>(take(static_cast<size_t>(n))); }

  // Replaces the blocks by one of at least num_bytes (and at least the capacity so far):
  // a forward whose live scratch never exceeds it then never grows the workspace. Only
  // before anything keeps workspace addresses (captured graphs).
  void reserve(size_t num_bytes);
  // Merges the blocks into one of the peak size seen, then forbids growth.
  void freeze();
  size_t num_blocks() const { return blocks_.size(); }
  bool frozen() const { return frozen_; }
  size_t capacity_bytes() const;

 private:
  void* take(size_t num_bytes);

  Device* device_;
  std::vector<DeviceAllocation> blocks_;
  size_t current_ = 0;  // block in use
  size_t offset_ = 0;   // bytes used in it
  bool frozen_ = false;
};

}  // namespace hyserve
