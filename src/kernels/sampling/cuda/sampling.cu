// CUDA token sampling (cuda.h), the definition of params.h spread over many blocks per row.
//
// Only tokens of weight W > 0 can be drawn or move a filter (weights fall with rank: the
// rank order restricted to W > 0 is a prefix of the whole order, so a top-k larger than the
// count of such "candidates" cuts none of them, and a top-p prefix ends on one). Candidates
// are put in kBins bins by W (32 octaves x 128 steps, larger W in lower bins: a bin's tokens
// rank below every lower bin's); a filter's cut is found first among the bins (counts for
// top-k, weights for top-p), then exactly within its boundary bin by rank key. Launches,
// per row (grid x: the row's chunks; single-block kernels: one block per row):
//   1. stats    chunk argmax rank key (NaN skipped; the largest key is the greedy token) and
//               non-NaN count; clears the row's bins and state
//   2. weights  W of the chunk's ids (params.h's fixed point), into the workspace and a
//               shared-memory histogram by bin, added to the row's bins; the last block of the
//               row (a counter) finds top-k's boundary bin
//   3. gather   the boundary bin's tokens (rank key, W) appended to the row's list
//   4. resolve  (one block) sorts the list by rank key: the exact top-k cut and the kept
//               weight; the top-p target and its boundary bin (resolved at once when it is
//               the top-k bin)
//   5. gather, 6. resolve   the same for top-p's boundary bin when it is another
//   7. sums     each chunk's kept weight (rank key >= the cut, W >= min-p's weight)
//   8. draw     (one block) r from the kept total; the chunk that holds r, walked in id order
// A boundary bin of more than kListCap tokens (many equal logits) is resolved by the block
// alone, by radix selection over the row restricted to that bin (slow, exact). Every sum is
// an integer sum (atomics on integers commute), the list is sorted by unique keys, and the
// chunking depends on the batch size only through the grid: the token equals the CPU op's
// whatever the batch.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/sampling/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using sampling::kMaxWeight;
using u64 = unsigned long long;

constexpr int kThreads = 256;         // multi-block kernels
constexpr int kResolveThreads = 512;  // resolve: kListCap = 512 x 8 sorted items
constexpr int kSortItems = 8;
constexpr int kListCap = kResolveThreads * kSortItems;
constexpr int kSmallList = 1024;  // resolved by counting (each entry against all), no sort
constexpr int kBins = sampling::kSampleBins;
constexpr int kDigits = 256;

// The row's bookkeeping (workspace, after the weights).
struct RowState {
  u64 max_key;     // stats' argmax rank key (0: no non-NaN id)
  u64 lower;       // the cut: kept ids have rank key >= lower
  u64 kept_total;  // weight kept by top-k (then top-p)
  u64 target;      // top-p's weight target
  int32_t done_blocks;
  int32_t done;   // 1: the token is written (greedy, no valid id, invalid options)
  int32_t bin;    // the boundary bin the next gather collects (-1: none)
  int32_t need;   // the rank / weight the resolve needs within the bin
  int32_t phase;  // 0: top-k's bin, 1: top-p's, 2: the cut is final
  uint32_t list_count;
};

struct ListEntry {
  u64 key;
  uint32_t weight;
  uint32_t pad;
};

// The first of n values (value(b), in order) at which the running sum reaches target, by a
// block of kN threads (each sums a run of n / kN, one exclusive scan, the holder walks its
// run): returns it (-1 if the sum never does) and sets *before to the sum of the values
// before it. Every thread gets the result.
template <int kN, class Value>
__device__ int find_crossing(int n, Value value, u64 target, u64* before) {
  using Scan = cub::BlockScan<u64, kN>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int s_found;
  __shared__ u64 s_before;
  const int per = (n + kN - 1) / kN;
  const int lo = static_cast<int>(threadIdx.x) * per;
  const int hi = lo + per < n ? lo + per : n;
  u64 mine = 0;
  for (int b = lo; b < hi; ++b) mine += value(b);
  u64 excl = 0;
  if (threadIdx.x == 0) s_found = -1;
  __syncthreads();
  Scan(tmp).ExclusiveSum(mine, excl);
  if (excl < target && excl + mine >= target) {
    u64 run = excl;
    for (int b = lo; b < hi; ++b) {
      const u64 v = value(b);
      if (run + v >= target) {
        s_found = b;
        s_before = run;
        break;
      }
      run += v;
    }
  }
  __syncthreads();
  const int found = s_found;
  *before = found >= 0 ? s_before : 0;
  __syncthreads();
  return found;
}

static_assert(sizeof(RowState) <= sampling::kSampleStateBytes);
static_assert(sizeof(ListEntry) == 16 && kListCap == sampling::kSampleListCap);

struct Row {
  const float* logits;
  uint32_t* weights;
  RowState* state;
  u64* partials;  // [chunks]: each chunk's max rank key
  uint32_t* bin_counts;
  u64* bin_weights;
  u64* chunk_sums;
  ListEntry* list;
};

struct Args {
  const float* logits;
  const SamplingOptions* options;
  int32_t* tokens;
  char* workspace;
  int64_t vocab;
  int64_t chunk;  // ids per chunk
  int32_t chunks;
  sampling::SampleRowLayout layout;
};

__device__ Row row_of(const Args& a, int64_t row) {
  char* base = a.workspace + row * a.layout.row_bytes;
  return {a.logits + row * a.vocab,
          reinterpret_cast<uint32_t*>(base + a.layout.weights),
          reinterpret_cast<RowState*>(base + a.layout.state),
          reinterpret_cast<u64*>(base + a.layout.partials),
          reinterpret_cast<uint32_t*>(base + a.layout.bin_counts),
          reinterpret_cast<u64*>(base + a.layout.bin_weights),
          reinterpret_cast<u64*>(base + a.layout.chunk_sums),
          reinterpret_cast<ListEntry*>(base + a.layout.list)};
}

// W's bin: 128 steps per octave below 2^31 (W in [1, 2^31]); larger W, lower bin.
__device__ __forceinline__ int bin_of(uint32_t w) {
  const int top = 31 - __clz(static_cast<int>(w));  // floor(log2 w), 0..31
  const uint32_t step = top >= 7 ? (w >> (top - 7)) & 127u : (w << (7 - top)) & 127u;
  return (31 - top) * 128 + (127 - static_cast<int>(step));
}

// A block's walk of the ids [begin, end) of its chunk, kUnroll loads in flight per thread:
// load(i) for kUnroll ids (the thread's next ones, kThreads apart) first, then use(i, value)
// in id order. The passes are loops of one dependent load each otherwise, bound by latency;
// every use here is order-free (a max, integer sums and atomics), so the result is the same.
constexpr int kUnroll = 4;
template <class Load, class Use>
__device__ __forceinline__ void walk_chunk(int64_t begin, int64_t end, Load load, Use use) {
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += int64_t{kUnroll} * kThreads) {
    decltype(load(i0)) v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + int64_t{u} * kThreads;
      if (i < end) v[u] = load(i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + int64_t{u} * kThreads;
      if (i < end) use(i, v[u]);
    }
  }
}

// ---- 1. stats -----------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) stats_kernel(Args a) {
  const int64_t row = blockIdx.y;
  const Row r = row_of(a, row);
  const int64_t begin = blockIdx.x * a.chunk;
  const int64_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  u64 best = 0;
  walk_chunk(
      begin, end, [&](int64_t i) { return r.logits[i]; },
      [&](int64_t i, float l) {
        if (isnan(l)) return;
        const u64 key = sampling::rank_key(l, i);
        best = key > best ? key : best;
      });
  using Reduce = cub::BlockReduce<u64, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const u64 block_best = Reduce(tmp).Reduce(best, [](u64 x, u64 y) { return x > y ? x : y; });
  if (threadIdx.x == 0) r.partials[blockIdx.x] = block_best;
  // The row's bins and state, cleared for weights_kernel (the next launch).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t b = blockIdx.x * kThreads + threadIdx.x; b < kBins; b += stride) {
    r.bin_counts[b] = 0;
    r.bin_weights[b] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *r.state = RowState{};
}

// ---- 2. weights ---------------------------------------------------------------------------

struct WeightsShared {
  uint32_t counts[kBins];
  u64 weights[kBins];
  bool last;
};

// Top-k's boundary bin from the row's bins (the row's last weights block): sets the state's
// kept total, cut and bin / need (-1: top-k cuts no candidate).
__device__ void find_top_k_bin(const Row& r, const SamplingOptions& o) {
  __shared__ u64 s_total[2];
  __shared__ int s_bin;  // -1: top-k cuts no candidate
  using Reduce = cub::BlockReduce<u64, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  u64 count = 0, weight = 0;
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    count += r.bin_counts[b];
    weight += r.bin_weights[b];
  }
  const u64 c = Reduce(tmp).Sum(count);
  __syncthreads();
  const u64 w = Reduce(tmp).Sum(weight);
  if (threadIdx.x == 0) {
    s_total[0] = c;
    s_total[1] = w;
    s_bin = -1;
  }
  __syncthreads();
  const u64 candidates = s_total[0];
  const bool cuts = o.top_k > 0 && static_cast<u64>(o.top_k) < candidates;
  if (cuts) {
    u64 before = 0;
    const int bin = find_crossing<kThreads>(
        kBins, [&](int b) { return u64{r.bin_counts[b]}; }, static_cast<u64>(o.top_k), &before);
    if (threadIdx.x == 0) {
      s_bin = bin;
      r.state->need = static_cast<int32_t>(static_cast<u64>(o.top_k) - before);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    RowState& st = *r.state;
    st.kept_total = s_total[1];
    st.lower = 0;
    st.phase = 0;
    st.bin = cuts ? s_bin : -1;
    st.list_count = 0;
  }
}

__global__ void __launch_bounds__(kThreads) weights_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto& s = *reinterpret_cast<WeightsShared*>(smem);
  const int64_t row = blockIdx.y;
  const Row r = row_of(a, row);
  const SamplingOptions o = a.options[row];
  // Every block reduces the chunks' stats the same way (the max is order-free).
  __shared__ u64 s_max;
  if (threadIdx.x < 32) {
    u64 best = 0;
    for (int c = threadIdx.x; c < a.chunks; c += 32) {
      const u64 k = r.partials[c];
      best = k > best ? k : best;
    }
    for (int off = 16; off > 0; off /= 2) {
      const u64 k = __shfl_xor_sync(0xffffffffu, best, off);
      best = k > best ? k : best;
    }
    if (threadIdx.x == 0) s_max = best;
  }
  __syncthreads();
  const u64 max_key = s_max;
  if (max_key == 0 || o.temperature == 0.0f || !sampling::options_valid(o)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      a.tokens[row] =
          !sampling::options_valid(o) || max_key == 0
              ? -1
              : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(max_key & 0xffffffffu));
      r.state->done = 1;
    }
    return;
  }
  const float max_logit = r.logits[0xffffffffu - static_cast<uint32_t>(max_key & 0xffffffffu)];
  const double inv_temperature = sampling::inverse_temperature(o.temperature);
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.counts[b] = 0;
    s.weights[b] = 0;
  }
  __syncthreads();
  const int64_t begin = blockIdx.x * a.chunk;
  const int64_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  walk_chunk(
      begin, end, [&](int64_t i) { return r.logits[i]; },
      [&](int64_t i, float l) {
        const uint32_t w =
            isnan(l) ? 0u
                     : static_cast<uint32_t>(sampling::token_weight(l, max_logit, inv_temperature));
        r.weights[i] = w;
        if (w != 0) {
          const int b = bin_of(w);
          atomicAdd(&s.counts[b], 1u);
          atomicAdd(&s.weights[b], static_cast<u64>(w));
        }
      });
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    if (s.counts[b] != 0) {
      atomicAdd(&r.bin_counts[b], s.counts[b]);
      atomicAdd(&r.bin_weights[b], s.weights[b]);
    }
  }
  // The row's last block to finish sees every block's bins.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    s.last = atomicAdd(&r.state->done_blocks, 1) == a.chunks - 1;
    if (blockIdx.x == 0) r.state->max_key = max_key;
  }
  __syncthreads();
  if (!s.last) return;
  __threadfence();
  find_top_k_bin(r, o);
}

// ---- 3. / 5. gather -----------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) gather_kernel(Args a) {
  const int64_t row = blockIdx.y;
  const Row r = row_of(a, row);
  const RowState& st = *r.state;
  if (st.done != 0 || st.phase == 2 || st.bin < 0) return;
  const int bin = st.bin;
  const u64 lower = st.lower;
  const int64_t begin = blockIdx.x * a.chunk;
  const int64_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const uint32_t w = r.weights[i];
    if (w == 0 || bin_of(w) != bin) continue;
    const u64 key = sampling::rank_key(r.logits[i], i);
    if (key < lower) continue;
    const uint32_t at = atomicAdd(&r.state->list_count, 1u);
    if (at < static_cast<uint32_t>(kListCap)) r.list[at] = ListEntry{key, w, 0};
  }
}

// ---- 4. / 6. resolve ----------------------------------------------------------------------

struct ResolveShared {
  union {
    typename cub::BlockRadixSort<u64, kResolveThreads, kSortItems, uint32_t>::TempStorage sort;
    typename cub::BlockScan<u64, kResolveThreads>::TempStorage scan;
    typename cub::BlockReduce<u64, kResolveThreads>::TempStorage reduce;
    struct {
      u64 keys[kSmallList];
      uint32_t weights[kSmallList];
    } small;
  } tmp;
  u64 histogram[kDigits];
  u64 broadcast;
  u64 above;
  u64 found_key;
};

__device__ u64 block_sum(u64 v, ResolveShared& s) {
  const u64 total = cub::BlockReduce<u64, kResolveThreads>(s.tmp.reduce).Sum(v);
  if (threadIdx.x == 0) s.broadcast = total;
  __syncthreads();
  const u64 out = s.broadcast;
  __syncthreads();
  return out;
}

// Warp 0: the largest digit d >= 1 with above + (sum of histogram[d..255]) >= target, else
// 0. Sets s.above to above + the sum of the digits above d.
__device__ int select_digit(const u64* histogram, u64 above, u64 target, ResolveShared& s) {
  constexpr int kPerLane = kDigits / 32;
  const int lane = static_cast<int>(threadIdx.x);
  const int lo = lane * kPerLane;
  u64 mine = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) mine += histogram[lo + i];
  u64 suffix = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const u64 v = __shfl_down_sync(0xffffffffu, suffix, off);
    if (lane + off < 32) suffix += v;
  }
  const unsigned reach = __ballot_sync(0xffffffffu, above + suffix >= target);
  const int holder = reach == 0 ? 0 : 31 - __clz(static_cast<int>(reach));
  int d = 0;
  if (lane == holder) {
    u64 acc = above + (suffix - mine);
    for (d = lo + kPerLane - 1; d >= (lo > 0 ? lo : 1); --d) {
      if (acc + histogram[d] >= target) break;
      acc += histogram[d];
    }
    s.above = acc;
  }
  return __shfl_sync(0xffffffffu, d, holder);
}

// The slow path for a boundary bin of more than kListCap tokens: the largest rank key c
// among the row's ids in `bin` with key >= lower such that the value (1, or W) of those with
// key >= c reaches target.
template <bool kWeighted>
__device__ u64 select_in_bin(const Row& r, int64_t vocab, int bin, u64 lower, u64 target,
                             ResolveShared& s) {
  u64 prefix = 0, above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const u64 high_mask = shift == 56 ? 0 : ~u64{0} << (shift + 8);
    for (int d = threadIdx.x; d < kDigits; d += kResolveThreads) s.histogram[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kResolveThreads) {
      const uint32_t w = r.weights[i];
      if (w == 0 || bin_of(w) != bin) continue;
      const u64 key = sampling::rank_key(r.logits[i], i);
      if (key < lower || (key & high_mask) != prefix) continue;
      atomicAdd(&s.histogram[(key >> shift) & 0xff], kWeighted ? u64{w} : u64{1});
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const int d = select_digit(s.histogram, above, target, s);
      if (threadIdx.x == 0) s.broadcast = prefix | (static_cast<u64>(d) << shift);
    }
    __syncthreads();
    prefix = s.broadcast;
    above = s.above;
    __syncthreads();
  }
  return prefix;
}

// The list (or, past kListCap, the row) sorted by rank key, descending: the key at which
// the running value (count, or weight) reaches target; sets s.found_key and returns the weight of
// the list's keys >= the found key.
__device__ u64 resolve_bin(const Row& r, int64_t vocab, bool weighted, u64 target,
                           ResolveShared& s) {
  const RowState& st = *r.state;
  const uint32_t n = st.list_count;
  if (n > static_cast<uint32_t>(kListCap)) {
    const u64 key = weighted ? select_in_bin<true>(r, vocab, st.bin, st.lower, target, s)
                             : select_in_bin<false>(r, vocab, st.bin, st.lower, target, s);
    s.found_key = key;
    // The weight of the bin's keys >= key.
    u64 part = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kResolveThreads) {
      const uint32_t w = r.weights[i];
      if (w == 0 || bin_of(w) != st.bin) continue;
      const u64 k = sampling::rank_key(r.logits[i], i);
      if (k >= key && k >= st.lower) part += w;
    }
    return block_sum(part, s);
  }
  if (n <= static_cast<uint32_t>(kSmallList)) {
    // Each entry's rank value: the value of the entries of larger key (keys are unique).
    for (uint32_t e = threadIdx.x; e < n; e += kResolveThreads) {
      s.tmp.small.keys[e] = r.list[e].key;
      s.tmp.small.weights[e] = r.list[e].weight;
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < n; e += kResolveThreads) {
      const u64 key = s.tmp.small.keys[e];
      u64 above = 0;
      for (uint32_t j = 0; j < n; ++j) {
        if (s.tmp.small.keys[j] > key) above += weighted ? s.tmp.small.weights[j] : 1;
      }
      const u64 v = weighted ? s.tmp.small.weights[e] : 1;
      if (above < target && above + v >= target) s.found_key = key;
    }
    __syncthreads();
    const u64 found = s.found_key;
    u64 kept = 0;
    for (uint32_t e = threadIdx.x; e < n; e += kResolveThreads) {
      if (s.tmp.small.keys[e] >= found) kept += s.tmp.small.weights[e];
    }
    __syncthreads();  // the list is read: block_sum may take the union
    return block_sum(kept, s);
  }
  u64 keys[kSortItems];
  uint32_t weights[kSortItems];
  for (int j = 0; j < kSortItems; ++j) {
    const uint32_t at = threadIdx.x * kSortItems + j;
    keys[j] = at < n ? r.list[at].key : 0;
    weights[j] = at < n ? r.list[at].weight : 0;
  }
  cub::BlockRadixSort<u64, kResolveThreads, kSortItems, uint32_t>(s.tmp.sort)
      .SortDescending(keys, weights);
  __syncthreads();
  u64 mine = 0;
  for (int j = 0; j < kSortItems; ++j) mine += weighted ? weights[j] : (keys[j] != 0 ? 1 : 0);
  u64 before = 0;
  cub::BlockScan<u64, kResolveThreads>(s.tmp.scan).ExclusiveSum(mine, before);
  __syncthreads();
  u64 run = before;
  u64 kept = 0;  // weight of this thread's keys up to the found one
  for (int j = 0; j < kSortItems; ++j) {
    if (keys[j] == 0) break;
    const u64 v = weighted ? weights[j] : 1;
    if (run < target && run + v >= target) s.found_key = keys[j];
    run += v;
  }
  __syncthreads();
  const u64 key = s.found_key;
  for (int j = 0; j < kSortItems; ++j) {
    if (keys[j] != 0 && keys[j] >= key) kept += weights[j];
  }
  return block_sum(kept, s);
}

__global__ void __launch_bounds__(kResolveThreads) resolve_kernel(Args a) {
  __shared__ ResolveShared s;
  const int64_t row = blockIdx.x;
  const Row r = row_of(a, row);
  RowState& st = *r.state;
  if (st.done != 0 || st.phase == 2) return;
  const SamplingOptions o = a.options[row];
  if (st.phase == 1) {
    // Top-p's bin, before the top-k bin (every id of it passes top-k).
    resolve_bin(r, a.vocab, true, st.target, s);
    if (threadIdx.x == 0) {
      st.lower = s.found_key;
      st.phase = 2;
    }
    return;
  }
  // Top-k: the cut within its bin (if it cuts), then top-p's bin.
  int last = kBins;  // the kept bins: those before `last` whole, `last` in part
  u64 last_weight = 0;
  if (st.bin >= 0) {
    last = st.bin;
    last_weight = resolve_bin(r, a.vocab, false, static_cast<u64>(st.need), s);
    u64 part = 0;
    for (int b = threadIdx.x; b < last; b += kResolveThreads) part += r.bin_weights[b];
    const u64 before = block_sum(part, s);
    if (threadIdx.x == 0) {
      st.lower = s.found_key;
      st.kept_total = before + last_weight;
    }
    __syncthreads();
  }
  if (!(o.top_p < 1.0f)) {
    if (threadIdx.x == 0) st.phase = 2;
    return;
  }
  const u64 at_least = sampling::ceil_mul(o.top_p, st.kept_total);
  const u64 target = at_least > 0 ? at_least : 1;
  u64 before_bp = 0;
  const int bp = find_crossing<kResolveThreads>(
      last < kBins ? last + 1 : kBins,
      [&](int b) { return b < last ? r.bin_weights[b] : last_weight; }, target, &before_bp);
  if (bp == last) {
    // Within the top-k bin's list (its keys >= st.lower come first in the sorted order).
    resolve_bin(r, a.vocab, true, target - before_bp, s);
    if (threadIdx.x == 0) {
      st.lower = s.found_key;
      st.phase = 2;
    }
    return;
  }
  if (threadIdx.x == 0) {
    st.phase = 1;
    st.bin = bp;
    st.target = target - before_bp;
    st.list_count = 0;
  }
}

// ---- 7. sums, 8. draw ---------------------------------------------------------------------

// Id i's weight w if the filters keep it, else 0.
__device__ __forceinline__ u64 kept(const Row& r, int64_t i, uint32_t w, u64 lower,
                                    u64 min_weight) {
  if (w == 0 || w < min_weight) return 0;
  if (lower != 0 && sampling::rank_key(r.logits[i], i) < lower) return 0;
  return w;
}
__device__ __forceinline__ u64 kept_weight(const Row& r, int64_t i, u64 lower, u64 min_weight) {
  return kept(r, i, r.weights[i], lower, min_weight);
}

__global__ void __launch_bounds__(kThreads) sums_kernel(Args a) {
  const int64_t row = blockIdx.y;
  const Row r = row_of(a, row);
  if (r.state->done != 0) return;
  const SamplingOptions o = a.options[row];
  const u64 lower = r.state->lower;
  const u64 min_weight = sampling::ceil_mul(o.min_p, kMaxWeight);
  const int64_t begin = blockIdx.x * a.chunk;
  const int64_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  u64 part = 0;
  walk_chunk(
      begin, end, [&](int64_t i) { return r.weights[i]; },
      [&](int64_t i, uint32_t w) { part += kept(r, i, w, lower, min_weight); });
  using Reduce = cub::BlockReduce<u64, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const u64 sum = Reduce(tmp).Sum(part);
  if (threadIdx.x == 0) r.chunk_sums[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kThreads) draw_kernel(Args a) {
  const int64_t row = blockIdx.x;
  const Row r = row_of(a, row);
  if (r.state->done != 0) return;
  const SamplingOptions o = a.options[row];
  __shared__ u64 s_total;
  {
    using Reduce = cub::BlockReduce<u64, kThreads>;
    __shared__ typename Reduce::TempStorage tmp;
    const u64 total =
        Reduce(tmp).Sum(static_cast<int>(threadIdx.x) < a.chunks ? r.chunk_sums[threadIdx.x] : 0);
    if (threadIdx.x == 0) s_total = total;
    __syncthreads();
  }
  // The kept total is > 0: the top-ranked id has W = 2^31 and survives every filter.
  const u64 pick = sampling::scale_draw(sampling::draw_bits(o.seed, o.step), s_total);
  u64 chunk_before = 0;
  const int chunk = find_crossing<kThreads>(
      a.chunks, [&](int c) { return r.chunk_sums[c]; }, pick + 1, &chunk_before);
  if (chunk < 0) return;  // unreachable: pick < the total
  const u64 lower = r.state->lower;
  const u64 min_weight = sampling::ceil_mul(o.min_p, kMaxWeight);
  const int64_t begin = chunk * a.chunk;
  const int64_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  // Thread t walks [first, last) of the chunk, in id order.
  const int64_t span = (end - begin + kThreads - 1) / kThreads;
  const int64_t first = begin + threadIdx.x * span;
  const int64_t last = first + span < end ? first + span : end;
  u64 part = 0;
  for (int64_t i = first; i < last; ++i) part += kept_weight(r, i, lower, min_weight);
  using Scan = cub::BlockScan<u64, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  u64 before = 0;
  Scan(tmp).ExclusiveSum(part, before);
  before += chunk_before;
  if (part == 0 || pick < before || pick >= before + part) return;
  u64 running = before;
  for (int64_t i = first; i < last; ++i) {
    running += kept_weight(r, i, lower, min_weight);
    if (running > pick) {
      a.tokens[row] = static_cast<int32_t>(i);
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
  CHECK(
      p.logits != nullptr && p.options != nullptr && p.tokens != nullptr && p.workspace != nullptr,
      "sample_tokens: null pointer (the CUDA sampler needs SampleParams::workspace)");
  CHECK(p.workspace_bytes >=
            static_cast<size_t>(sampling::sample_workspace_bytes(p.num_rows, p.vocab)),
        "sample_tokens: a workspace of ", p.workspace_bytes, " bytes, ", p.num_rows, " rows of ",
        p.vocab, " need ", sampling::sample_workspace_bytes(p.num_rows, p.vocab));
  CHECK(p.num_rows <= 65535, "sample_tokens: ", p.num_rows, " rows (at most 65,535)");
  const int32_t chunks = sampling::sample_chunks(p.num_rows, p.vocab);
  Args a{.logits = p.logits,
         .options = p.options,
         .tokens = p.tokens,
         .workspace = static_cast<char*>(p.workspace),
         .vocab = p.vocab,
         .chunk = (p.vocab + chunks - 1) / chunks,
         .chunks = chunks,
         .layout = sampling::sample_row_layout(p.vocab)};
  // The launches no row needs are left out when the host's copy of the options says so.
  bool sampled = true, top_k = true, top_p = true;
  if (p.host_options != nullptr) {
    sampled = top_k = top_p = false;
    for (int64_t r = 0; r < p.num_rows; ++r) {
      const SamplingOptions& o = p.host_options[r];
      const bool s = o.temperature != 0.0f;
      sampled |= s;
      top_k |= s && o.top_k > 0;
      top_p |= s && o.top_p < 1.0f;
    }
  }
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(p.num_rows));
  const auto rows = static_cast<unsigned>(p.num_rows);
  stats_kernel<<<grid, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
  // Every call, as the MoE kernels do: the attribute is the current device's.
  CUDA_CHECK(cudaFuncSetAttribute(weights_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(sizeof(WeightsShared))));
  weights_kernel<<<grid, kThreads, sizeof(WeightsShared), stream>>>(a);
  CUDA_CHECK_LAUNCH();
  if (!sampled) return;  // every token written by weights_kernel
  if (top_k) {
    gather_kernel<<<grid, kThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  if (top_k || top_p) {
    resolve_kernel<<<rows, kResolveThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  if (top_p) {
    gather_kernel<<<grid, kThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    resolve_kernel<<<rows, kResolveThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  sums_kernel<<<grid, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
  draw_kernel<<<rows, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
