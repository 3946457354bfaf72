// CUDA causal top-k (cuda.h): one block per query row, an exact radix select on the
// score bits that reads a typical row two or three times (five before).
//
//   key(x) = order-preserving uint32 of x (-0 mapped to +0, so they tie as on the CPU)
//   pass 1  histogram of key[31:20] over the row (4096 bins) -> the bin B holding the
//           keep-th largest key, and `above`, how many keys lie in higher bins.
//   pass 2  only when above + count(B) > kCandidateCap: histogram of key[19:8] of the
//           keys in B -> a 24-bit bin B, and its `above` (a bin of 12 bits spans 1/8 of
//           an octave: for a 1M-key row it holds far more keys than the cap).
//   collect when above + count(B) <= kCandidateCap (and keep <= kMaxSortedTopk): every
//           key in bins >= B is appended, with its position, to a candidate list in
//           shared memory (any order). The rest works on the candidates only:
//           - K = the keep-th largest key: radix passes over the remaining bits of the
//             candidates in B; `need` = how many keys equal to K are taken;
//           - when fewer than all keys equal to K are taken, the need-th lowest position
//             among them, P (radix passes over ~position): ties go to lower positions;
//           - winners = keys > K, and keys == K at positions <= P: exactly keep of them,
//             bitonic-sorted ascending in shared memory.
//   else    (massive ties, or topk above kMaxSortedTopk) the full-row select goes on to
//           32 bits, then an ordered compaction, tile by tile: key > K, and key == K
//           while fewer than `need` were taken. The row is read 4 times.
// Rows with keep = num_visible copy 0..keep-1; rows of at most 512 keys rank each key
// against all others in shared memory (one read of the row). No workspace for any S: shared memory
// holds the 4096-bin histogram (reused for the winners) and the candidates.
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <limits>

#include "core/order_key.h"
#include "kernels/attention/indexer/check.h"
#include "kernels/attention/indexer/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kTopBits = 12;
constexpr int kMaxBins = 1 << kTopBits;
constexpr int kMaxBinsPerThread = kMaxBins / kThreads;
constexpr int kCandidateCap = 8192;
constexpr int kMaxSortedTopk = kMaxBins;  // the winners are sorted in the histogram's space
constexpr size_t kDynamicSmem = sizeof(int) * kMaxBins + sizeof(uint2) * kCandidateCap;
constexpr int kUnroll = 4;  // row loads in flight per thread

using BlockScan = cub::BlockScan<int, kThreads>;

struct Shared {
  BlockScan::TempStorage scan;
  int found_bin;
  int found_need;
  int found_count;
  int num_candidates;
  int num_winners;
};

// f(s, row[s]) for every s < n, kUnroll loads in flight per thread.
template <typename Fn>
__device__ void for_each_score(const float* row, int64_t n, Fn f) {
  int64_t s = threadIdx.x;
  for (; s + (kUnroll - 1) * kThreads < n; s += kUnroll * kThreads) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = __ldg(row + s + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(s + u * kThreads, x[u]);
  }
  for (; s < n; s += kThreads) f(s, __ldg(row + s));
}

// The bin of hist[0..num_bins) (a power of two <= kMaxBins) holding the
// need-th largest value counted from the top bin (1 <= need <= the total): the bin, how
// many of its values are still needed, and its count. Block-wide.
__device__ void find_bin(Shared& sh, const int* hist, int num_bins, int need, int& bin,
                         int& need_in_bin, int& bin_count) {
  const int per_thread = num_bins > kThreads ? num_bins / kThreads : 1;
  int local[kMaxBinsPerThread];
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kMaxBinsPerThread; ++k) {
    const int idx = num_bins - 1 - (static_cast<int>(threadIdx.x) * per_thread + k);
    local[k] = k < per_thread && idx >= 0 ? hist[idx] : 0;
    sum += local[k];
  }
  int above = 0;
  BlockScan(sh.scan).ExclusiveSum(sum, above);
  if (above < need && above + sum >= need) {
#pragma unroll
    for (int k = 0; k < kMaxBinsPerThread; ++k) {
      if (above < need && above + local[k] >= need) {
        sh.found_bin = num_bins - 1 - (threadIdx.x * per_thread + k);
        sh.found_need = need - above;
        sh.found_count = local[k];
      }
      above += local[k];
    }
  }
  __syncthreads();
  bin = sh.found_bin;
  need_in_bin = sh.found_need;
  bin_count = sh.found_count;
  __syncthreads();
}

// Radix state: the values whose bits under `mask` equal `prefix` hold the need-th
// largest; `count` of them share the prefix.
struct Select {
  uint32_t prefix = 0;
  uint32_t mask = 0;
  int need = 0;
  int count = 0;
};

// One radix pass over bits [shift, shift + bits) of the matching values: for_each(add)
// must call add(value) for every participating value.
template <typename ForEach>
__device__ void radix_pass(Shared& sh, int* hist, int shift, int bits, Select& sel,
                           ForEach for_each) {
  const int num_bins = 1 << bits;
  for (int b = threadIdx.x; b < num_bins; b += kThreads) hist[b] = 0;
  __syncthreads();
  const uint32_t prefix = sel.prefix, mask = sel.mask;
  for_each([&](uint32_t v) {
    if ((v & mask) == prefix) atomicAdd(&hist[(v >> shift) & (num_bins - 1)], 1);
  });
  __syncthreads();
  int bin = 0;
  find_bin(sh, hist, num_bins, sel.need, bin, sel.need, sel.count);
  sel.prefix |= static_cast<uint32_t>(bin) << shift;
  sel.mask |= static_cast<uint32_t>(num_bins - 1) << shift;
}

// Ascending bitonic sort of v[0..n), n a power of two. Block-wide.
__device__ void bitonic_sort(int* v, int n) {
  for (int k = 2; k <= n; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const int a = v[i], b = v[partner];
          if ((a > b) == ((i & k) == 0)) {
            v[i] = b;
            v[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The keep winners among the candidates, K and need known: ascending into dst.
__device__ void take_candidates(Shared& sh, int* hist, const uint2* cand, int num_cand, Select& sel,
                                int keep, int32_t* dst) {
  const uint32_t threshold = sel.prefix;
  // Highest ~position (lowest position) taken among the keys equal to K.
  uint32_t min_inv_pos = 0;
  if (sel.need < sel.count) {
    Select pos{.prefix = 0, .mask = 0, .need = sel.need, .count = 0};
    const auto equal_keys = [&](auto add) {
      for (int i = threadIdx.x; i < num_cand; i += kThreads) {
        if (cand[i].x == threshold) add(~cand[i].y);
      }
    };
    radix_pass(sh, hist, 21, 11, pos, equal_keys);
    radix_pass(sh, hist, 10, 11, pos, equal_keys);
    radix_pass(sh, hist, 0, 10, pos, equal_keys);
    min_inv_pos = pos.prefix;
  }
  int* winners = hist;  // [keep] then padding to a power of two
  if (threadIdx.x == 0) sh.num_winners = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < num_cand; i += kThreads) {
    const uint2 c = cand[i];
    if (c.x > threshold || (c.x == threshold && ~c.y >= min_inv_pos)) {
      winners[atomicAdd(&sh.num_winners, 1)] = static_cast<int>(c.y);
    }
  }
  int padded = 1;
  while (padded < keep) padded *= 2;
  for (int i = keep + threadIdx.x; i < padded; i += kThreads) winners[i] = INT_MAX;
  __syncthreads();
  bitonic_sort(winners, padded);
  for (int i = threadIdx.x; i < keep; i += kThreads) dst[i] = winners[i];
}

// key > K, and key == K while fewer than need were taken, in ascending position order.
__device__ void compact_row(Shared& sh, const float* row, int64_t num_visible, int64_t keep,
                            uint32_t threshold, int64_t need, int32_t* dst) {
  int64_t num_taken = 0;
  int64_t num_equal_seen = 0;
  for (int64_t base = 0; base < num_visible && num_taken < keep; base += kThreads) {
    const int64_t s = base + threadIdx.x;
    const bool valid = s < num_visible;
    const uint32_t key = valid ? float_order_key(row[s]) : 0u;
    const int is_equal = valid && key == threshold;
    int equal_before = 0, equal_total = 0;
    BlockScan(sh.scan).ExclusiveSum(is_equal, equal_before, equal_total);
    __syncthreads();
    const int take =
        valid && (key > threshold || (is_equal && num_equal_seen + equal_before < need));
    int taken_before = 0, taken_total = 0;
    BlockScan(sh.scan).ExclusiveSum(take, taken_before, taken_total);
    __syncthreads();
    if (take) dst[num_taken + taken_before] = static_cast<int32_t>(s);
    num_taken += taken_total;
    num_equal_seen += equal_total;
  }
}

// A row of at most kThreads keys (a short context, most decode rows of a small model): a
// key's rank is the number of keys above it, ties broken toward lower positions (the
// order of the radix select); the winners (rank < keep) are written in position order.
// One pass over the row instead of the radix select's two to four.
__device__ void short_row(Shared& sh, uint32_t* keys, const float* row, int num_visible, int keep,
                          int32_t* dst) {
  const int s = threadIdx.x;
  const bool valid = s < num_visible;
  const uint32_t key = valid ? float_order_key(__ldg(row + s)) : 0u;
  if (valid) keys[s] = key;
  __syncthreads();
  int rank = 0;
  if (valid) {
    for (int j = 0; j < num_visible; ++j) {
      const uint32_t other = keys[j];
      rank += other > key || (other == key && j < s);
    }
  }
  const int win = valid && rank < keep;
  int before = 0;
  BlockScan(sh.scan).ExclusiveSum(win, before);
  if (win) dst[before] = s;
}

__global__ void __launch_bounds__(kThreads)
    causal_topk_kernel(const float* scores, const int64_t* q_pos, int64_t num_keys, int64_t topk,
                       int32_t* out) {
  __shared__ Shared sh;
  extern __shared__ __align__(16) uint8_t smem[];
  int* hist = reinterpret_cast<int*>(smem);                               // [kMaxBins]
  uint2* cand = reinterpret_cast<uint2*>(smem + sizeof(int) * kMaxBins);  // [kCandidateCap]

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

  // keep < num_visible < 2^31 from here on.
  if (num_visible <= kThreads) {
    short_row(sh, reinterpret_cast<uint32_t*>(hist), row, static_cast<int>(num_visible),
              static_cast<int>(keep), dst);
    return;
  }
  const auto row_keys = [&](auto add) {
    for_each_score(row, num_visible, [&](int64_t, float x) { add(float_order_key(x)); });
  };
  Select sel{.prefix = 0, .mask = 0, .need = static_cast<int>(keep), .count = 0};
  radix_pass(sh, hist, 32 - kTopBits, kTopBits, sel, row_keys);

  if (keep <= kMaxSortedTopk) {
    // The threshold bin is small enough after the 12-bit pass (a typical short row) or
    // after a 24-bit pass (a typical long row); massive ties fall through.
    int above = static_cast<int>(keep) - sel.need;
    if (above + sel.count > kCandidateCap) {
      radix_pass(sh, hist, 8, 12, sel, row_keys);
      above = static_cast<int>(keep) - sel.need;
    }
    if (above + sel.count <= kCandidateCap) {
      const uint32_t bin_floor = sel.prefix;  // keys >= this lie in bins >= the threshold's
      if (threadIdx.x == 0) sh.num_candidates = 0;
      __syncthreads();
      for_each_score(row, num_visible, [&](int64_t s, float x) {
        const uint32_t key = float_order_key(x);
        if (key >= bin_floor) {
          cand[atomicAdd(&sh.num_candidates, 1)] = make_uint2(key, static_cast<uint32_t>(s));
        }
      });
      __syncthreads();
      const int num_cand = sh.num_candidates;
      const auto cand_keys = [&](auto add) {
        for (int i = threadIdx.x; i < num_cand; i += kThreads) add(cand[i].x);
      };
      if (sel.mask == 0xfff00000u) {
        radix_pass(sh, hist, 10, 10, sel, cand_keys);
        radix_pass(sh, hist, 0, 10, sel, cand_keys);
      } else {
        radix_pass(sh, hist, 0, 8, sel, cand_keys);
      }
      take_candidates(sh, hist, cand, num_cand, sel, static_cast<int>(keep), dst);
      return;
    }
    radix_pass(sh, hist, 0, 8, sel, row_keys);
  } else {
    radix_pass(sh, hist, 10, 10, sel, row_keys);
    radix_pass(sh, hist, 0, 10, sel, row_keys);
  }
  compact_row(sh, row, num_visible, keep, sel.prefix, sel.need, dst);
}

}  // namespace

void causal_topk(const float* scores, const int64_t* q_pos, int64_t T, int64_t S, int64_t topk,
                 int32_t* out, cudaStream_t stream) {
  validate(CausalTopkParams{
      .scores = scores, .q_pos = q_pos, .num_queries = T, .num_keys = S, .topk = topk, .out = out});
  // CUDA-only limit: one block per query.
  CHECK(T < (int64_t{1} << 31), "causal_topk: num_queries ", T);
  if (T == 0) return;
  CUDA_CHECK(cudaFuncSetAttribute(causal_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kDynamicSmem)));
  causal_topk_kernel<<<static_cast<unsigned>(T), kThreads, kDynamicSmem, stream>>>(scores, q_pos, S,
                                                                                   topk, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
