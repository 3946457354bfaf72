// CUDA causal top-k (cuda.h): one block per query row, an exact radix select on the
// score bits, then an ordered compaction.
//
//   key(x) = order-preserving uint32 of x (-0 mapped to +0, so they tie as on the CPU)
//   4 passes of 8 bits: histogram the candidates sharing the prefix found so far, walk
//   the bins from the top -> the keep-th largest key K and how many of the keys equal
//   to K are needed (`need`).
//   Compaction, in ascending position order, tile by tile: take key > K, and key == K
//   while fewer than `need` equal keys were taken (lower positions win). The output is
//   therefore sorted ascending with no extra sort, and the row is read 5 times with no
//   workspace for any S.
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>

#include <limits>

#include "kernels/indexer/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kRadixBits = 8;
constexpr int kNumBins = 1 << kRadixBits;

__device__ uint32_t order_key(float x) {
  const uint32_t bits = x == 0.0f ? 0u : __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__global__ void causal_topk_kernel(const float* scores, const int64_t* q_pos, int64_t num_keys,
                                   int64_t topk, int32_t* out) {
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int hist[kNumBins];
  __shared__ uint32_t prefix_s;
  __shared__ int64_t need_s;

  const int64_t t = blockIdx.x;
  const float* row = scores + t * num_keys;
  int32_t* dst = out + t * topk;
  const int64_t last = q_pos[t] < num_keys ? q_pos[t] : num_keys - 1;
  const int64_t num_visible = last < 0 ? 0 : last + 1;
  const int64_t keep = topk < num_visible ? topk : num_visible;

  for (int64_t i = keep + threadIdx.x; i < topk; i += kThreads) dst[i] = -1;
  if (keep == num_visible) {
    for (int64_t i = threadIdx.x; i < keep; i += kThreads) dst[i] = static_cast<int32_t>(i);
    return;
  }

  // Radix select of the keep-th largest key.
  uint32_t prefix = 0, mask = 0;
  int64_t need = keep;  // how many of the keys matching prefix/mask are still to take
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int b = threadIdx.x; b < kNumBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int64_t s = threadIdx.x; s < num_visible; s += kThreads) {
      const uint32_t key = order_key(row[s]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & (kNumBins - 1)], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t above = 0;
      int bin = kNumBins - 1;
      for (; bin > 0 && above + hist[bin] < need; --bin) above += hist[bin];
      prefix_s = prefix | (static_cast<uint32_t>(bin) << shift);
      need_s = need - above;
    }
    __syncthreads();
    prefix = prefix_s;
    need = need_s;
    mask |= static_cast<uint32_t>(kNumBins - 1) << shift;
  }
  const uint32_t threshold = prefix;

  // Ordered compaction.
  int64_t num_taken = 0;
  int64_t num_equal_seen = 0;
  for (int64_t base = 0; base < num_visible && num_taken < keep; base += kThreads) {
    const int64_t s = base + threadIdx.x;
    const uint32_t key = s < num_visible ? order_key(row[s]) : 0u;
    const bool valid = s < num_visible;
    const int is_equal = valid && key == threshold;
    int equal_before = 0, equal_total = 0;
    BlockScan(scan_storage).ExclusiveSum(is_equal, equal_before, equal_total);
    __syncthreads();
    const int take =
        valid && (key > threshold || (is_equal && num_equal_seen + equal_before < need));
    int taken_before = 0, taken_total = 0;
    BlockScan(scan_storage).ExclusiveSum(take, taken_before, taken_total);
    __syncthreads();
    if (take) dst[num_taken + taken_before] = static_cast<int32_t>(s);
    num_taken += taken_total;
    num_equal_seen += equal_total;
  }
}

}  // namespace

void causal_topk(const float* scores, const int64_t* q_pos, int64_t T, int64_t S, int64_t topk,
                 int32_t* out, cudaStream_t stream) {
  CHECK(T >= 0 && S >= 0 && topk > 0, "T ", T, ", S ", S, ", topk ", topk);
  CHECK(S <= std::numeric_limits<int32_t>::max(), "S ", S, " does not fit int32 positions");
  CHECK(T < (int64_t{1} << 31), "T ", T);
  if (T == 0) return;
  CHECK(q_pos != nullptr && out != nullptr, "null q_pos or out");
  if (S > 0) CHECK(scores != nullptr, "null scores");
  causal_topk_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(scores, q_pos, S, topk,
                                                                        out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
