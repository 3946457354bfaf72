// Exact top-k over the indexer scores in one cooperative kernel (cuda.h).
//
// Rows r = (b, i), each with n = position + 1 visible scores, are cut into chunks of
// chunk_len positions; work item (r, c) is handled by block (r * num_chunks + c) % grid
// in every phase. key(x) is the order-preserving uint32 of x (-0 mapped to +0).
//
//   phase 0  histogram of key[31:21] over the chunk -> hist0[r]   (shared, then global
//            integer atomics: the counts, hence everything after, are exact); skipped
//            when the indexer built it while writing the scores (p.histogram)
//   phase 1  every item of r scans hist0[r] for the bin holding the topk-th largest key
//            (the same answer in every block); histogram of key[20:10] of the keys in
//            that bin -> hist1[r]
//   phase 2  scan hist1[r] -> 22-bit prefix; histogram of key[9:0] -> hist2[r]
//   phase 3  scan hist2[r] -> the threshold key K and `need`, how many keys equal to K
//            are taken; per chunk: count of keys > K and == K
//   phase 4  per chunk, in ascending position order: keys > K, and keys == K while the
//            row's earlier == K keys (other chunks first) are fewer than need. Output
//            index = winners in earlier chunks + rank in this chunk, so the result is in
//            ascending position order with no sort, and the lower position wins ties.
// Candidates: when the bucket a row's phase 1 (or 2) scan finds holds at most cand_cap
// keys (its count is in the histogram just scanned), the pass of that phase also appends
// the bucket's keys with their positions to the row's candidate list (any order) and
// stores per chunk the count of keys in higher buckets. The row then skips the later
// phases: phase 4 finds K from the candidates alone (a shared histogram of the last 10
// bits, or hist2 when collected in phase 2) and the earlier chunks' winners and == K
// keys from the counts plus the candidates before the chunk. Typical rows collect in
// phase 1 or 2; only massive ties (thousands of keys sharing a 22-bit prefix around the
// threshold) need phase 3. A flag per phase, set when some row needs the next phase and
// read after the barrier (so grid-uniform), skips phases 2 and 3 with their barriers.
// Phases are separated by a grid barrier (the launch is cooperative, so every block is
// resident). Each phase's scan result is also stored by the item of chunk 0 so that the
// next phase scans only one histogram. Rows with n <= topk skip the select and copy.
// When every item has its own block and chunks are at most 8192 scores, a block keeps its
// chunk in shared memory after phase 0, so the scores are read from memory once.
//
// Everything written by other blocks during the kernel (histograms, state, counts,
// candidates, flags) is read with ld.global.cg (L2), never through L1.
//
// Workspace: barrier counter, flag[1], flag[2] | fill [rows] | hist0 [rows, 2048] (these
// zeroed by a memset before the launch) | hist1, hist2 [rows, 2048] (zeroed in phase 0) |
// state [rows, 3] (prefix, need) | counts [rows, num_chunks, 2] | candidates [rows,
// cand_cap, 2] (key, position).
#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/dsa/cuda.h"
#include "kernels/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kBins = 2048;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kMinChunk = 2048;
constexpr int kUnroll = 8;             // loads in flight per thread in the chunk loops
constexpr int kMaxCachedChunk = 8192;  // scores a block keeps in shared memory (32 KB)
// Phase 4 has every item of a row read the row's candidates twice: a row of many chunks
// collects in phase 1 only when num_chunks * candidates stays within this budget (else
// one more pass and barrier, after which the 22-bit bucket is typically tiny, is cheaper).
constexpr int64_t kCandidateReadBudget = int64_t{1} << 20;
constexpr int64_t kMaxCandidates = 16384;  // per row: a threshold bucket kept when this small

struct TopkArgs {
  DsaTopkParams p;
  int64_t chunk_len;
  int64_t num_chunks;  // per row
  int64_t num_rows;
  unsigned* barrier;  // [2]: the grid barrier's counter, then the slow-row flag
  int* fill;          // [rows] candidates appended so far
  int* hist;          // [3, rows, kBins]
  const int* hist0;   // [rows, kBins]: p.histogram, or hist's first part (phase 0 fills it)
  uint2* state;       // [rows, 3]
  int2* counts;       // [rows, num_chunks]
  uint2* cand;        // [rows, cand_cap] (key, position) of the threshold bucket
  int64_t cand_cap;
  int64_t cand_cap1;  // <= cand_cap: the bound for collecting in phase 1
  bool cache_chunk;   // one item per block, chunk_len <= kMaxCachedChunk: scores kept in smem
};

struct Layout {
  size_t barrier, fill, hist, state, counts, cand, total, memset_bytes;
};

Layout make_layout(int64_t rows, int64_t num_chunks, int64_t cand_cap) {
  Layout l{};
  l.barrier = 0;
  l.fill = dsa::kAlign;
  l.hist = l.fill + dsa::align_up(sizeof(int) * rows);
  l.state = l.hist + dsa::align_up(sizeof(int) * 3 * rows * kBins);
  l.counts = l.state + dsa::align_up(sizeof(uint2) * 3 * rows);
  l.cand = l.counts + dsa::align_up(sizeof(int2) * rows * num_chunks);
  l.total = l.cand + dsa::align_up(sizeof(uint2) * rows * cand_cap);
  l.memset_bytes = l.hist + sizeof(int) * rows * kBins;
  return l;
}

__device__ __forceinline__ uint32_t order_key(float x) {
  return dsa_order_key(x);
}

__device__ void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*reinterpret_cast<volatile unsigned*>(counter) < target) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();
}

// Warp-aggregated shared-memory histogram add; every lane of the warp must call it.
__device__ __forceinline__ void hist_add(int* h, uint32_t bin, bool active) {
  const unsigned mask = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(mask, bin);
  if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[bin], __popc(peers));
}

constexpr int kWarps = kThreads / 32;
constexpr int kRankGroups = kUnroll * kWarps;  // (u, warp) groups of a compaction super-tile
static_assert(kRankGroups % 32 == 0, "warp 0 scans the groups, kRankGroups / 32 per lane");

// Phase 4's per-super-tile counts and scanned offsets, per (u, warp) group.
struct RankScratch {
  int eq_count[kRankGroups];
  int gt_count[kRankGroups];
  int eq_before[kRankGroups];    // == K keys of the row before the group
  int take_before[kRankGroups];  // winners of the row before the group
  int taken_end, eq_end;         // the same after the super-tile
};

__device__ __forceinline__ int warp_exclusive_sum(int v, int lane) {
  int incl = v;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += n;
  }
  return incl - v;
}

struct Shared {
  union {
    cub::BlockScan<int, kThreads>::TempStorage scan;
    cub::BlockReduce<int, kThreads>::TempStorage reduce;
  } cub;
  RankScratch rank;
  int hist[kBins];
  int found_bin;
  int found_need;
};

// Finds the bin holding the need-th largest key among hist[0..num_bins) (counted from the
// top); returns it and how many keys of that bin are still needed. Block-wide. hist is in
// global memory written by other blocks (read through L2), or in shared memory.
template <bool kSharedHist = false>
__device__ void find_bin(Shared& sh, const int* hist, int num_bins, int need, int& bin,
                         int& need_in_bin) {
  int local[kBinsPerThread];
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kBinsPerThread; ++k) {
    const int idx = num_bins - 1 - (threadIdx.x * kBinsPerThread + k);
    local[k] = idx < 0 ? 0 : (kSharedHist ? hist[idx] : __ldcg(hist + idx));
    sum += local[k];
  }
  int above = 0;
  cub::BlockScan<int, kThreads>(sh.cub.scan).ExclusiveSum(sum, above);
  if (above < need && above + sum >= need) {
#pragma unroll
    for (int k = 0; k < kBinsPerThread; ++k) {
      if (above < need && above + local[k] >= need) {
        sh.found_bin = num_bins - 1 - (threadIdx.x * kBinsPerThread + k);
        sh.found_need = need - above;
      }
      above += local[k];
    }
  }
  __syncthreads();
  bin = sh.found_bin;
  need_in_bin = sh.found_need;
  __syncthreads();
}

struct Item {
  int64_t row, b, i, n, begin, end;  // positions [begin, end) of the row's n visible
  const float* scores;
  const float* cached;  // the chunk's scores in shared memory (from begin), or null
};

__device__ __forceinline__ uint32_t key_at(const Item& it, int64_t s) {
  return order_key(it.cached != nullptr ? it.cached[s - it.begin] : __ldg(it.scores + s));
}

__device__ Item make_item(const TopkArgs& a, int64_t item) {
  Item it;
  it.row = item / a.num_chunks;
  const int64_t c = item % a.num_chunks;
  it.b = it.row / a.p.batch.num_q;
  it.i = it.row % a.p.batch.num_q;
  const int64_t len = min(int64_t{a.p.batch.seq_lens[it.b]}, a.p.batch.max_context);
  const int64_t n = len - a.p.batch.num_q + it.i + 1;
  it.n = n < 0 ? 0 : n;
  it.begin = c * a.chunk_len;
  it.end = min(it.n, it.begin + a.chunk_len);
  it.scores = a.p.scores + it.row * a.p.score_stride;
  it.cached = nullptr;
  return it;
}

// Where a chunk appends its matched keys: cand[atomicAdd(fill, 1)] = (key, position).
struct Append {
  uint2* cand;  // null: nothing appended
  int* fill;
};

// Histogram of (key >> shift) & (num_bins - 1) over the chunk's keys with
// key >> match_shift == match (match_shift 32: every key), added to global hist; the
// matched keys are appended to out.cand when it is set. Returns this thread's count of
// keys with key >> match_shift > match (match_shift < 32).
__device__ int chunk_histogram(Shared& sh, const Item& it, int shift, int num_bins, int match_shift,
                               uint32_t match, int* global_hist, Append out = {nullptr, nullptr}) {
  int above = 0;
  for (int k = threadIdx.x; k < kBins; k += kThreads) sh.hist[k] = 0;
  __syncthreads();
  for (int64_t base = it.begin; base < it.end; base += kThreads * kUnroll) {
    uint32_t keys[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t s = base + u * kThreads + threadIdx.x;
      keys[u] = s < it.end ? key_at(it, s) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t s = base + u * kThreads + threadIdx.x;
      const bool active = s < it.end && (match_shift >= 32 || (keys[u] >> match_shift) == match);
      if (match_shift < 32) above += s < it.end && (keys[u] >> match_shift) > match;
      hist_add(sh.hist, (keys[u] >> shift) & (num_bins - 1), active);
      if (out.cand != nullptr) {  // warp-aggregated append
        const unsigned mask = __ballot_sync(0xffffffffu, active);
        const int lane = threadIdx.x & 31;
        int first = 0;
        if (lane == 0 && mask != 0) first = atomicAdd(out.fill, __popc(mask));
        first = __shfl_sync(0xffffffffu, first, 0);
        if (active) {
          out.cand[first + __popc(mask & ((1u << lane) - 1u))] =
              make_uint2(keys[u], static_cast<uint32_t>(s));
        }
      }
    }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < kBins; k += kThreads) {
    if (sh.hist[k] != 0) atomicAdd(&global_hist[k], sh.hist[k]);
  }
  return above;
}

// The phase after which a row (n > topk) kept its threshold bucket as candidates: 1 when
// the phase-0 bin (11-bit prefix) holds at most cand_cap keys, else 2 when the 22-bit
// bucket does, else 3 (none: the exact count pass). known = the last phase finished
// (1 or 2); after phase 1 the answer 2 means "2 or 3".
__device__ int row_level(const TopkArgs& a, int64_t row, int known) {
  const uint32_t prefix0 = __ldcg(a.state + row * 3).x;
  if (__ldcg(a.hist0 + row * kBins + (prefix0 >> 21)) <= a.cand_cap1) return 1;
  if (known < 2) return 2;
  const uint32_t prefix1 = __ldcg(a.state + row * 3 + 1).x;
  const int* hist1 = a.hist + (a.num_rows + row) * kBins;
  return __ldcg(hist1 + ((prefix1 >> 10) & (kBins - 1))) <= a.cand_cap ? 2 : 3;
}

__global__ void __launch_bounds__(kThreads, 2) topk_kernel(TopkArgs a) {
  __shared__ Shared sh;
  extern __shared__ float chunk_s[];  // [kMaxCachedChunk] when a.cache_chunk
  const DsaTopkParams& p = a.p;
  const int64_t num_items = a.num_rows * a.num_chunks;
  const int topk = static_cast<int>(p.topk);
  const int* hist0 = a.hist0;
  int* hist1 = a.hist + a.num_rows * kBins;
  int* hist2 = a.hist + 2 * a.num_rows * kBins;
  unsigned barrier_target = 0;

  // Phase 0.
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const Item it = make_item(a, item);
    if (it.begin == 0) {
      for (int k = threadIdx.x; k < kBins; k += kThreads) {
        hist1[it.row * kBins + k] = 0;
        hist2[it.row * kBins + k] = 0;
      }
    }
    if (it.n > topk && it.begin < it.end) {
      if (a.cache_chunk) {
#pragma unroll 4
        for (int64_t s = it.begin + threadIdx.x; s < it.end; s += kThreads) {
          chunk_s[s - it.begin] = __ldg(it.scores + s);
        }
        __syncthreads();
      }
      Item cached_it = it;
      if (a.cache_chunk) cached_it.cached = chunk_s;
      // With the indexer's histogram the scores are not read here (unless kept in shared).
      if (p.histogram == nullptr) {
        chunk_histogram(sh, cached_it, 21, kBins, 32, 0, a.hist + it.row * kBins);
      }
    }
    __syncthreads();
  }
  barrier_target += gridDim.x;
  grid_barrier(a.barrier, barrier_target);

  // Phases 1..3: scan the previous histogram, then histogram the next digit (or count).
  for (int phase = 1; phase <= 3; ++phase) {
    for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
      Item it = make_item(a, item);
      if (a.cache_chunk) it.cached = chunk_s;
      if (it.n <= topk) continue;  // uniform over the block
      uint32_t prefix = 0;
      int need = topk;
      if (phase > 1) {
        if (row_level(a, it.row, phase - 1) < phase) continue;  // finished in phase 4
        const uint2 st = __ldcg(a.state + it.row * 3 + phase - 2);
        prefix = st.x;
        need = static_cast<int>(st.y);
      }
      const int* scanned = phase == 1 ? hist0 + it.row * kBins
                                      : a.hist + ((phase - 1) * a.num_rows + it.row) * kBins;
      const int shift = phase == 1 ? 21 : (phase == 2 ? 10 : 0);
      int bin = 0, need_in_bin = 0;
      find_bin(sh, scanned, phase == 3 ? 1024 : kBins, need, bin, need_in_bin);
      prefix |= static_cast<uint32_t>(bin) << shift;
      if (it.begin == 0 && threadIdx.x == 0) {
        a.state[it.row * 3 + phase - 1] = make_uint2(prefix, static_cast<uint32_t>(need_in_bin));
      }
      // Phases 1 and 2, when the bucket just found holds at most cand_cap keys: its keys
      // are also appended to the row's candidates, the chunk's count of keys in higher
      // buckets (all winners) is stored for phase 4, and the row needs no later phase.
      // Otherwise flag[phase] tells every block that phase + 1 must run.
      const bool collect =
          phase < 3 && __ldcg(scanned + bin) <= (phase == 1 ? a.cand_cap1 : a.cand_cap);
      if (phase < 3 && !collect && it.begin == 0 && threadIdx.x == 0) {
        atomicOr(a.barrier + phase, 1u);
      }
      if (it.begin >= it.end) continue;
      if (phase < 3) {
        const Append out = collect ? Append{a.cand + it.row * a.cand_cap, a.fill + it.row}
                                   : Append{nullptr, nullptr};
        int above =
            phase == 1
                ? chunk_histogram(sh, it, 10, kBins, 21, prefix >> 21, hist1 + it.row * kBins, out)
                : chunk_histogram(sh, it, 0, 1024, 10, prefix >> 10, hist2 + it.row * kBins, out);
        __syncthreads();
        above = cub::BlockReduce<int, kThreads>(sh.cub.reduce).Sum(above);
        if (collect && threadIdx.x == 0) a.counts[item] = make_int2(above, 0);
      } else {
        int gt = 0, eq = 0;
#pragma unroll 8
        for (int64_t s = it.begin + threadIdx.x; s < it.end; s += kThreads) {
          const uint32_t key = key_at(it, s);
          gt += key > prefix;
          eq += key == prefix;
        }
        gt = cub::BlockReduce<int, kThreads>(sh.cub.reduce).Sum(gt);
        __syncthreads();
        eq = cub::BlockReduce<int, kThreads>(sh.cub.reduce).Sum(eq);
        if (threadIdx.x == 0) a.counts[item] = make_int2(gt, eq);
      }
      __syncthreads();
    }
    barrier_target += gridDim.x;
    grid_barrier(a.barrier, barrier_target);
    // No row needs the next phase (the flag is final after the barrier, so the test is
    // grid-uniform): skip it and its barrier.
    if (phase < 3 && __ldcg(a.barrier + phase) == 0) break;
  }

  // Phase 4: ordered compaction.
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    Item it = make_item(a, item);
    if (a.cache_chunk) it.cached = chunk_s;
    int32_t* slots = p.slots + it.row * p.topk;
    int32_t* positions = p.positions != nullptr ? p.positions + it.row * p.topk : nullptr;
    const int32_t* table = p.batch.block_tables + it.b * p.batch.max_blocks;
    auto slot_of = [&](int64_t s) {
      return table[s / p.block_size] * p.block_size + static_cast<int32_t>(s % p.block_size);
    };
    if (it.begin == 0) {
      const int64_t keep = min(it.n, p.topk);
      for (int64_t j = keep + threadIdx.x; j < p.topk; j += kThreads) {
        slots[j] = -1;
        if (positions != nullptr) positions[j] = -1;
      }
    }
    if (it.n <= topk) {
      for (int64_t s = it.begin + threadIdx.x; s < it.end; s += kThreads) {
        slots[s] = slot_of(s);
        if (positions != nullptr) positions[s] = static_cast<int32_t>(s);
      }
      continue;
    }
    if (it.begin >= it.end) continue;
    uint32_t threshold = 0;
    int need = 0;
    int gt_before = 0, eq_before = 0;  // winners and == K keys of the row's earlier chunks
    const int level = row_level(a, it.row, 2);
    if (level < 3) {
      // Threshold K from the candidates (the phase-`level` bucket's keys). Earlier chunks'
      // winners = their keys in higher buckets (counts) + candidates > K before begin.
      const uint2* cand = a.cand + it.row * a.cand_cap;
      int num_cand = 0;
      uint32_t prefix = 0;  // 22 bits
      int need_in_bin = 0;
      int bin = 0;
      if (level == 1) {
        // The 22-bit prefix from hist1, the last 10 bits from a shared histogram of the
        // candidates under it.
        const uint2 st = __ldcg(a.state + it.row * 3);
        num_cand = __ldcg(hist0 + it.row * kBins + (st.x >> 21));
        find_bin(sh, hist1 + it.row * kBins, kBins, static_cast<int>(st.y), bin, need_in_bin);
        prefix = st.x | (static_cast<uint32_t>(bin) << 10);
        for (int k = threadIdx.x; k < 1024; k += kThreads) sh.hist[k] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < num_cand; j += kThreads) {
          const uint32_t key = __ldcg(cand + j).x;
          if ((key >> 10) == (prefix >> 10)) atomicAdd(&sh.hist[key & 1023u], 1);
        }
        __syncthreads();
        find_bin<true>(sh, sh.hist, 1024, need_in_bin, bin, need);
      } else {
        // The last 10 bits from hist2 (phase 2 histogrammed exactly the candidates).
        const uint2 st = __ldcg(a.state + it.row * 3 + 1);
        prefix = st.x;
        num_cand = __ldcg(hist1 + it.row * kBins + ((prefix >> 10) & (kBins - 1)));
        find_bin(sh, hist2 + it.row * kBins, 1024, static_cast<int>(st.y), bin, need);
      }
      threshold = prefix | static_cast<uint32_t>(bin);
      for (int j = threadIdx.x; j < num_cand; j += kThreads) {
        const uint2 e = __ldcg(cand + j);
        if (e.y < it.begin) {
          gt_before += e.x > threshold;
          eq_before += e.x == threshold;
        }
      }
    } else {
      const uint2 st = __ldcg(a.state + it.row * 3 + 2);
      threshold = st.x;
      need = static_cast<int>(st.y);
    }
    const int64_t first_item = it.row * a.num_chunks;
    for (int64_t c = first_item + threadIdx.x; c < item; c += kThreads) {
      const int2 cnt = __ldcg(a.counts + c);
      gt_before += cnt.x;
      eq_before += cnt.y;
    }
    gt_before = cub::BlockReduce<int, kThreads>(sh.cub.reduce).Sum(gt_before);
    __syncthreads();
    eq_before = cub::BlockReduce<int, kThreads>(sh.cub.reduce).Sum(eq_before);
    if (threadIdx.x == 0) {
      sh.found_bin = gt_before + min(need, eq_before);
      sh.found_need = eq_before;
    }
    __syncthreads();
    int taken = sh.found_bin;
    int eq_seen = sh.found_need;
    __syncthreads();
    // Super-tiles of kUnroll tiles of kThreads positions: keys loaded together, the
    // super-tile skipped when no key reaches the threshold (the common case).
    for (int64_t base = it.begin; base < it.end; base += kThreads * kUnroll) {
      uint32_t keys[kUnroll];
      bool any = false;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = base + u * kThreads + threadIdx.x;
        keys[u] = s < it.end ? key_at(it, s) : 0u;
        any = any || (s < it.end && keys[u] >= threshold);
      }
      if (__syncthreads_or(any) == 0) continue;
      // Ranks in position order, (u, warp, lane) within the super-tile, from warp ballots:
      // each warp counts its keys > K and == K per u, warp 0 scans the kUnroll x kWarps
      // counts (the == K keys taken are the first `need` in position order), and every
      // lane places its winner at the scanned offset plus its rank inside the ballot.
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      const unsigned lanes_below = (1u << lane) - 1u;
      unsigned eq_mask[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const bool valid = base + u * kThreads + threadIdx.x < it.end;
        eq_mask[u] = __ballot_sync(0xffffffffu, valid && keys[u] == threshold);
        const unsigned gt_mask = __ballot_sync(0xffffffffu, valid && keys[u] > threshold);
        if (lane == 0) {
          sh.rank.eq_count[u * kWarps + warp] = __popc(eq_mask[u]);
          sh.rank.gt_count[u * kWarps + warp] = __popc(gt_mask);
        }
      }
      __syncthreads();
      if (warp == 0) {
        constexpr int kPer = kRankGroups / 32;  // consecutive groups per lane
        int eq_sum = 0;
#pragma unroll
        for (int e = 0; e < kPer; ++e) eq_sum += sh.rank.eq_count[lane * kPer + e];
        int eq_before = eq_seen + warp_exclusive_sum(eq_sum, lane);
        int take_count[kPer];
        int take_sum = 0;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int g = lane * kPer + e;
          sh.rank.eq_before[g] = eq_before;
          const int eq_taken = min(max(need - eq_before, 0), sh.rank.eq_count[g]);
          take_count[e] = sh.rank.gt_count[g] + eq_taken;
          take_sum += take_count[e];
          eq_before += sh.rank.eq_count[g];
        }
        int take_before = taken + warp_exclusive_sum(take_sum, lane);
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          sh.rank.take_before[lane * kPer + e] = take_before;
          take_before += take_count[e];
        }
        if (lane == 31) {
          sh.rank.taken_end = take_before;
          sh.rank.eq_end = eq_before;
        }
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = base + u * kThreads + threadIdx.x;
        const int g = u * kWarps + warp;
        const bool valid = s < it.end;
        const bool is_equal = valid && keys[u] == threshold;
        const bool take =
            valid && (keys[u] > threshold ||
                      (is_equal && sh.rank.eq_before[g] + __popc(eq_mask[u] & lanes_below) < need));
        const unsigned take_mask = __ballot_sync(0xffffffffu, take);
        if (take) {
          const int64_t out = sh.rank.take_before[g] + __popc(take_mask & lanes_below);
          slots[out] = slot_of(s);
          if (positions != nullptr) positions[out] = static_cast<int32_t>(s);
        }
      }
      taken = sh.rank.taken_end;
      eq_seen = sh.rank.eq_end;
      __syncthreads();
    }
  }
}

struct Plan {
  int64_t rows, num_chunks, chunk_len, cand_cap, cand_cap1;
  bool cache_chunk;
};

Plan make_plan(const DsaTopkParams& p, int64_t grid_capacity) {
  Plan plan{};
  plan.rows = p.batch.num_requests * p.batch.num_q;
  const int64_t ctx = std::max<int64_t>(p.batch.max_context, 1);
  const int64_t per_row = std::max<int64_t>(1, grid_capacity / std::max<int64_t>(plan.rows, 1));
  int64_t chunk = (ctx + per_row - 1) / per_row;
  chunk = std::max<int64_t>(kMinChunk, (chunk + kThreads - 1) / kThreads * kThreads);
  plan.chunk_len = chunk;
  plan.num_chunks = (ctx + chunk - 1) / chunk;
  plan.cache_chunk = plan.rows * plan.num_chunks <= grid_capacity && chunk <= kMaxCachedChunk;
  plan.cand_cap = std::min(kMaxCandidates, ctx);
  plan.cand_cap1 = std::min(plan.cand_cap, kCandidateReadBudget / plan.num_chunks);
  return plan;
}

// Every launch carries the chunk cache's shared memory, so the capacity never changes.
constexpr size_t kCachedBytes = sizeof(float) * kMaxCachedChunk;

// Blocks that can be resident at once (the cooperative grid's limit).
int64_t grid_capacity() {
  int device = 0, num_sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, topk_kernel, kThreads, kCachedBytes));
  CHECK(per_sm > 0, "dsa_topk: the kernel does not fit an SM");
  return int64_t{num_sms} * per_sm;
}

void check_params(const DsaTopkParams& p, bool need_pointers = true) {
  dsa::check_batch(p.batch, need_pointers);
  CHECK(p.topk > 0 && p.topk <= (int64_t{1} << 20), "topk ", p.topk);
  CHECK(p.score_stride >= p.batch.max_context, "score_stride ", p.score_stride, " < max_context ",
        p.batch.max_context);
  CHECK(p.block_size > 0 && (p.block_size & (p.block_size - 1)) == 0, "block_size ", p.block_size);
}

}  // namespace

size_t dsa_topk_workspace_bytes(const DsaTopkParams& p) {
  check_params(p, /*need_pointers=*/false);
  const Plan plan = make_plan(p, grid_capacity());
  return make_layout(plan.rows, plan.num_chunks, plan.cand_cap).total;
}

void dsa_topk(const DsaTopkParams& p, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  check_params(p);
  if (p.batch.num_requests == 0) return;
  CHECK(p.scores != nullptr && p.slots != nullptr, "null scores or slots");
  const int64_t capacity = grid_capacity();
  const Plan plan = make_plan(p, capacity);
  const Layout layout = make_layout(plan.rows, plan.num_chunks, plan.cand_cap);
  CHECK(workspace != nullptr && workspace_bytes >= layout.total, "dsa_topk workspace of ",
        workspace_bytes, " bytes, need ", layout.total);
  CHECK(reinterpret_cast<uintptr_t>(workspace) % dsa::kAlign == 0,
        "dsa_topk workspace must be 256-byte aligned");
  auto* base = static_cast<char*>(workspace);
  TopkArgs a{.p = p,
             .chunk_len = plan.chunk_len,
             .num_chunks = plan.num_chunks,
             .num_rows = plan.rows,
             .barrier = reinterpret_cast<unsigned*>(base + layout.barrier),
             .fill = reinterpret_cast<int*>(base + layout.fill),
             .hist = reinterpret_cast<int*>(base + layout.hist),
             .hist0 = p.histogram != nullptr ? p.histogram
                                             : reinterpret_cast<const int*>(base + layout.hist),
             .state = reinterpret_cast<uint2*>(base + layout.state),
             .counts = reinterpret_cast<int2*>(base + layout.counts),
             .cand = reinterpret_cast<uint2*>(base + layout.cand),
             .cand_cap = plan.cand_cap,
             .cand_cap1 = plan.cand_cap1,
             .cache_chunk = plan.cache_chunk};
  CUDA_CHECK(cudaMemsetAsync(base, 0, layout.memset_bytes, stream));
  const int64_t grid = std::min(capacity, plan.rows * plan.num_chunks);
  // Cooperative (all blocks resident, or the launch fails) through the launch attribute,
  // which stream capture turns into a cooperative kernel node.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kCachedBytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, topk_kernel, a));
}

}  // namespace hyserve::cuda
