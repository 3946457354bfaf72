// Exact top-k over the indexer scores (cuda.h): one memset and three or four launches
// (each after the first overlapped with the one before: dsa_common.cuh), no grid
// barrier, no cooperative launch, no sort; topk <= 8192.
//
// Row r = (b, i) has n visible scores (positions 0..n-1). key(x) = float_order_key(x), the
// order-preserving uint32 (-0 == +0); its bin is key >> 21 (11 bits, 2048 bins). For a row
// with n > topk: T = the bin holding the topk-th largest key (counted from the top bin),
// A = the keys in bins above T (A < topk), C = the keys in bin T. A row's list holds at
// most list_cap = min(20480, max_context) entries (the select's shared memory).
//
// Chunks are cut on the 16-byte aligned view of a row: position s sits at slot s + head,
// head = the row's misalignment in floats (score_stride may be anything), so each thread
// loads whole float4s (4 per tile, 64 bytes in flight) and scalars only at a row's ends.
// A tile is kStreamTile = 4096 aligned slots; a chunk is whole tiles, so tile ti of a row
// (slots [4096 ti, 4096 ti + 4096)) is the same in every kernel.
//
// Runs: a streaming block appends the keys it takes from one tile as one run. One atomic
// on fill[r] reserves list[r][base, base + count); the keys land there in ascending
// position order; run_count[r][ti] = count and run_base[r][ti] = base record the run. A
// row's list is thus the concatenation of its tiles' runs, each in position order, the
// runs in the atomics' order; the runs' counts in tile order give every entry its rank in
// position order.
//
//   hist_kernel     [rows x chunks blocks] per chunk a shared histogram of the bins, added
//                   to hist0[r] with integer atomics (exact, so every later decision is
//                   exact too). Skipped when the indexer counted them (p.histogram).
//   collect_kernel  [rows x chunks] each block scans hist0[r] for T, A, C (the same answer
//                   in every block of the row; chunk 0's block stores it in state[r]), then
//                   reads its chunk once:
//                     A + C <= list_cap ("list row"): it appends every key of bin >= T,
//                       with its position, one run per tile;
//                     else: it counts the next 11 bits (key[20:10]) of the bin-T keys into
//                       hist1[r] and appends nothing.
//   refine_kernel   [rows x chunks] rows that built hist1 only: T2 = the hist1 bin holding
//                   the (topk - A)-th key of bin T, A2 / C2 = the bin-T keys above / in it.
//                     A + A2 + C2 <= list_cap ("refined list row"): it appends the keys
//                       whose 22-bit prefix is >= (T, T2) (bins above T and the top of bin
//                       T), one run per tile;
//                     else the row is "full" (more than list_cap - topk keys share the
//                       threshold's 22-bit prefix: massive ties), noted in state2[r].
//   select_kernel   [rows] one block of 512 threads per row:
//                     n <= topk: positions 0..n-1, then -1;
//                     list rows: a block scan of the runs' counts over the row's tiles
//                       places each run, so the list lands in shared memory in ascending
//                       position order, as composites c = key << 32 | (2^32 - 1 - position).
//                       MSB-first radix select on the key bits below the known 11 (or 22),
//                       in digits of up to 11 bits, stopping when the chosen bucket holds
//                       exactly the entries still needed, gives a key prefix P and need_eq:
//                       the winners are the entries above P and the first need_eq equal to
//                       P in position order (when P is the whole key, the ties at the
//                       threshold: the lower positions win). One block scan of the two
//                       counts over the ordered list writes them in position order;
//                     full rows: the last 10 bits of the threshold key K from one pass over
//                       the row, then a pass in position order takes the keys > K and the
//                       first `need` keys == K (block scans), so the output needs no sort.
// L2: a pass that a later one follows over the same scores (hist, the refine rows'
// counting) loads them evict-last where they fit (dsa::keep_scores_in_l2), the last pass
// evict-first.
// Every block of a row derives the same T, A, C (and T2, A2, C2) from the same exact
// histograms; the order of the runs depends on atomics, the ordered list and the winners
// do not, so the result is deterministic and equal to cpu::dsa_topk for NaN-free rows.
//
// select's shared memory: the list (8 list_cap bytes), a histogram (8 KB) and one int per
// tile of max_context (the runs' places). With list_cap 20480 on a 227 KB device (sm_90)
// that bounds max_context to about 59M positions; the launcher refuses longer ones.
//
// Workspace (256-byte aligned parts; all sizes from B, n_q and max_context; tiles =
// ceil((max_context + 3) / 4096), every row's tiles whatever its head):
//   hist0 [rows, 2048] int (when the indexer gave none, or dsa_decode's indexer builds
//   it here) | fill [rows] int: list entries | hist1 [rows, 2048] int |
//   run_count [rows, tiles] int: a tile's run length (0: none)
//                                <- these zeroed by one memset per call (dsa_decode's
//                                   memset before the indexer, or the top-k's own)
//   state [rows] int4 (T, A, C, refine?) | state2 [rows] int4 (T2, A2, C2, full?) |
//   run_base [rows, tiles] int: a run's first list index (read only where run_count > 0) |
//   list [rows, list_cap] uint64 composites   <- written before they are read in each call
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "kernels/attention/dsa/cuda/dsa_topk_stream.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using namespace topk_stream;  // the streaming helpers (dsa_topk_stream.cuh)

__global__ void __launch_bounds__(kStreamThreads, kStreamResident) hist_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
  dsa::follow_previous_grid();
  const Chunk c = make_chunk(a);
  if (c.begin >= c.end) return;
  zero_hist(sh.hist, kBins, kStreamThreads);
  __syncthreads();
  int* hist = sh.hist;
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end, a.keep_scores ? dsa::l2_evict_last() : dsa::l2_evict_normal(),
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t) {
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          hist_add(hist, keys[k] >> kBinShift, (valid >> k) & 1u);
        }
      });
  __syncthreads();
  flush_hist(sh.hist, a.hist0_out + c.row.index * kBins);
}

__global__ void __launch_bounds__(kStreamThreads, kStreamResident) collect_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
  dsa::follow_previous_grid();
  const Chunk c = make_chunk(a);
  if (c.begin >= c.end) return;
  const int64_t row = c.row.index;
  const int* hist0 = a.hist0 + row * kBins;
  const Found f = find_bin<kStreamThreads>(sh.scan, kBins, static_cast<int>(a.p.topk),
                                           [&](int bin) { return hist0[bin]; });
  const bool refine = int64_t{f.above} + f.count > a.list_cap;
  if (c.index == 0 && threadIdx.x == 0) a.state[row] = make_int4(f.bin, f.above, f.count, refine);
  if (refine) zero_hist(sh.hist, kBins, kStreamThreads);
  __syncthreads();
  const uint32_t t_bin = static_cast<uint32_t>(f.bin);
  if (!refine) {
    // The keys of bin >= T are the keys >= T << 21 (invalid keys read 0, so the valid mask
    // still applies when T = 0).
    append_at_least(a, c, sh, t_bin << kBinShift);
    return;
  }
  // Refine rows append in refine_kernel (so that each tile is one run); here they count
  // the next 11 bits of their bin-T keys.
  int* hist = sh.hist;
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end, a.keep_scores ? dsa::l2_evict_last() : dsa::l2_evict_normal(),
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t) {
        uint32_t in_bin = 0;
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          in_bin |= static_cast<uint32_t>((keys[k] >> kBinShift) == t_bin) << k;
        }
        in_bin &= valid;
        if (__any_sync(kFullMask, in_bin != 0u)) {
#pragma unroll
          for (int k = 0; k < kKeysPerThread; ++k) {
            hist_add(hist, (keys[k] >> 10) & (kBins - 1), (in_bin >> k) & 1u);
          }
        }
      });
  __syncthreads();
  flush_hist(sh.hist, a.hist1 + row * kBins);
}

__global__ void __launch_bounds__(kStreamThreads, kStreamResident) refine_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
  dsa::follow_previous_grid();
  const Chunk c = make_chunk(a);
  if (c.begin >= c.end) return;
  const int64_t row = c.row.index;
  const int4 st = a.state[row];
  if (st.w == 0) return;
  const int* hist1 = a.hist1 + row * kBins;
  const Found f = find_bin<kStreamThreads>(sh.scan, kBins, static_cast<int>(a.p.topk) - st.y,
                                           [&](int bin) { return hist1[bin]; });
  const bool full = int64_t{st.y} + f.above + f.count > a.list_cap;
  if (c.index == 0 && threadIdx.x == 0) a.state2[row] = make_int4(f.bin, f.above, f.count, full);
  if (full) return;
  // A 22-bit prefix; the keys at or above it (key >> 10 >= prefix, i.e. key >= prefix <<
  // 10) are the bins above T and the top of bin T.
  const uint32_t prefix = (static_cast<uint32_t>(st.x) << 11) | static_cast<uint32_t>(f.bin);
  append_at_least(a, c, sh, prefix << 10);
}

// select_kernel's dynamic shared memory: [list: list_cap composites] [hist: kBins counts]
// [run_shift: num_tiles ints, a run's place in the ordered list minus its base].
struct SelectLayout {
  size_t hist, run_shift, total;
};

__host__ __device__ inline SelectLayout select_layout(int list_cap, int num_tiles) {
  SelectLayout l{};
  l.hist = sizeof(uint64_t) * static_cast<size_t>(list_cap);
  l.run_shift = l.hist + sizeof(int) * kBins;
  l.total = l.run_shift + sizeof(int) * static_cast<size_t>(num_tiles);
  return l;
}

using SelectShared = ScanShared<kSelectThreads>;
using SelectScan = cub::BlockScan<int, kSelectThreads>;

// The tile of position pos in a row of misalignment head.
__device__ __forceinline__ int tile_of(uint32_t pos, int head) {
  return static_cast<int>((pos + static_cast<uint32_t>(head)) / static_cast<uint32_t>(kStreamTile));
}

// Writes entry j of row r's output: position pos and its slot (both -1 when empty).
__device__ __forceinline__ void put_slot(const TopkArgs& a, const Row& r, int64_t j, int64_t pos,
                                         int32_t slot) {
  const int64_t out = r.index * a.p.topk + j;
  a.p.slots[out] = slot;
  if (a.p.positions != nullptr) a.p.positions[out] = static_cast<int32_t>(pos);
}

// Writes entry j of row r's output: position pos and its slot, or -1 for both (pos < 0).
__device__ __forceinline__ void put(const TopkArgs& a, const Row& r, int64_t j, int64_t pos) {
  put_slot(a, r, j, pos,
           pos >= 0 ? static_cast<int32_t>(dsa_slot(a.p.batch, a.p.block_size, r.b, pos)) : -1);
}

// List rows: the winners among the row's fill list entries, whose keys agree with prefix
// above bit `low` or exceed it there; `need` of those agreeing are winners.
__device__ void select_list(const TopkArgs& a, const Row& r, SelectShared& sh, uint8_t* smem,
                            int fill, uint32_t prefix, int low, int need) {
  const SelectLayout layout = select_layout(a.list_cap, a.num_tiles);
  auto* list = reinterpret_cast<uint64_t*>(smem);
  auto* hist = reinterpret_cast<int*>(smem + layout.hist);
  auto* run_shift = reinterpret_cast<int*>(smem + layout.run_shift);
  const int topk = static_cast<int>(a.p.topk);
  const int num = min(fill, a.list_cap);
  const int head = row_head(r.scores);

  // Each run's place in position order: an exclusive scan of the run lengths in tile order.
  // A list cut at list_cap (only when the caller's histogram does not match the scores)
  // keeps its runs' entries below num, so the places still cover [0, num) exactly.
  const int num_tiles = static_cast<int>((r.n + head + kStreamTile - 1) / kStreamTile);
  const int* run_count = a.run_count + r.index * a.num_tiles;
  const int* run_base = a.run_base + r.index * a.num_tiles;
  int placed = 0;  // entries of the tiles before this step
  for (int step = 0; step < num_tiles; step += kSelectThreads * kRunItems) {
    const int tile0 = step + static_cast<int>(threadIdx.x) * kRunItems;
    int len[kRunItems], base[kRunItems], place[kRunItems];
#pragma unroll
    for (int i = 0; i < kRunItems; ++i) {
      const int count = tile0 + i < num_tiles ? run_count[tile0 + i] : 0;
      base[i] = count > 0 ? run_base[tile0 + i] : 0;
      len[i] = min(count, max(num - base[i], 0));
    }
    int step_total = 0;
    SelectScan(sh.scan).ExclusiveSum(len, place, step_total);
#pragma unroll
    for (int i = 0; i < kRunItems; ++i) {
      if (tile0 + i < num_tiles) run_shift[tile0 + i] = placed + place[i] - base[i];
    }
    placed += step_total;
    __syncthreads();  // the scan's storage is reused, run_shift read below
  }

  // The list (written by the streaming kernels, so read through L2) in position order:
  // entry j of tile ti's run goes to j + run_shift[ti]. kLoadItems loads per thread in flight.
  const uint64_t* src = a.list + r.index * a.list_cap;
  for (int step = 0; step < num; step += kSelectThreads * kLoadItems) {
    uint64_t c[kLoadItems];
#pragma unroll
    for (int i = 0; i < kLoadItems; ++i) {
      const int j = step + i * kSelectThreads + static_cast<int>(threadIdx.x);
      c[i] = j < num ? __ldcg(src + j) : 0;
    }
#pragma unroll
    for (int i = 0; i < kLoadItems; ++i) {
      const int j = step + i * kSelectThreads + static_cast<int>(threadIdx.x);
      if (j < num) list[j + run_shift[tile_of(composite_position(c[i]), head)]] = c[i];
    }
  }
  __syncthreads();

  // Radix select on the key bits below the known prefix, in digits of up to 11 bits. Ties
  // below the last digit are left to the position order.
  while (low > 0) {
    const int width = min(11, low);
    const int shift = low - width;
    const int num_bins = 1 << width;
    zero_hist(hist, num_bins, kSelectThreads);
    __syncthreads();
    for (int j = threadIdx.x; j < num; j += kSelectThreads) {
      const uint32_t key = composite_key(list[j]);
      hist_add(hist, (key >> shift) & static_cast<uint32_t>(num_bins - 1),
               (key >> low) == (prefix >> low));
    }
    __syncthreads();
    const Found f =
        find_bin<kSelectThreads>(sh, num_bins, need, [&](int bin) { return hist[bin]; });
    prefix |= static_cast<uint32_t>(f.bin) << shift;
    need -= f.above;
    low = shift;
    if (f.count == need) break;  // every entry of the bucket is a winner
  }

  // Winners in position order: the keys above prefix on the bits above low, and the first
  // need of those equal to it there. Thread t takes entries [t per, t per + per), per odd so
  // that a half-warp's 8-byte reads hit 16 different bank pairs; one block scan of both
  // counts packed (gt << 16 | eq: gt < topk <= 8192 and eq <= list_cap <= 20480 when the
  // histogram matches; gt <= 20480 keeps it positive otherwise).
  const uint32_t threshold = prefix >> low;
  const int per = ((num + kSelectThreads - 1) / kSelectThreads) | 1;
  const int begin = min(static_cast<int>(threadIdx.x) * per, num);
  const int end = min(begin + per, num);
  int gt = 0, eq = 0;
  for (int j = begin; j < end; ++j) {
    const uint32_t bits = composite_key(list[j]) >> low;
    gt += bits > threshold;
    eq += bits == threshold;
  }
  int before = 0, total = 0;
  SelectScan(sh.scan).ExclusiveSum((gt << 16) | eq, before, total);
  int gt_before = before >> 16, eq_before = before & 0xffff;
  // kPutItems winners at a time: their block-table loads all in flight before the stores.
  for (int j0 = begin; j0 < end; j0 += kPutItems) {
    int out[kPutItems];
    uint32_t pos[kPutItems];
    int32_t slot[kPutItems];
#pragma unroll
    for (int i = 0; i < kPutItems; ++i) {
      const bool ok = j0 + i < end;
      const uint64_t c = ok ? list[j0 + i] : 0;
      const uint32_t bits = composite_key(c) >> low;
      const bool is_gt = ok && bits > threshold, is_eq = ok && bits == threshold;
      const bool take = is_gt || (is_eq && eq_before < need);
      out[i] = take ? gt_before + min(eq_before, need) : topk;
      gt_before += is_gt;
      eq_before += is_eq;
      pos[i] = composite_position(c);
      slot[i] = out[i] < topk
                    ? static_cast<int32_t>(dsa_slot(a.p.batch, a.p.block_size, r.b, pos[i]))
                    : -1;
    }
#pragma unroll
    for (int i = 0; i < kPutItems; ++i) {
      if (out[i] < topk) put_slot(a, r, out[i], pos[i], slot[i]);
    }
  }
  // Exactly topk winners unless the caller's histogram does not match the scores.
  const int num_winners = min((total >> 16) + min(total & 0xffff, need), topk);
  for (int j = num_winners + static_cast<int>(threadIdx.x); j < topk; j += kSelectThreads) {
    put(a, r, j, -1);
  }
}

// Full rows (massive ties): the threshold key K below the known 22-bit prefix from one pass
// over the row, then the winners in position order: keys > K and the first need_eq == K.
__device__ void select_full(const TopkArgs& a, const Row& r, SelectShared& sh, int* hist,
                            uint32_t prefix, int need) {
  const int topk = static_cast<int>(a.p.topk);
  zero_hist(hist, 1024, kSelectThreads);
  __syncthreads();
  for_each_tile<kSelectThreads, kStreamVecs>(
      r, 0, r.n + row_head(r.scores), dsa::l2_evict_first(),
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t) {
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          const bool ok = (valid >> k) & 1u;
          hist_add(hist, keys[k] & 1023u, ok && (keys[k] >> 10) == prefix);
        }
      });
  __syncthreads();
  const Found f = find_bin<kSelectThreads>(sh, 1024, need, [&](int bin) { return hist[bin]; });
  const uint32_t threshold = (prefix << 10) | static_cast<uint32_t>(f.bin);
  const int need_eq = need - f.above;

  int taken = 0, eq_seen = 0;  // block-uniform: winners and == K keys before the step
  for (int64_t base = 0; base < r.n && taken < topk;
       base += int64_t{kSelectThreads} * kOrderedItems) {
    const int64_t first = base + int64_t{threadIdx.x} * kOrderedItems;
    uint32_t keys[kOrderedItems];
    int gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kOrderedItems; ++j) {
      const bool ok = first + j < r.n;
      keys[j] = ok ? float_order_key(__ldg(r.scores + first + j)) : 0u;
      gt += ok && keys[j] > threshold;
      eq += ok && keys[j] == threshold;
    }
    if (__syncthreads_or(gt + eq > 0) == 0) continue;
    int eq_before = 0, eq_total = 0;
    SelectScan(sh.scan).ExclusiveSum(eq, eq_before, eq_total);
    eq_before += eq_seen;
    uint32_t take = 0;
#pragma unroll
    for (int j = 0; j < kOrderedItems; ++j) {
      const bool ok = first + j < r.n;
      if (ok && keys[j] > threshold) {
        take |= 1u << j;
      } else if (ok && keys[j] == threshold) {
        if (eq_before < need_eq) take |= 1u << j;
        ++eq_before;
      }
    }
    __syncthreads();
    int out = 0, taken_total = 0;
    SelectScan(sh.scan).ExclusiveSum(__popc(take), out, taken_total);
    out += taken;
#pragma unroll
    for (int j = 0; j < kOrderedItems; ++j) {
      if ((take >> j) & 1u) {
        if (out < topk) put(a, r, out, first + j);
        ++out;
      }
    }
    taken += taken_total;
    eq_seen += eq_total;
    __syncthreads();
  }
  for (int64_t j = taken + threadIdx.x; j < topk; j += kSelectThreads) put(a, r, j, -1);
}

__global__ void __launch_bounds__(kSelectThreads, 1) select_kernel(TopkArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ SelectShared sh;
  dsa::follow_previous_grid();
  const DsaTopkParams& p = a.p;
  // The row's state from the streaming kernels and its list length are requested with its
  // length (independent loads, one round trip instead of three; unused when n <= topk),
  // and the request's block table is prefetched into L2 for the winners' slots.
  const int4 st = a.state[blockIdx.x];
  const int4 st2 = a.state2[blockIdx.x];
  const int fill = a.fill[blockIdx.x];
  const Row r = make_row(a, blockIdx.x);
  const int32_t* table = p.batch.block_tables + r.b * p.batch.max_blocks;
  for (int64_t e = int64_t{threadIdx.x} * 32; e < p.batch.max_blocks;
       e += int64_t{kSelectThreads} * 32) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(table + e));
  }
  if (r.n <= p.topk) {
    for (int64_t j = threadIdx.x; j < p.topk; j += kSelectThreads) put(a, r, j, j < r.n ? j : -1);
    return;
  }
  const int topk = static_cast<int>(p.topk);
  if (st.w == 0) {  // the list holds bin T and above
    select_list(a, r, sh, smem, fill, static_cast<uint32_t>(st.x) << kBinShift, kBinShift,
                topk - st.y);
    return;
  }
  const uint32_t prefix = (static_cast<uint32_t>(st.x) << 11) | static_cast<uint32_t>(st2.x);
  const int need = topk - st.y - st2.y;
  if (st2.w == 0) {  // the list holds the 22-bit bucket (T, T2) and above
    select_list(a, r, sh, smem, fill, prefix << 10, 10, need);
  } else {
    const SelectLayout layout = select_layout(a.list_cap, a.num_tiles);
    select_full(a, r, sh, reinterpret_cast<int*>(smem + layout.hist), prefix, need);
  }
}

struct Plan {
  int64_t rows, chunk_len, num_chunks;
  int list_cap, num_tiles;
};

Plan make_plan(const DsaTopkParams& p, int64_t num_sms) {
  Plan plan{};
  plan.rows = p.batch.num_requests * p.batch.num_q;
  const int64_t ctx = std::max<int64_t>(p.batch.max_context, 1);
  // Cut each row so that about kBlocksPerSm streaming blocks per SM exist even at one row.
  const int64_t span = ctx + 3;  // aligned slots of a row: positions + head
  const int64_t target = kBlocksPerSm * num_sms;
  const int64_t per_row =
      std::max<int64_t>(1, (target + plan.rows - 1) / std::max<int64_t>(plan.rows, 1));
  const int64_t chunk = (span + per_row - 1) / per_row;
  plan.chunk_len = (chunk + kStreamTile - 1) / kStreamTile * kStreamTile;
  plan.num_chunks = (span + plan.chunk_len - 1) / plan.chunk_len;
  plan.list_cap = static_cast<int>(std::min(kListCap, ctx));
  plan.num_tiles = static_cast<int>((span + kStreamTile - 1) / kStreamTile);
  return plan;
}

struct Layout {
  size_t hist0, fill, hist1, run_count, zero_end, state, state2, run_base, list, total;
};

Layout make_layout(const Plan& plan) {
  Layout l{};
  const size_t hist_bytes = sizeof(int) * plan.rows * kBins;
  const size_t runs_bytes = sizeof(int) * plan.rows * plan.num_tiles;
  l.hist0 = 0;  // first: dsa_decode's indexer builds its histogram at the workspace's start
  l.fill = l.hist0 + dsa::align_up(hist_bytes);
  l.hist1 = l.fill + dsa::align_up(sizeof(int) * plan.rows);
  l.run_count = l.hist1 + dsa::align_up(hist_bytes);
  l.zero_end = l.run_count + runs_bytes;
  l.state = l.run_count + dsa::align_up(runs_bytes);
  l.state2 = l.state + dsa::align_up(sizeof(int4) * plan.rows);
  l.run_base = l.state2 + dsa::align_up(sizeof(int4) * plan.rows);
  l.list = l.run_base + dsa::align_up(runs_bytes);
  l.total = l.list + dsa::align_up(sizeof(uint64_t) * plan.rows * plan.list_cap);
  return l;
}

// validate (need_pointers) or validate_sizes (check.h), then the CUDA-only limits: the
// grids, and a row's list in its select block's shared memory.
void check_params(const DsaTopkParams& p, bool need_pointers = true) {
  if (need_pointers) {
    validate(p);
  } else {
    validate_sizes(p);
  }
  dsa::check_cuda_limits(p.batch, "dsa_topk");
  CHECK(p.topk <= kMaxTopk, "dsa_topk supports topk in 1..", kMaxTopk,
        " (a row's list must leave room beside the winners), got ", p.topk);
}

}  // namespace

size_t dsa_topk_workspace_bytes(const DsaTopkParams& p) {
  check_params(p, /*need_pointers=*/false);
  const Plan plan = make_plan(p, 1);
  return make_layout(plan).total;
}

namespace {

// prezeroed: the caller zeroed the workspace's start; after_kernel: the stream's last
// operation is a kernel (dsa::topk_prezeroed).
void run_topk(const DsaTopkParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
              bool prezeroed, bool after_kernel) {
  check_params(p);
  if (p.batch.num_requests == 0) return;
  CHECK(reinterpret_cast<uintptr_t>(p.scores) % sizeof(float) == 0,
        "dsa_topk scores must be 4-byte aligned");
  int device = 0, num_sms = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const Plan plan = make_plan(p, num_sms);
  const Layout layout = make_layout(plan);
  CHECK(workspace != nullptr && workspace_bytes >= layout.total, "dsa_topk workspace of ",
        workspace_bytes, " bytes, need ", layout.total);
  CHECK(reinterpret_cast<uintptr_t>(workspace) % dsa::kAlign == 0,
        "dsa_topk workspace must be 256-byte aligned");
  const int64_t stream_blocks = plan.rows * plan.num_chunks;
  CHECK(stream_blocks < (int64_t{1} << 31), "dsa_topk: ", plan.rows, " rows x ", plan.num_chunks,
        " chunks");
  const SelectLayout select = select_layout(plan.list_cap, plan.num_tiles);
  CHECK(select.total + sizeof(SelectShared) <= static_cast<size_t>(max_smem),
        "dsa_topk select needs ", select.total + sizeof(SelectShared),
        " bytes of shared memory (a list of ", plan.list_cap, " entries and ", plan.num_tiles,
        " tiles of ", kStreamTile, " positions for max_context ", p.batch.max_context,
        "), the device has ", max_smem);
  auto* base = static_cast<char*>(workspace);
  auto* hist0 = reinterpret_cast<int*>(base + layout.hist0);
  const TopkArgs a{
      .p = p,
      .chunk_len = plan.chunk_len,
      .num_chunks = plan.num_chunks,
      .list_cap = plan.list_cap,
      .num_tiles = plan.num_tiles,
      .hist0 = p.histogram != nullptr ? p.histogram : hist0,
      .hist0_out = hist0,
      .fill = reinterpret_cast<int*>(base + layout.fill),
      .hist1 = reinterpret_cast<int*>(base + layout.hist1),
      .state = reinterpret_cast<int4*>(base + layout.state),
      .state2 = reinterpret_cast<int4*>(base + layout.state2),
      .run_count = reinterpret_cast<int*>(base + layout.run_count),
      .run_base = reinterpret_cast<int*>(base + layout.run_base),
      .list = reinterpret_cast<uint64_t*>(base + layout.list),
      .keep_scores = dsa::keep_scores_in_l2(sizeof(float) * plan.rows * p.batch.max_context)};
  // hist0 (when computed here), fill, hist1 and run_count start at zero.
  const size_t zero_from = p.histogram != nullptr ? layout.fill : layout.hist0;
  if (!prezeroed) {
    CUDA_CHECK(cudaMemsetAsync(base + zero_from, 0, layout.zero_end - zero_from, stream));
  }
  // The kernels are launched overlapped with the one before (dsa_common.cuh), except the
  // first when a memset (this call's own) or other work precedes it.
  const auto grid = static_cast<unsigned>(stream_blocks);
  const auto launch_first = [&](void (*kernel)(TopkArgs)) {
    if (after_kernel) {
      dsa::launch_overlapped(kernel, grid, kStreamThreads, 0, stream, a);
    } else {
      kernel<<<grid, kStreamThreads, 0, stream>>>(a);
      CUDA_CHECK_LAUNCH();
    }
  };
  if (p.histogram == nullptr) {
    launch_first(hist_kernel);
    dsa::launch_overlapped(collect_kernel, grid, kStreamThreads, 0, stream, a);
  } else {
    launch_first(collect_kernel);
  }
  // A row needs the refine pass only when the keys of its threshold's bin and above
  // exceed list_cap; with list_cap = max_context (contexts up to kListCap) none can.
  if (plan.list_cap < p.batch.max_context) {
    dsa::launch_overlapped(refine_kernel, grid, kStreamThreads, 0, stream, a);
  }
  CUDA_CHECK(cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(select.total)));
  dsa::launch_overlapped(select_kernel, static_cast<unsigned>(plan.rows), kSelectThreads,
                         select.total, stream, a);
}

}  // namespace

void dsa_topk(const DsaTopkParams& p, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  run_topk(p, workspace, workspace_bytes, stream, /*prezeroed=*/false, /*after_kernel=*/false);
}

namespace dsa {

bool keep_scores_in_l2(size_t score_bytes) {
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  return score_bytes <= static_cast<size_t>(l2_bytes) / 4 * 3;
}

size_t topk_zero_bytes(const DsaTopkParams& p) {
  check_params(p, /*need_pointers=*/false);
  return make_layout(make_plan(p, 1)).zero_end;
}

void topk_prezeroed(const DsaTopkParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, bool after_kernel) {
  run_topk(p, workspace, workspace_bytes, stream, /*prezeroed=*/true, after_kernel);
}

}  // namespace dsa
}  // namespace hyserve::cuda
