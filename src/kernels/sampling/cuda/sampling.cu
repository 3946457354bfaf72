// CUDA token sampling, one block per row, no workspace: every pass re-reads the row's
// logits and recomputes the fixed-point weights (params.h).
//   1. argmax (NaN skipped, ties to the lower id) and the count of non-NaN ids
//   2. top-k: the top_k-th largest rank key, by radix selection (8 passes of 8 bits)
//   3. top-p: the rank key where the weight sum of keys >= it first reaches the target
//      (same radix selection, histograms of weights)
//   4. the kept total, r, and a block-wide running sum in id order to find the token
// All sums are integer (shared-memory atomics and cub reductions on uint64), so the
// result does not depend on thread scheduling.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/sampling/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using sampling::kMaxWeight;
using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kDigits = 256;

struct Best {
  float value;
  int32_t id;  // -1: none
};

struct FirstBest {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.id < 0) return b;
    if (b.id < 0) return a;
    return (a.value > b.value || (a.value == b.value && a.id < b.id)) ? a : b;
  }
};

struct Shared {
  union {
    cub::BlockReduce<Best, kThreads>::TempStorage best;
    cub::BlockReduce<u64, kThreads>::TempStorage sum;
    cub::BlockScan<u64, kThreads>::TempStorage scan;
  } tmp;
  u64 histogram[kDigits];
  u64 broadcast;
  Best best;
};

__device__ u64 block_sum(u64 v, Shared& s) {
  const u64 total = cub::BlockReduce<u64, kThreads>(s.tmp.sum).Sum(v);
  if (threadIdx.x == 0) s.broadcast = total;
  __syncthreads();
  const u64 out = s.broadcast;
  __syncthreads();
  return out;
}

// The largest rank key c such that the sum of value(i) over non-NaN ids with
// lower <= key(i) and key(i) >= c reaches target (which that sum over all keys >= lower
// must reach). value(i) is 1 (counting) or the token weight.
template <bool kWeighted>
__device__ uint64_t select_key(const float* logits, int64_t vocab, float max_logit,
                               double inv_temperature, uint64_t lower, uint64_t target, Shared& s) {
  uint64_t prefix = 0;
  uint64_t above = 0;  // value of the keys above the current prefix range
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t high_mask = shift == 56 ? 0 : ~uint64_t{0} << (shift + 8);
    for (int d = threadIdx.x; d < kDigits; d += kThreads) s.histogram[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = logits[i];
      if (isnan(l)) continue;
      const uint64_t key = sampling::rank_key(l, i);
      if (key < lower || (key & high_mask) != prefix) continue;
      const uint64_t v =
          kWeighted ? sampling::token_weight(l, max_logit, inv_temperature) : uint64_t{1};
      if (v != 0) atomicAdd(&s.histogram[(key >> shift) & 0xff], static_cast<u64>(v));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = kDigits - 1;
      for (; d > 0; --d) {
        if (above + s.histogram[d] >= target) break;
        above += s.histogram[d];
      }
      s.broadcast = prefix | (static_cast<uint64_t>(d) << shift);
    }
    __syncthreads();
    prefix = s.broadcast;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ all_logits, const SamplingOptions* __restrict__ options,
                  int32_t* __restrict__ tokens, int64_t vocab) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const float* logits = all_logits + row * vocab;
  const SamplingOptions o = options[row];
  if (!sampling::options_valid(o)) {
    if (threadIdx.x == 0) tokens[row] = -1;
    return;
  }

  Best mine{0.0f, -1};
  uint64_t num_valid = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = logits[i];
    if (isnan(l)) continue;
    ++num_valid;
    if (mine.id < 0 || l > mine.value) mine = Best{l, static_cast<int32_t>(i)};
  }
  const Best best = cub::BlockReduce<Best, kThreads>(s.tmp.best).Reduce(mine, FirstBest());
  if (threadIdx.x == 0) s.best = best;
  __syncthreads();
  const Best top = s.best;
  num_valid = block_sum(num_valid, s);
  if (top.id < 0 || o.temperature == 0.0f) {
    if (threadIdx.x == 0) tokens[row] = top.id;
    return;
  }
  const float max_logit = top.value;
  const double inv_temperature = sampling::inverse_temperature(o.temperature);

  uint64_t lower = 0;
  if (o.top_k > 0 && static_cast<uint64_t>(o.top_k) < num_valid) {
    lower = select_key<false>(logits, vocab, max_logit, inv_temperature, 0,
                              static_cast<uint64_t>(o.top_k), s);
  }
  if (o.top_p < 1.0f) {
    uint64_t part = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = logits[i];
      if (!isnan(l) && sampling::rank_key(l, i) >= lower) {
        part += sampling::token_weight(l, max_logit, inv_temperature);
      }
    }
    const uint64_t total = block_sum(part, s);
    const uint64_t at_least = sampling::ceil_mul(o.top_p, total);
    const uint64_t target = at_least > 0 ? at_least : 1;
    lower = select_key<true>(logits, vocab, max_logit, inv_temperature, lower, target, s);
  }

  const uint64_t min_weight = sampling::ceil_mul(o.min_p, kMaxWeight);
  const auto kept_weight = [&](int64_t i) -> uint64_t {
    if (i >= vocab) return 0;
    const float l = logits[i];
    if (isnan(l) || sampling::rank_key(l, i) < lower) return 0;
    const uint64_t w = sampling::token_weight(l, max_logit, inv_temperature);
    return w >= min_weight ? w : 0;
  };
  uint64_t part = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) part += kept_weight(i);
  const uint64_t total = block_sum(part, s);
  const uint64_t r = sampling::scale_draw(sampling::draw_bits(o.seed, o.step), total);

  uint64_t running = 0;  // kept weight of the ids before this chunk
  for (int64_t base = 0; base < vocab; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const uint64_t w = kept_weight(i);
    u64 inclusive, chunk_total;
    cub::BlockScan<u64, kThreads>(s.tmp.scan)
        .InclusiveSum(static_cast<u64>(w), inclusive, chunk_total);
    if (w != 0 && running + inclusive > r && running + inclusive - w <= r) {
      tokens[row] = static_cast<int32_t>(i);
    }
    running += chunk_total;
    __syncthreads();
    if (running > r) return;
  }
}

}  // namespace

void sample_tokens(const SampleParams& p, cudaStream_t stream) {
  CHECK(p.num_rows >= 0, "sample_tokens: num_rows ", p.num_rows);
  CHECK(p.vocab > 0 && p.vocab <= kMaxSamplingVocab, "sample_tokens: vocab ", p.vocab,
        " not in [1, ", kMaxSamplingVocab, "]");
  if (p.num_rows == 0) return;
  CHECK(p.logits != nullptr && p.options != nullptr && p.tokens != nullptr,
        "sample_tokens: null pointer");
  CHECK(p.num_rows <= INT32_MAX, "sample_tokens: num_rows over 2^31");
  sample_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p.logits, p.options,
                                                                            p.tokens, p.vocab);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
