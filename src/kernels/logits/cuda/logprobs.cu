// CUDA token_logprobs: one block per row, no workspace; every pass re-reads the row.
//   1. max logit (NaN never wins) and the number of ids whose logprob_key (cpu.h) is above
//      the target's: the rank, an integer count, so exactly the CPU's
//   2. sum over non-NaN ids of exp(double(l) - max), a cub reduction in double; log_z as
//      on the CPU. Only this sum's order (and the device exp / log) differs from the CPU.
//   3. top_n > 0: the k-th largest key (k = min(top_n, vocab)) by radix selection over the
//      64-bit keys (8 passes of 8-bit histograms, integer counts), then the k ids with a
//      key at or above it, sorted by one thread.
#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>

#include "kernels/logits/cpu.h"
#include "kernels/logits/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using logits::logprob_key;

constexpr int kThreads = 512;
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;

struct Larger {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

struct Shared {
  cub::BlockReduce<float, kThreads>::TempStorage max_tmp;
  cub::BlockReduce<unsigned, kThreads>::TempStorage count_tmp;
  cub::BlockReduce<double, kThreads>::TempStorage sum_tmp;
  unsigned histogram[kDigits];
  uint64_t top[kMaxTopLogprobs];
  unsigned num_top;
  float max_logit;
  double sum;
  uint64_t prefix;
};

// The k-th largest logprob_key of the row (keys are unique; 1 <= k <= vocab).
__device__ uint64_t kth_largest_key(const float* l, int64_t vocab, unsigned k, Shared& s) {
  uint64_t prefix = 0;
  unsigned above = 0;  // thread 0: keys above the range the prefix leaves open
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint64_t high_mask = shift == 64 - kDigitBits ? 0 : ~uint64_t{0} << (shift + kDigitBits);
    for (int d = threadIdx.x; d < kDigits; d += kThreads) s.histogram[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint64_t key = logprob_key(l[i], i);
      if ((key & high_mask) == prefix) atomicAdd(&s.histogram[(key >> shift) & (kDigits - 1)], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = kDigits - 1;
      for (; d > 0; --d) {
        if (above + s.histogram[d] >= k) break;
        above += s.histogram[d];
      }
      s.prefix = prefix | (static_cast<uint64_t>(d) << shift);
    }
    __syncthreads();
    prefix = s.prefix;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) logprob_kernel(LogprobParams p) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const float* l = p.logits + row * p.vocab;
  const int32_t target = p.targets[row];
  const bool target_valid = target >= 0 && target < p.vocab;
  const uint64_t target_key = target_valid ? logprob_key(l[target], target) : ~uint64_t{0};

  float max_part = -INFINITY;
  unsigned before_part = 0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (v > max_part) max_part = v;
    before_part += logprob_key(v, i) > target_key;
  }
  const float max_logit = cub::BlockReduce<float, kThreads>(s.max_tmp).Reduce(max_part, Larger());
  const unsigned before = cub::BlockReduce<unsigned, kThreads>(s.count_tmp).Sum(before_part);
  if (threadIdx.x == 0) s.max_logit = max_logit;
  __syncthreads();
  const double max_d = static_cast<double>(s.max_logit);

  double sum_part = 0.0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (!isnan(v)) sum_part += exp(static_cast<double>(v) - max_d);
  }
  const double sum = cub::BlockReduce<double, kThreads>(s.sum_tmp).Sum(sum_part);
  if (threadIdx.x == 0) {
    s.sum = sum;
    s.num_top = 0;
  }
  __syncthreads();
  const double log_z = max_d + log(s.sum);
  const auto logprob = [&](int64_t id) {
    return static_cast<float>(static_cast<double>(l[id]) - log_z);
  };
  if (threadIdx.x == 0) {
    p.logprob[row] = target_valid ? logprob(target) : NAN;
    p.rank[row] = target_valid ? 1 + static_cast<int64_t>(before) : 0;
  }
  if (p.top_n == 0) return;

  const auto k = static_cast<unsigned>(p.top_n < p.vocab ? p.top_n : p.vocab);
  const uint64_t threshold = kth_largest_key(l, p.vocab, k, s);
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const uint64_t key = logprob_key(l[i], i);
    if (key >= threshold) s.top[atomicAdd(&s.num_top, 1u)] = key;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned j = 1; j < k; ++j) {  // insertion sort, largest key first
      const uint64_t key = s.top[j];
      unsigned at = j;
      for (; at > 0 && s.top[at - 1] < key; --at) s.top[at] = s.top[at - 1];
      s.top[at] = key;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < p.top_n; j += kThreads) {
    const int32_t id = j < static_cast<int>(k) ? logits::logprob_key_id(s.top[j]) : -1;
    p.top_ids[row * p.top_n + j] = id;
    p.top_logprobs[row * p.top_n + j] = id >= 0 ? logprob(id) : -INFINITY;
  }
}

}  // namespace

void token_logprobs(const LogprobParams& p, cudaStream_t stream) {
  CHECK(p.num_rows >= 0, "token_logprobs: num_rows ", p.num_rows);
  CHECK(p.vocab > 0 && p.vocab <= INT32_MAX, "token_logprobs: vocab ", p.vocab,
        " not in [1, 2^31)");
  CHECK(p.top_n >= 0 && p.top_n <= kMaxTopLogprobs, "token_logprobs: top_n ", p.top_n,
        " not in [0, ", kMaxTopLogprobs, "]");
  if (p.num_rows == 0) return;
  CHECK(p.logits && p.targets && p.logprob && p.rank, "token_logprobs: null pointer");
  CHECK(p.top_n == 0 || (p.top_ids && p.top_logprobs),
        "token_logprobs: null top_ids / top_logprobs");
  CHECK(p.num_rows <= INT32_MAX, "token_logprobs: num_rows ", p.num_rows, " over 2^31");
  logprob_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
