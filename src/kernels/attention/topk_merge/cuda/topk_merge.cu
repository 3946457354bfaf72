// CUDA top-k merge steps (cuda.h). Every kernel runs one block per row; steps 3 and 4
// find an undecided row's place among the resent rows by counting the undecided rows
// before it (rows are few: a step's queries).
#include <cuda_runtime.h>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/order_key.h"
#include "kernels/attention/topk_merge/check.h"
#include "kernels/attention/topk_merge/cuda.h"
#include "kernels/attention/topk_merge/verdict.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;  // kThreads * kItems == kTopkMergeMaxK: a row's keys in registers
static_assert(kThreads * kItems == kTopkMergeMaxK);

using BlockSort = cub::BlockRadixSort<uint64_t, kThreads, kItems>;
using BlockScan = cub::BlockScan<int, kThreads>;
using BlockReduce = cub::BlockReduce<int, kThreads>;

union TempStorage {
  typename BlockSort::TempStorage sort;
  typename BlockScan::TempStorage scan;
  typename BlockReduce::TempStorage reduce;
};

// Entries of a descending list a[0..n) that are > x (or >= x).
template <typename T>
__device__ int count_above(const T* a, int n, T x, bool or_equal) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a[mid] > x || (or_equal && a[mid] == x)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Round 1's message of rank r for `row`.
__device__ const uint32_t* message(const TopkMergeParams& p, int r, int64_t row) {
  return p.gathered + (r * p.rows + row) * (p.candidates + 1);
}

// The row's selection: the entries of the ascending local top-k whose key is among the
// first m sorted keys, in the same order, -1 padded. Block-wide; in place.
__device__ void apply(const TopkMergeParams& p, int64_t row, int m, TempStorage& tmp) {
  int32_t* sel = p.selected + row * p.k;
  const float* scores = p.scores + row * p.num_keys;
  const uint64_t cutoff = m > 0 ? p.sorted[row * p.k + m - 1] : 0;
  int32_t pos[kItems];
  int count = 0;
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = threadIdx.x * kItems + i;
    pos[i] = j < p.k ? sel[j] : -1;
    const bool keep = pos[i] >= 0 && m > 0 && float_rank_key(scores[pos[i]], pos[i]) >= cutoff;
    if (!keep) pos[i] = -1;
    count += keep ? 1 : 0;
  }
  int offset = 0;
  BlockScan(tmp.scan).ExclusiveSum(count, offset);
  __syncthreads();  // every entry read before any is written
  for (int i = 0; i < kItems; ++i) {
    if (pos[i] >= 0) sel[offset++] = pos[i];
  }
  for (int64_t j = m + threadIdx.x; j < p.k; j += kThreads) sel[j] = -1;
}

// The number of undecided rows before `row` (its index among the resent rows).
__device__ int resend_index(const TopkMergeParams& p, int64_t row, TempStorage& tmp) {
  int count = 0;
  for (int64_t r = threadIdx.x; r < row; r += kThreads) count += p.take[r] == -1 ? 1 : 0;
  return BlockReduce(tmp.reduce).Sum(count);  // valid in thread 0
}

__global__ void pack_kernel(TopkMergeParams p) {
  __shared__ TempStorage tmp;
  __shared__ int num_local;
  const int64_t row = blockIdx.x;
  const float* scores = p.scores + row * p.num_keys;
  uint64_t keys[kItems];
  int valid = 0;
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = threadIdx.x * kItems + i;
    const int32_t pos = j < p.k ? p.selected[row * p.k + j] : -1;
    keys[i] = pos >= 0 ? float_rank_key(scores[pos], pos) : 0;  // a valid key is > 0
    valid += pos >= 0 ? 1 : 0;
  }
  const int n = BlockReduce(tmp.reduce).Sum(valid);
  if (threadIdx.x == 0) num_local = n;
  __syncthreads();
  BlockSort(tmp.sort).SortDescending(keys);  // thread t: ranks t * kItems + i
  const int total = num_local;
  uint64_t* sorted = p.sorted + row * p.k;
  uint32_t* msg = p.send + row * (p.candidates + 1);
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = threadIdx.x * kItems + i;
    if (j < p.k) sorted[j] = j < total ? keys[i] : 0;
    if (j < p.candidates) msg[1 + j] = j < total ? static_cast<uint32_t>(keys[i] >> 32) : 0;
  }
  if (threadIdx.x == 0) msg[0] = static_cast<uint32_t>(total);
}

__global__ void decide_kernel(TopkMergeParams p) {
  extern __shared__ uint32_t lists[];  // [world, c + 1]: the row's messages
  __shared__ TempStorage tmp;
  __shared__ uint32_t threshold;
  __shared__ int take;
  const int64_t row = blockIdx.x;
  if (p.resend_all) {
    if (threadIdx.x == 0) {
      p.take[row] = -1;
      atomicAdd(p.num_undecided, 1);
    }
    return;
  }
  const int c = static_cast<int>(p.candidates), k = static_cast<int>(p.k), stride = c + 1;
  for (int i = threadIdx.x; i < p.world * stride; i += kThreads) {
    lists[i] = message(p, i / stride, row)[i % stride];
  }
  if (threadIdx.x == 0) threshold = 0;
  __syncthreads();
  const auto sent = [&](int r) { return min(c, static_cast<int>(lists[r * stride])); };
  int total = 0;
  for (int r = 0; r < p.world; ++r) total += sent(r);
  const bool all_in = total <= k;
  if (!all_in) {
    // T, the k-th largest key: the one with fewer than k keys above it and at least k at
    // or above it (every copy of it writes the same value).
    for (int i = threadIdx.x; i < p.world * c; i += kThreads) {
      const int r = i / c, j = i % c;
      if (j >= sent(r)) continue;
      const uint32_t x = lists[r * stride + 1 + j];
      int above = 0, at_or_above = 0;
      for (int q = 0; q < p.world; ++q) {
        above += count_above(lists + q * stride + 1, sent(q), x, false);
        at_or_above += count_above(lists + q * stride + 1, sent(q), x, true);
      }
      if (above < k && at_or_above >= k) threshold = x;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t t = threshold;
    take = static_cast<int>(topk_merge_verdict(p.world, p.rank, k, all_in, [&](int r) {
      const uint32_t* list = lists + r * stride + 1;
      TopkMergeCounts n;
      n.sent = sent(r);
      // The unsent keys of r are <= its c-th: they matter when that one is in.
      n.unsent_in = static_cast<int64_t>(lists[r * stride]) > c && list[c - 1] >= t;
      n.above = all_in ? 0 : count_above(list, sent(r), t, false);
      n.tied = all_in ? 0 : count_above(list, sent(r), t, true) - n.above;
      return n;
    }));
    p.take[row] = take;
    if (take < 0) atomicAdd(p.num_undecided, 1);
  }
  __syncthreads();
  if (take >= 0) apply(p, row, take, tmp);
}

__global__ void resend_pack_kernel(TopkMergeParams p) {
  __shared__ TempStorage tmp;
  __shared__ int index;
  const int64_t row = blockIdx.x;
  if (p.take[row] != -1) return;
  const int j = resend_index(p, row, tmp);
  if (threadIdx.x == 0) index = j;
  __syncthreads();
  const int64_t n = p.send[row * (p.candidates + 1)];
  for (int64_t i = threadIdx.x; i < p.k; i += kThreads) {
    const uint64_t key = p.sorted[row * p.k + i];
    const int64_t local = 0xffffffffu - static_cast<uint32_t>(key);
    p.send2[index * p.k + i] =
        i < n ? (key & 0xffffffff00000000ull) |
                    (0xffffffffu - static_cast<uint32_t>(local * p.world + p.rank))
              : 0;
  }
}

__global__ void resend_decide_kernel(TopkMergeParams p) {
  __shared__ TempStorage tmp;
  __shared__ int index, take;
  const int64_t row = blockIdx.x;
  if (p.take[row] != -1) return;
  const int j = resend_index(p, row, tmp);
  if (threadIdx.x == 0) index = j;
  __syncthreads();
  const int k = static_cast<int>(p.k);
  const auto list = [&](int r) { return p.gathered2 + (r * p.num_resend + index) * p.k; };
  // A list's keys: sorted descending, 0 after the last (a key is never 0).
  const auto count = [&](int r) { return count_above(list(r), k, uint64_t{0}, false); };
  // A key of this rank is in when fewer than k keys (unique) are above it.
  int in = 0;
  const uint64_t* mine = list(p.rank);
  for (int i = threadIdx.x; i < count(p.rank); i += kThreads) {
    int above = 0;
    for (int r = 0; r < p.world; ++r) above += count_above(list(r), count(r), mine[i], false);
    in += above < k ? 1 : 0;
  }
  __syncthreads();  // tmp reused
  const int m = BlockReduce(tmp.reduce).Sum(in);
  // take[] is left as it is: the other blocks count the undecided rows by it.
  if (threadIdx.x == 0) take = m;
  __syncthreads();
  apply(p, row, take, tmp);
}

// validate(p, step), then the CUDA-only limit: one block per row.
void check(const TopkMergeParams& p, TopkMergeStep step) {
  validate(p, step);
  CHECK(p.rows < (int64_t{1} << 31), topk_merge_op_name(step), ": rows ", p.rows,
        " above 2^31 - 1");
}

}  // namespace

void topk_merge_pack(const TopkMergeParams& p, cudaStream_t stream) {
  check(p, TopkMergeStep::kPack);
  if (p.rows == 0) return;
  pack_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void topk_merge_decide(const TopkMergeParams& p, cudaStream_t stream) {
  check(p, TopkMergeStep::kDecide);
  CUDA_CHECK(cudaMemsetAsync(p.num_undecided, 0, sizeof(int32_t), stream));
  if (p.rows == 0) return;
  const size_t shared = static_cast<size_t>(p.world) * (p.candidates + 1) * sizeof(uint32_t);
  // CUDA-only limit: every rank's round-1 message of a row in one block's shared memory.
  CHECK(shared <= 48 * 1024, "topk_merge_decide: ", p.world, " ranks x ", p.candidates + 1,
        " keys per row exceed the shared memory of one block");
  decide_kernel<<<static_cast<unsigned>(p.rows), kThreads, shared, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void topk_merge_resend_pack(const TopkMergeParams& p, cudaStream_t stream) {
  check(p, TopkMergeStep::kResendPack);
  if (p.rows == 0 || p.num_resend == 0) return;
  resend_pack_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void topk_merge_resend_decide(const TopkMergeParams& p, cudaStream_t stream) {
  check(p, TopkMergeStep::kResendDecide);
  if (p.rows == 0 || p.num_resend == 0) return;
  resend_decide_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hyserve::cuda
