// CUDA token sampling, one block per row. The fixed-point weights (params.h) are computed
// once per row into the caller's scratch (SampleParams::weights); later passes re-read
// them with the row's logits (for the rank keys).
//   1. argmax (NaN skipped, ties to the lower id) and the count of non-NaN ids
//   2. the weights W_i (0 for NaN)
//   3. top-k: the top_k-th largest rank key, by radix selection (8 passes of 8 bits;
//      each thread adds a run of equal digits to the shared histogram at once; one warp
//      finds the pass's digit by a suffix scan)
//   4. top-p: the rank key where the weight sum of keys >= it first reaches the target
//      (same radix selection, histograms of weights)
//   5. the kept total and r; each thread sums the kept weights of a contiguous range of
//      ids, one exclusive scan over the threads finds the range holding r, and its thread
//      walks it in id order to the token
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
  u64 above;  // select_digit's running sum of the digits above the chosen one
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

// Warp 0: the largest digit d >= 1 with above + (sum of histogram[d..255]) >= target, else
// 0 (the serial walk from digit 255 down, in one warp: each lane sums 8 digits, a suffix
// scan over the lanes finds the lane holding d, and that lane walks its 8 digits). Sets
// s.above to above + the sum of the digits above d.
__device__ int select_digit(const u64* histogram, uint64_t above, uint64_t target, Shared& s) {
  constexpr int kPerLane = kDigits / 32;
  const int lane = static_cast<int>(threadIdx.x);
  const int lo = lane * kPerLane;
  u64 mine = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) mine += histogram[lo + i];
  // suffix[lane] = sum of lanes >= lane.
  u64 suffix = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const u64 v = __shfl_down_sync(0xffffffffu, suffix, off);
    if (lane + off < 32) suffix += v;
  }
  // Lanes whose suffix reaches the target form a prefix 0..L of the warp; L holds d.
  const unsigned reach = __ballot_sync(0xffffffffu, above + suffix >= target);
  const int holder = reach == 0 ? 0 : 31 - __clz(static_cast<int>(reach));
  int d = 0;
  if (lane == holder) {
    uint64_t acc = above + (suffix - mine);  // the lanes above this one
    // Lane 0 never tests digit 0 (the walk ends there); any other holder breaks by lo.
    for (d = lo + kPerLane - 1; d >= (lo > 0 ? lo : 1); --d) {
      if (acc + histogram[d] >= target) break;
      acc += histogram[d];
    }
    s.above = acc;
  }
  return __shfl_sync(0xffffffffu, d, holder);
}

// The largest rank key c such that the sum of value(i) over non-NaN ids with
// lower <= key(i) and key(i) >= c reaches target (which that sum over all keys >= lower
// must reach). value(i) is 1 (counting) or the token weight.
template <bool kWeighted>
__device__ uint64_t select_key(const float* logits, const uint32_t* weights, int64_t vocab,
                               uint64_t lower, uint64_t target, Shared& s) {
  uint64_t prefix = 0;
  uint64_t above = 0;  // value of the keys above the current prefix range
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t high_mask = shift == 56 ? 0 : ~uint64_t{0} << (shift + 8);
    for (int d = threadIdx.x; d < kDigits; d += kThreads) s.histogram[d] = 0;
    __syncthreads();
    // Runs of one digit are summed in a register and added once: the keys of a row share
    // their high bytes (logits of one sign and exponent), so one atomic per element would
    // serialize the whole block on a bin or two.
    int run_digit = -1;
    uint64_t run = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = logits[i];
      if (isnan(l)) continue;
      const uint64_t key = sampling::rank_key(l, i);
      if (key < lower || (key & high_mask) != prefix) continue;
      const uint64_t v = kWeighted ? uint64_t{weights[i]} : uint64_t{1};
      if (v == 0) continue;
      const int digit = static_cast<int>((key >> shift) & 0xff);
      if (digit != run_digit) {
        if (run != 0) atomicAdd(&s.histogram[run_digit], static_cast<u64>(run));
        run_digit = digit;
        run = 0;
      }
      run += v;
    }
    if (run != 0) atomicAdd(&s.histogram[run_digit], static_cast<u64>(run));
    __syncthreads();
    if (threadIdx.x < 32) {
      const int d = select_digit(s.histogram, above, target, s);
      if (threadIdx.x == 0) s.broadcast = prefix | (static_cast<uint64_t>(d) << shift);
    }
    __syncthreads();
    prefix = s.broadcast;
    above = s.above;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ all_logits, const SamplingOptions* __restrict__ options,
                  int32_t* __restrict__ tokens, uint32_t* __restrict__ all_weights, int64_t vocab) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const float* logits = all_logits + row * vocab;
  uint32_t* weights = all_weights + row * vocab;
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
  // The weights, once (W <= 2^31 fits 32 bits); NaN ids weigh 0 and are never kept.
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = logits[i];
    weights[i] = isnan(l)
                     ? 0u
                     : static_cast<uint32_t>(sampling::token_weight(l, max_logit, inv_temperature));
  }
  __syncthreads();  // the last pass reads other threads' weights

  uint64_t lower = 0;
  if (o.top_k > 0 && static_cast<uint64_t>(o.top_k) < num_valid) {
    lower = select_key<false>(logits, weights, vocab, 0, static_cast<uint64_t>(o.top_k), s);
  }
  if (o.top_p < 1.0f) {
    uint64_t part = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = logits[i];
      if (!isnan(l) && sampling::rank_key(l, i) >= lower) part += weights[i];
    }
    const uint64_t total = block_sum(part, s);
    const uint64_t at_least = sampling::ceil_mul(o.top_p, total);
    const uint64_t target = at_least > 0 ? at_least : 1;
    lower = select_key<true>(logits, weights, vocab, lower, target, s);
  }

  const uint64_t min_weight = sampling::ceil_mul(o.min_p, kMaxWeight);
  const auto kept_weight = [&](int64_t i) -> uint64_t {
    const uint64_t w = weights[i];
    if (w < min_weight || w == 0 || sampling::rank_key(logits[i], i) < lower) return 0;
    return w;
  };
  // Thread t's ids: [t * span, (t + 1) * span) within the row.
  const int64_t span = (vocab + kThreads - 1) / kThreads;
  const int64_t first = threadIdx.x * span;
  const int64_t last = first + span < vocab ? first + span : vocab;
  uint64_t part = 0;
  for (int64_t i = first; i < last; ++i) part += kept_weight(i);
  u64 before = 0, total = 0;
  cub::BlockScan<u64, kThreads>(s.tmp.scan).ExclusiveSum(static_cast<u64>(part), before, total);
  // The kept total is > 0: the top-ranked id has W = 2^31 and survives every filter.
  const uint64_t r = sampling::scale_draw(sampling::draw_bits(o.seed, o.step), total);
  if (part == 0 || r < before || r >= before + part) return;
  uint64_t running = before;
  for (int64_t i = first; i < last; ++i) {
    running += kept_weight(i);
    if (running > r) {
      tokens[row] = static_cast<int32_t>(i);
      return;
    }
  }
}

__global__ void gather_tokens_kernel(GatherTokensParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < p.num_rows && p.source_rows[i] >= 0) p.tokens[i] = p.source[p.source_rows[i]];
}

}  // namespace

void gather_tokens(const GatherTokensParams& p, cudaStream_t stream) {
  CHECK(p.num_rows >= 0 && p.num_rows <= INT32_MAX, "gather_tokens: num_rows ", p.num_rows);
  if (p.num_rows == 0) return;
  const auto blocks = static_cast<unsigned>((p.num_rows + 255) / 256);
  gather_tokens_kernel<<<blocks, 256, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void sample_tokens(const SampleParams& p, cudaStream_t stream) {
  CHECK(p.num_rows >= 0, "sample_tokens: num_rows ", p.num_rows);
  CHECK(p.vocab > 0 && p.vocab <= kMaxSamplingVocab, "sample_tokens: vocab ", p.vocab,
        " not in [1, ", kMaxSamplingVocab, "]");
  if (p.num_rows == 0) return;
  CHECK(p.logits != nullptr && p.options != nullptr && p.tokens != nullptr && p.weights != nullptr,
        "sample_tokens: null pointer (the CUDA sampler needs SampleParams::weights)");
  CHECK(p.num_rows <= INT32_MAX, "sample_tokens: num_rows over 2^31");
  sample_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(
      p.logits, p.options, p.tokens, p.weights, p.vocab);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
