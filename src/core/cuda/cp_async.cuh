// Asynchronous global -> shared copies (cp.async, sm_80+): a thread's copies complete in
// the order of its commit groups; cp_async_wait<n>() waits until at most n of its groups
// are pending, and a barrier after it makes every thread's copies visible to the block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hyserve::cuda {

// 16-byte async copy global -> shared (L2 only); src_bytes 0 fills zeros without reading.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace hyserve::cuda
