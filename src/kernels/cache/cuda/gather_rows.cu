// CUDA cache read (params.h, the reverse of scatter_rows.cu): one thread block per row, the
// row's block id read from the block table on the device, 16-, 4- or 1-byte words as the
// alignment of the rows allows.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cache/check.h"
#include "kernels/cache/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 128;

template <typename Word>
__global__ void gather_rows_kernel(GatherRowsParams p) {
  const int64_t i = blockIdx.x;
  const auto* src = reinterpret_cast<const Word*>(static_cast<const char*>(p.src) +
                                                  p.src_pages.byte_offset(i, p.row_bytes));
  auto* dst = reinterpret_cast<Word*>(static_cast<char*>(p.dst) + i * p.dst_stride_bytes);
  const int64_t words = p.row_bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

bool aligned_to(const GatherRowsParams& p, int64_t word) {
  return p.row_bytes % word == 0 && p.dst_stride_bytes % word == 0 &&
         (!p.src_pages.paged() || p.src_pages.block_stride_bytes % word == 0) &&
         reinterpret_cast<uintptr_t>(p.src) % word == 0 &&
         reinterpret_cast<uintptr_t>(p.dst) % word == 0;
}

}  // namespace

void gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  check_gather_rows(p);
  if (p.num_rows == 0) return;
  CHECK(p.num_rows < (int64_t{1} << 31), "gather_rows: ", p.num_rows, " rows");
  const auto grid = static_cast<unsigned>(p.num_rows);
  if (aligned_to(p, 16)) {
    gather_rows_kernel<uint4><<<grid, kThreads, 0, stream>>>(p);
  } else if (aligned_to(p, 4)) {
    gather_rows_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(p);
  } else {
    gather_rows_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(p);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
