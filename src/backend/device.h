// Device: the memory and ordering half of a backend, what the KV cache, the workspace, the
// communicators and the decode step's buffers need: allocations, copies, host-pinned
// buffers, fences, graph capture and replay. The ops live on Backend (backend.h), which is
// a Device; code that only moves memory includes this header and takes a Device.
//
// Ordering: every copy and op is issued on the device's one stream (the CPU runs each on
// the caller's thread as it is issued); fences mark a point in that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "util/error.h"

namespace hyserve {

enum class DeviceKind { kCpu, kCuda };

// A device's own memory, free now and in all, in bytes.
struct DeviceMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;

  // Memory (setup time). allocate() returns zeroed, 256-byte aligned memory.
  virtual void* allocate(size_t num_bytes) = 0;
  virtual void release(void* ptr) = 0;
  // Ordered with the ops: device-to-device, host-to-device, device-to-host.
  virtual void copy(void* dst, const void* src, size_t num_bytes) = 0;
  virtual void upload(void* dst, const void* host_src, size_t num_bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t num_bytes) = 0;
  virtual void fill_zero(void* dst, size_t num_bytes) = 0;
  // Waits until every op issued so far is done.
  virtual void synchronize() = 0;
  // The device's memory now (what the worker plans the KV pool from), or none for a device
  // without memory of its own (the CPU: host memory, budgeted by --kv-cache-memory-bytes).
  virtual std::optional<DeviceMemoryInfo> memory_info() const { return std::nullopt; }
  // Host memory a device copies into without a staging copy (pinned on CUDA), for
  // download_async. The default is plain host memory.
  virtual void* allocate_host(size_t num_bytes);
  virtual void release_host(void* ptr);
  // A device-to-host copy ordered with the ops that does not wait for them: host_dst (from
  // allocate_host) holds the bytes once a fence issued after it has been waited for. The
  // default copies at once (a device whose ops run on the caller's thread).
  virtual void download_async(void* host_dst, const void* src, size_t num_bytes) {
    download(host_dst, src, num_bytes);
  }
  // A fence after every op issued so far; wait_fence(f) returns once they are all done
  // (fences are waited for at most once, in any order; waiting for a later one also ends
  // the earlier ones). The defaults: ops are done when issued.
  virtual uint64_t fence() { return 0; }
  virtual void wait_fence(uint64_t /*fence*/) {}
  // After freeze() the device allocates nothing (CUDA graphs replay safely); an op that
  // would need more scratch memory than it had throws.
  virtual void freeze() {}
  // Allows allocations again (sleep mode's wake-up reallocates the cache and the weights, with
  // every graph released; freeze() again after).
  virtual void unfreeze() {}
  virtual bool frozen() const { return false; }
  // The stream ops are issued on (cudaStream_t for CUDA), or null.
  virtual void* native_stream() const { return nullptr; }

  // Graphs (CUDA graphs for decode). capture_graph records the ops `fn` issues into graph
  // `id` without running them, replacing an earlier graph of that id; replay_graph runs
  // it. The ops read and write the same memory at every replay; fn must not allocate.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_graph(int64_t id, const std::function<void()>& /*fn*/) {
    HYSERVE_THROW(InvalidArgument, "this device has no graphs (graph ", id, ")");
  }
  virtual void replay_graph(int64_t id) {
    HYSERVE_THROW(InvalidArgument, "this device has no graphs (graph ", id, ")");
  }
  // Frees graph `id` (none captured: nothing to do).
  virtual void release_graph(int64_t /*id*/) {}
};

// One allocation in a device's memory (or, kHost, the host memory it copies into without
// staging: Device::allocate_host), freed on destruction. Setup only: the forward pass
// itself never allocates.
// Lets a frozen device allocate while it lives (sleep mode's wake-up, a weight transfer's
// buffers, between steps with every graph released or untouched), then freezes it again;
// nothing on a device that was not frozen.
class UnfrozenScope {
 public:
  explicit UnfrozenScope(Device& device) : device_(device), was_frozen_(device.frozen()) {
    if (was_frozen_) device_.unfreeze();
  }
  ~UnfrozenScope() {
    if (was_frozen_) device_.freeze();
  }
  UnfrozenScope(const UnfrozenScope&) = delete;
  UnfrozenScope& operator=(const UnfrozenScope&) = delete;

 private:
  Device& device_;
  bool was_frozen_;
};

class DeviceAllocation {
 public:
  enum class Memory { kDevice, kHost };
  DeviceAllocation() = default;
  DeviceAllocation(Device* device, size_t num_bytes, Memory memory = Memory::kDevice);
  ~DeviceAllocation();
  DeviceAllocation(DeviceAllocation&& o) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void free();

  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Memory memory_ = Memory::kDevice;
};

}  // namespace hyserve
