// Device: the default host-memory hooks and DeviceAllocation.
#include "backend/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace hyserve {

DeviceAllocation::DeviceAllocation(Device* device, size_t num_bytes, Memory memory)
    : device_(device), bytes_(num_bytes), memory_(memory) {
  if (num_bytes == 0) return;
  ptr_ = memory == Memory::kHost ? device->allocate_host(num_bytes) : device->allocate(num_bytes);
}

void DeviceAllocation::free() {
  if (ptr_ == nullptr) return;
  if (memory_ == Memory::kHost) {
    device_->release_host(ptr_);
  } else {
    device_->release(ptr_);
  }
  ptr_ = nullptr;
}

DeviceAllocation::~DeviceAllocation() {
  free();
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& o) noexcept
    : device_(o.device_),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      memory_(o.memory_) {}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
  if (this != &o) {
    free();
    device_ = o.device_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    memory_ = o.memory_;
  }
  return *this;
}

void* Device::allocate_host(size_t num_bytes) {
  const size_t rounded = (std::max<size_t>(num_bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  CHECK(p != nullptr, "cannot allocate ", num_bytes, " bytes of host memory");
  std::memset(p, 0, rounded);
  return p;
}

void Device::release_host(void* ptr) {
  std::free(ptr);
}

}  // namespace hyserve
