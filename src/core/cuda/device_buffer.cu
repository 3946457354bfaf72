#include "core/cuda/device_buffer.h"

#include <utility>

namespace hyserve::cuda {

DeviceBuffer::DeviceBuffer(size_t num_bytes) : bytes_(num_bytes) {
  if (num_bytes > 0) CUDA_CHECK(cudaMalloc(&ptr_, num_bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t num_bytes, size_t offset) {
  CHECK(offset + num_bytes <= bytes_, "upload of ", num_bytes, " bytes at ", offset,
        " overruns a buffer of ", bytes_);
  CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, num_bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, size_t num_bytes, size_t offset) const {
  CHECK(offset + num_bytes <= bytes_, "download of ", num_bytes, " bytes at ", offset,
        " overruns a buffer of ", bytes_);
  CUDA_CHECK(
      cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, num_bytes, cudaMemcpyDeviceToHost));
}

MemoryInfo memory_info() {
  MemoryInfo m;
  CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

}  // namespace hyserve::cuda
