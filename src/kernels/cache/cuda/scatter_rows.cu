// CUDA cache write: one thread block per row, 16-, 4- or 1-byte words as the
// alignment of the row allows.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cache/check.h"
#include "kernels/cache/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 128;

template <typename Word>
__global__ void scatter_rows_kernel(ScatterRowsParams p) {
  const int64_t i = blockIdx.x;
  const int64_t slot = p.slots[i];
  if (slot < 0) return;
  const auto* src =
      reinterpret_cast<const Word*>(static_cast<const char*>(p.src) + i * p.row_bytes);
  auto* dst = reinterpret_cast<Word*>(static_cast<char*>(p.dst) +
                                      (slot / p.block_size) * p.block_stride_bytes +
                                      (slot % p.block_size) * p.row_bytes);
  const int64_t words = p.row_bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

bool aligned_to(const ScatterRowsParams& p, int64_t word) {
  return p.row_bytes % word == 0 && p.block_stride_bytes % word == 0 &&
         reinterpret_cast<uintptr_t>(p.src) % word == 0 &&
         reinterpret_cast<uintptr_t>(p.dst) % word == 0;
}

}  // namespace

void scatter_rows(const ScatterRowsParams& p, cudaStream_t stream) {
  check_scatter_rows(p);
  if (p.num_rows == 0) return;
  CHECK(p.num_rows < (int64_t{1} << 31), "scatter_rows: ", p.num_rows, " rows");
  const auto grid = static_cast<unsigned>(p.num_rows);
  if (aligned_to(p, 16)) {
    scatter_rows_kernel<uint4><<<grid, kThreads, 0, stream>>>(p);
  } else if (aligned_to(p, 4)) {
    scatter_rows_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(p);
  } else {
    scatter_rows_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(p);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
