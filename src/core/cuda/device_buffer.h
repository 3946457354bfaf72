// DeviceBuffer: one cudaMalloc'd range, freed on destruction; typed views over it.
// Used for weights uploaded once and for preallocated per-step buffers, never per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/cuda_check.h"

namespace hyserve::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t num_bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

  // Synchronous copies (setup and tests).
  void upload(const void* src, size_t num_bytes, size_t offset = 0);
  void download(void* dst, size_t num_bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Uploads a host vector into a new buffer.
template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// Downloads count elements of type T.
template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  if (count) b.download(v.data(), count * sizeof(T));
  return v;
}

// Number of CUDA devices usable by this process (0 when no driver or no GPU).
int device_count();

// Free and total memory of the current device, in bytes.
struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
MemoryInfo memory_info();

}  // namespace hyserve::cuda
