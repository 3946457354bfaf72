// Exact top-k over the indexer scores (cuda.h): one memset and three or four plain
// launches, no grid barrier, no cooperative launch; topk <= 8192.
//
// Row r = (b, i) has n visible scores (positions 0..n-1). key(x) = dsa_order_key(x), the
// order-preserving uint32 (-0 == +0); its bin is key >> 21 (11 bits, 2048 bins). For a row
// with n > topk: T = the bin holding the topk-th largest key (counted from the top bin),
// A = the keys in bins above T (A < topk), C = the keys in bin T. A row's list holds at
// most list_cap = min(20480, max_context) entries, rounded up to even (the select's shared
// memory).
//
//   hist_kernel     [rows x chunks blocks] per chunk a shared histogram of the bins, added
//                   to hist0[r] with integer atomics (exact, so every later decision is
//                   exact too). Skipped when the indexer counted them (p.histogram).
//   collect_kernel  [rows x chunks] each block scans hist0[r] for T, A, C (the same answer
//                   in every block of the row; chunk 0's block stores it in state[r]), then
//                   reads its chunk once:
//                     A + C <= list_cap ("list row"): it appends every key of bin >= T,
//                       with its position, to the row's list (any order);
//                     else: it appends the keys of bins > T (fewer than topk) and counts
//                       the next 11 bits (key[20:10]) of the bin-T keys into hist1[r].
//   refine_kernel   [rows x chunks] rows that built hist1 only: T2 = the hist1 bin holding
//                   the (topk - A)-th key of bin T, A2 / C2 = the bin-T keys above / in it.
//                     A + A2 + C2 <= list_cap ("refined list row"): it appends the bin-T
//                       keys whose 22-bit prefix is >= (T, T2);
//                     else the row is "full" (more than list_cap - topk keys share the
//                       threshold's 22-bit prefix: massive ties), noted in state2[r].
//   select_kernel   [rows] one block of 512 threads per row:
//                     n <= topk: positions 0..n-1, then -1;
//                     list rows: the list in shared memory as composites
//                       c = key << 32 | (2^32 - 1 - position), unique and larger = better,
//                       so ties need no special case. MSB-first radix select from the known
//                       11 (or 22) bits in 11-bit digits, stopping when the chosen bucket
//                       holds exactly the entries still needed; the winners, c >= the
//                       threshold, are exactly topk, sorted by position (cub block radix
//                       sort over the position bits max_context needs);
//                     full rows: the last 10 bits of the threshold key K from one pass over
//                       the row, then a pass in position order takes the keys > K and the
//                       first `need` keys == K (block scans), so the output needs no sort.
// Every block of a row derives the same T, A, C (and T2, A2, C2) from the same exact
// histograms; the list's order depends on atomics, the selected set and its sorted output
// do not, so the result is deterministic and equal to cpu::dsa_topk for NaN-free rows.
//
// Chunks are cut on the 16-byte aligned view of a row: position s sits at slot s + head,
// head = the row's misalignment in floats (score_stride may be anything), so each thread
// loads whole float4s (4 per tile, 64 bytes in flight) and scalars only at a row's ends.
//
// Workspace (256-byte aligned parts; all sizes from B, n_q and max_context):
//   hist0 [rows, 2048] int (when the indexer gave none) | fill [rows] int: list entries |
//   hist1 [rows, 2048] int       <- these zeroed by one memset per call
//   state [rows] int4 (T, A, C, refine?) | state2 [rows] int4 (T2, A2, C2, full?) |
//   list [rows, list_cap] uint64 composites   <- written before they are read in each call
#include <cuda_runtime.h>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <bit>

#include "kernels/dsa/cuda.h"
#include "kernels/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kBins = kDsaTopkBins;
constexpr int kBinShift = kDsaTopkBinShift;
constexpr int kStreamThreads = 256;  // hist, collect, refine
constexpr int kStreamWarps = kStreamThreads / 32;
constexpr int kSelectThreads = 512;  // one block per row (128 registers for the sort)
constexpr int kStreamVecs = 4;       // float4 loads per thread and tile: 64 bytes in flight
constexpr int kKeysPerThread = 4 * kStreamVecs;  // bit k of a tile's masks = key k
constexpr int64_t kStreamTile = int64_t{kStreamThreads} * kKeysPerThread;
constexpr int64_t kBlocksPerSm = 4;  // streaming blocks to aim for, even at one row
constexpr int64_t kMaxTopk = 8192;   // the winners' sort holds at most 16 per thread
constexpr int64_t kListCap = 20480;  // list entries per row (8 bytes each, in select's smem)
constexpr int kOrderedItems = 8;     // full rows: positions per thread and ordered step
static_assert(kMaxTopk == kDsaMaxTopk, "the models' bound (params.h) is this kernel's");
constexpr unsigned kFullMask = 0xffffffffu;

// The winners' sort: kItems positions per thread, 4 (topk <= 2048) or 16 (topk <= 8192).
template <int kItems>
using Sort = cub::BlockRadixSort<uint32_t, kSelectThreads, kItems>;

struct TopkArgs {
  DsaTopkParams p;
  int64_t chunk_len;   // aligned slots per chunk, a multiple of kStreamTile
  int64_t num_chunks;  // per row
  int list_cap;        // entries per row's list
  int position_bits;   // bit_width(max_context): the sort's key width
  const int* hist0;    // [rows, kBins]: p.histogram, or hist0_out
  int* hist0_out;      // [rows, kBins]: hist_kernel's output
  int* fill;           // [rows]
  int* hist1;          // [rows, kBins]
  int4* state;         // [rows] T, A, C, 1 when the row needs refine_kernel
  int4* state2;        // [rows] T2, A2, C2, 1 when the row is full
  uint64_t* list;      // [rows, list_cap]
};

struct Row {
  int64_t index, b, n;
  const float* scores;
};

__device__ __forceinline__ Row make_row(const TopkArgs& a, int64_t row) {
  const DsaBatch& batch = a.p.batch;
  Row r;
  r.index = row;
  r.b = row / batch.num_q;
  const int64_t len = min(int64_t{batch.seq_lens[r.b]}, batch.max_context);
  r.n = max(len - batch.num_q + row % batch.num_q + 1, int64_t{0});
  r.scores = a.p.scores + row * a.p.score_stride;
  return r;
}

// The row's misalignment in floats: position s is slot s + head of the aligned view.
__device__ __forceinline__ int row_head(const float* scores) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(scores) >> 2) & 3);
}

__device__ __forceinline__ uint64_t composite(uint32_t key, int64_t position) {
  return (uint64_t{key} << 32) | (0xffffffffu - static_cast<uint32_t>(position));
}

__device__ __forceinline__ uint32_t composite_position(uint64_t c) {
  return 0xffffffffu - static_cast<uint32_t>(c);
}

// Calls visit(keys, valid, first) for each tile of kBlock * 4 kVecs aligned slots in
// [slot_begin, slot_end) (slot_begin a multiple of the tile). Key k = 4 u + e of thread t
// is position first + 4 u kBlock + e (first = tile + 4 t - head); bit k of valid says it
// is visible (< n; invalid keys read 0). Every thread calls visit equally often, so visit
// may use warp- and block-wide primitives.
template <int kBlock, int kVecs, class Visit>
__device__ __forceinline__ void for_each_tile(const Row& r, int64_t slot_begin, int64_t slot_end,
                                              Visit&& visit) {
  constexpr int kKeys = 4 * kVecs;
  constexpr int64_t kTile = int64_t{kBlock} * kKeys;
  const int head = row_head(r.scores);
  const auto* aligned =
      reinterpret_cast<const float4*>(reinterpret_cast<uintptr_t>(r.scores) & ~uintptr_t{15});
  for (int64_t tile = slot_begin; tile < slot_end; tile += kTile) {
    const int64_t first = tile + 4 * int64_t{threadIdx.x} - head;
    uint32_t keys[kKeys];
    uint32_t valid = 0;
    if (tile >= head && tile + kTile - head <= r.n) {  // every slot of the tile is visible
      float4 v[kVecs];
#pragma unroll
      for (int u = 0; u < kVecs; ++u) v[u] = __ldg(aligned + tile / 4 + u * kBlock + threadIdx.x);
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        keys[4 * u] = dsa_order_key(v[u].x);
        keys[4 * u + 1] = dsa_order_key(v[u].y);
        keys[4 * u + 2] = dsa_order_key(v[u].z);
        keys[4 * u + 3] = dsa_order_key(v[u].w);
      }
      valid = (1u << kKeys) - 1u;
    } else {
#pragma unroll
      for (int k = 0; k < kKeys; ++k) {
        const int64_t s = first + int64_t{k / 4} * 4 * kBlock + k % 4;
        const bool ok = s >= 0 && s < r.n;
        keys[k] = ok ? dsa_order_key(__ldg(r.scores + s)) : 0u;
        valid |= static_cast<uint32_t>(ok) << k;
      }
    }
    visit(keys, valid, first);
  }
}

// Shared-memory histogram add. A plain atomic per key: with scores spread over a few
// dozen bins the conflicts are short, and a warp-aggregated add (__match_any_sync for
// every key) made a 1M-score pass ~4x slower.
__device__ __forceinline__ void hist_add(int* h, uint32_t bin, bool active) {
  if (active) atomicAdd(&h[bin], 1);
}

struct Found {
  int bin;    // the bin holding the need-th largest key
  int above;  // keys in higher bins (< need)
  int count;  // keys in the bin (>= need - above)
};

template <int kBlock>
struct ScanShared {
  typename cub::BlockScan<int, kBlock>::TempStorage scan;
  Found found;
};

// Scans a histogram of num_bins <= kBins bins from the top for the bin holding the need-th
// largest key. {0, 0, 0} when the histogram holds fewer than need keys (only when the
// caller's histogram does not match the scores). Block-wide; load(bin) reads a count.
template <int kBlock, class Load>
__device__ Found find_bin(ScanShared<kBlock>& sh, int num_bins, int need, Load&& load) {
  constexpr int kPer = kBins / kBlock;
  int local[kPer];
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int bin = num_bins - 1 - (static_cast<int>(threadIdx.x) * kPer + k);
    local[k] = bin >= 0 ? load(bin) : 0;
    sum += local[k];
  }
  int above = 0, total = 0;
  cub::BlockScan<int, kBlock>(sh.scan).ExclusiveSum(sum, above, total);
  if (above < need && above + sum >= need) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (above < need && above + local[k] >= need) {
        sh.found =
            Found{num_bins - 1 - (static_cast<int>(threadIdx.x) * kPer + k), above, local[k]};
      }
      above += local[k];
    }
  }
  __syncthreads();
  const Found f = need > 0 && total >= need ? sh.found : Found{0, 0, 0};
  __syncthreads();
  return f;
}

struct StreamShared {
  ScanShared<kStreamThreads> scan;
  int hist[kBins];
  int warp_offset[kStreamWarps];
  int block_base;
};

__device__ __forceinline__ void zero_hist(int* hist, int num_bins, int block) {
  for (int k = threadIdx.x; k < num_bins; k += block) hist[k] = 0;
}

// Adds the shared histogram to the global one (nonzero bins only).
__device__ __forceinline__ void flush_hist(const int* hist, int* global) {
  for (int k = threadIdx.x; k < kBins; k += kStreamThreads) {
    if (hist[k] != 0) atomicAdd(&global[k], hist[k]);
  }
}

// Appends this thread's keys flagged in take (bits as in for_each_tile) to the row's list,
// one global atomic per block and tile. Block-wide.
__device__ __forceinline__ void append_tile(const TopkArgs& a, int64_t row, StreamShared& sh,
                                            uint32_t take, const uint32_t (&keys)[kKeysPerThread],
                                            int64_t first) {
  if (__syncthreads_or(take != 0u) == 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mine = __popc(take);
  int incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int v = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) sh.warp_offset[warp] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < kStreamWarps; ++w) {
      const int c = sh.warp_offset[w];
      sh.warp_offset[w] = total;
      total += c;
    }
    sh.block_base = atomicAdd(a.fill + row, total);
  }
  __syncthreads();
  int idx = sh.block_base + sh.warp_offset[warp] + incl - mine;
#pragma unroll
  for (int k = 0; k < kKeysPerThread; ++k) {
    if ((take >> k) & 1u) {
      if (idx < a.list_cap) {
        a.list[row * a.list_cap + idx] =
            composite(keys[k], first + int64_t{k / 4} * 4 * kStreamThreads + k % 4);
      }
      ++idx;
    }
  }
}

// A streaming block's row and aligned slot range [begin, end); empty when the row needs no
// select (n <= topk) or the chunk lies past the row's end.
struct Chunk {
  Row row;
  int64_t index, begin, end;
};

__device__ __forceinline__ Chunk make_chunk(const TopkArgs& a) {
  Chunk c;
  const int64_t block = blockIdx.x;
  c.row = make_row(a, block / a.num_chunks);
  c.index = block % a.num_chunks;
  c.begin = c.index * a.chunk_len;
  c.end = min(c.begin + a.chunk_len, c.row.n + row_head(c.row.scores));
  if (c.row.n <= a.p.topk) c.end = c.begin;
  return c;
}

__global__ void __launch_bounds__(kStreamThreads, kBlocksPerSm) hist_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
  const Chunk c = make_chunk(a);
  if (c.begin >= c.end) return;
  zero_hist(sh.hist, kBins, kStreamThreads);
  __syncthreads();
  int* hist = sh.hist;
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end, [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t) {
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          hist_add(hist, keys[k] >> kBinShift, (valid >> k) & 1u);
        }
      });
  __syncthreads();
  flush_hist(sh.hist, a.hist0_out + c.row.index * kBins);
}

__global__ void __launch_bounds__(kStreamThreads, kBlocksPerSm) collect_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
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
  int* hist = sh.hist;
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end,
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t first) {
        uint32_t take = 0, in_bin = 0;
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          const uint32_t bin = keys[k] >> kBinShift;
          const bool ok = (valid >> k) & 1u;
          take |= static_cast<uint32_t>(ok && (bin > t_bin || (!refine && bin == t_bin))) << k;
          in_bin |= static_cast<uint32_t>(ok && refine && bin == t_bin) << k;
        }
        append_tile(a, row, sh, take, keys, first);
        if (__any_sync(kFullMask, in_bin != 0u)) {
#pragma unroll
          for (int k = 0; k < kKeysPerThread; ++k) {
            hist_add(hist, (keys[k] >> 10) & (kBins - 1), (in_bin >> k) & 1u);
          }
        }
      });
  if (!refine) return;
  __syncthreads();
  flush_hist(sh.hist, a.hist1 + row * kBins);
}

__global__ void __launch_bounds__(kStreamThreads, kBlocksPerSm) refine_kernel(TopkArgs a) {
  __shared__ StreamShared sh;
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
  const uint32_t t_bin = static_cast<uint32_t>(st.x);
  const uint32_t prefix = (t_bin << 11) | static_cast<uint32_t>(f.bin);  // 22 bits
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end,
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t first) {
        uint32_t take = 0;
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          const bool ok = (valid >> k) & 1u;
          take |= static_cast<uint32_t>(ok && (keys[k] >> kBinShift) == t_bin &&
                                        (keys[k] >> 10) >= prefix)
                  << k;
        }
        append_tile(a, row, sh, take, keys, first);
      });
}

// select_kernel's dynamic shared memory: [the row's list | the sort's scratch] [winners:
// kItems * kSelectThreads positions] [hist: kBins counts].
struct SelectLayout {
  size_t winners, hist, total;
};

template <int kItems>
__host__ __device__ inline SelectLayout select_layout(int list_cap) {
  SelectLayout l{};
  const size_t list_bytes = sizeof(uint64_t) * static_cast<size_t>(list_cap);
  const size_t sort_bytes = sizeof(typename Sort<kItems>::TempStorage);
  l.winners = ((list_bytes > sort_bytes ? list_bytes : sort_bytes) + 15) / 16 * 16;
  l.hist = l.winners + sizeof(uint32_t) * kSelectThreads * kItems;
  l.total = l.hist + sizeof(int) * kBins;
  return l;
}

struct SelectShared {
  ScanShared<kSelectThreads> scan;
  int num_winners;
};

// Writes entry j of row r's output: position pos and its slot, or -1 for both (pos < 0).
__device__ __forceinline__ void put(const TopkArgs& a, const Row& r, int64_t j, int64_t pos) {
  const DsaTopkParams& p = a.p;
  const int64_t out = r.index * p.topk + j;
  int32_t slot = -1;
  if (pos >= 0) {
    const int64_t block = p.batch.block_tables[r.b * p.batch.max_blocks + pos / p.block_size];
    slot = static_cast<int32_t>(block * p.block_size + pos % p.block_size);
  }
  p.slots[out] = slot;
  if (p.positions != nullptr) p.positions[out] = static_cast<int32_t>(pos);
}

// Sorts the winners' positions ascending and writes them (padding -1 past num_winners,
// which is topk unless the caller's histogram does not match the scores).
template <int kItems>
__device__ void sort_and_put(const TopkArgs& a, const Row& r, uint8_t* scratch,
                             const uint32_t* winners, int num_winners) {
  uint32_t keys[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int k = static_cast<int>(threadIdx.x) * kItems + i;
    keys[i] = k < num_winners ? winners[k] : 0xffffffffu;  // sorts last: above every position
  }
  using BlockSort = Sort<kItems>;
  BlockSort(*reinterpret_cast<typename BlockSort::TempStorage*>(scratch))
      .Sort(keys, 0, a.position_bits);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int rank = static_cast<int>(threadIdx.x) * kItems + i;
    if (rank < a.p.topk) put(a, r, rank, keys[i] < r.n ? int64_t{keys[i]} : int64_t{-1});
  }
}

// List rows: the winners among the row's list, whose entries agree with prefix above bit
// `low` or exceed it there; `need` of those agreeing are winners.
template <int kItems>
__device__ void select_list(const TopkArgs& a, const Row& r, SelectShared& sh, uint8_t* smem,
                            uint64_t prefix, int low, int need) {
  const SelectLayout layout = select_layout<kItems>(a.list_cap);
  auto* list = reinterpret_cast<uint64_t*>(smem);
  auto* winners = reinterpret_cast<uint32_t*>(smem + layout.winners);
  auto* hist = reinterpret_cast<int*>(smem + layout.hist);
  const int topk = static_cast<int>(a.p.topk);
  const int num = min(a.fill[r.index], a.list_cap);
  const int num_padded = (num + kSelectThreads - 1) / kSelectThreads * kSelectThreads;
  // The list (written by other kernels, so read through L2) with every copy in flight at
  // once: 16-byte cp.async of two entries each (a row's list is 256-byte aligned).
  const uint64_t* src = a.list + r.index * a.list_cap;
  for (int j = 2 * static_cast<int>(threadIdx.x); j < num; j += 2 * kSelectThreads) {
    dsa::cp_async_16(list + j, src + j, 16);
  }
  dsa::cp_async_commit();
  if (threadIdx.x == 0) sh.num_winners = 0;
  dsa::cp_async_wait<0>();
  __syncthreads();

  // Radix select in digits of up to 11 bits below the known prefix.
  while (low > 0) {
    const int width = min(11, low);
    const int shift = low - width;
    const int num_bins = 1 << width;
    zero_hist(hist, num_bins, kSelectThreads);
    __syncthreads();
    for (int j = threadIdx.x; j < num_padded; j += kSelectThreads) {
      const uint64_t c = j < num ? list[j] : 0;
      const bool active = j < num && (c >> low) == (prefix >> low);
      hist_add(hist, static_cast<uint32_t>(c >> shift) & static_cast<uint32_t>(num_bins - 1),
               active);
    }
    __syncthreads();
    const Found f =
        find_bin<kSelectThreads>(sh.scan, num_bins, need, [&](int bin) { return hist[bin]; });
    prefix |= static_cast<uint64_t>(f.bin) << shift;
    need -= f.above;
    low = shift;
    if (f.count == need) break;  // every entry of the bucket is a winner
  }

  // Winners: c >= prefix on the bits above low (exactly topk entries).
  const uint64_t threshold = prefix >> low;
  const int lane = threadIdx.x & 31;
  for (int j = threadIdx.x; j < num_padded; j += kSelectThreads) {
    const uint64_t c = j < num ? list[j] : 0;
    const bool take = j < num && (c >> low) >= threshold;
    const unsigned mask = __ballot_sync(kFullMask, take);
    int base = 0;
    if (lane == 0 && mask != 0u) base = atomicAdd(&sh.num_winners, __popc(mask));
    base = __shfl_sync(kFullMask, base, 0);
    if (take) {
      const int idx = base + __popc(mask & ((1u << lane) - 1u));
      if (idx < topk) winners[idx] = composite_position(c);
    }
  }
  __syncthreads();  // the list is not read after this point: the sort's scratch overlays it
  const int num_winners = min(sh.num_winners, topk);
  sort_and_put<kItems>(a, r, smem, winners, num_winners);
}

// Full rows (massive ties): the threshold key K below the known 22-bit prefix from one pass
// over the row, then the winners in position order: keys > K and the first need_eq == K.
__device__ void select_full(const TopkArgs& a, const Row& r, SelectShared& sh, int* hist,
                            uint32_t prefix, int need) {
  const int topk = static_cast<int>(a.p.topk);
  zero_hist(hist, 1024, kSelectThreads);
  __syncthreads();
  for_each_tile<kSelectThreads, kStreamVecs>(
      r, 0, r.n + row_head(r.scores),
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t) {
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          const bool ok = (valid >> k) & 1u;
          hist_add(hist, keys[k] & 1023u, ok && (keys[k] >> 10) == prefix);
        }
      });
  __syncthreads();
  const Found f = find_bin<kSelectThreads>(sh.scan, 1024, need, [&](int bin) { return hist[bin]; });
  const uint32_t threshold = (prefix << 10) | static_cast<uint32_t>(f.bin);
  const int need_eq = need - f.above;

  using BlockScan = cub::BlockScan<int, kSelectThreads>;
  int taken = 0, eq_seen = 0;  // block-uniform: winners and == K keys before the step
  for (int64_t base = 0; base < r.n && taken < topk;
       base += int64_t{kSelectThreads} * kOrderedItems) {
    const int64_t first = base + int64_t{threadIdx.x} * kOrderedItems;
    uint32_t keys[kOrderedItems];
    int gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kOrderedItems; ++j) {
      const bool ok = first + j < r.n;
      keys[j] = ok ? dsa_order_key(__ldg(r.scores + first + j)) : 0u;
      gt += ok && keys[j] > threshold;
      eq += ok && keys[j] == threshold;
    }
    if (__syncthreads_or(gt + eq > 0) == 0) continue;
    int eq_before = 0, eq_total = 0;
    BlockScan(sh.scan.scan).ExclusiveSum(eq, eq_before, eq_total);
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
    BlockScan(sh.scan.scan).ExclusiveSum(__popc(take), out, taken_total);
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

// kItems: the sort's positions per thread, kItems * kSelectThreads >= topk.
template <int kItems>
__global__ void __launch_bounds__(kSelectThreads, 1) select_kernel(TopkArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ SelectShared sh;
  const DsaTopkParams& p = a.p;
  const Row r = make_row(a, blockIdx.x);
  if (r.n <= p.topk) {
    for (int64_t j = threadIdx.x; j < p.topk; j += kSelectThreads) put(a, r, j, j < r.n ? j : -1);
    return;
  }
  const int topk = static_cast<int>(p.topk);
  const int4 st = a.state[r.index];
  if (st.w == 0) {  // the list holds bin T and above
    select_list<kItems>(a, r, sh, smem, static_cast<uint64_t>(st.x) << 53, 53, topk - st.y);
    return;
  }
  const int4 st2 = a.state2[r.index];
  const uint32_t prefix = (static_cast<uint32_t>(st.x) << 11) | static_cast<uint32_t>(st2.x);
  const int need = topk - st.y - st2.y;
  if (st2.w == 0) {  // the list holds the 22-bit bucket (T, T2) and above
    select_list<kItems>(a, r, sh, smem, static_cast<uint64_t>(prefix) << 42, 42, need);
  } else {
    const SelectLayout layout = select_layout<kItems>(a.list_cap);
    select_full(a, r, sh, reinterpret_cast<int*>(smem + layout.hist), prefix, need);
  }
}

struct Plan {
  int64_t rows, chunk_len, num_chunks;
  int list_cap, position_bits;
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
  // Even, so that every row's list is 16-byte aligned for select's copies.
  plan.list_cap = static_cast<int>((std::min(kListCap, ctx) + 1) / 2 * 2);
  plan.position_bits = static_cast<int>(std::bit_width(static_cast<uint64_t>(ctx)));
  return plan;
}

struct Layout {
  size_t hist0, fill, hist1, state, state2, list, total;
};

Layout make_layout(int64_t rows, int64_t list_cap) {
  Layout l{};
  const size_t hist_bytes = dsa::align_up(sizeof(int) * rows * kBins);
  l.hist0 = 0;
  l.fill = l.hist0 + hist_bytes;
  l.hist1 = l.fill + dsa::align_up(sizeof(int) * rows);
  l.state = l.hist1 + hist_bytes;
  l.state2 = l.state + dsa::align_up(sizeof(int4) * rows);
  l.list = l.state2 + dsa::align_up(sizeof(int4) * rows);
  l.total = l.list + dsa::align_up(sizeof(uint64_t) * rows * list_cap);
  return l;
}

void check_params(const DsaTopkParams& p, bool need_pointers = true) {
  dsa::check_batch(p.batch, need_pointers);
  CHECK(p.topk > 0 && p.topk <= kMaxTopk, "dsa_topk supports topk in 1..", kMaxTopk,
        " (the winners are sorted in shared memory), got ", p.topk);
  CHECK(p.score_stride >= p.batch.max_context, "score_stride ", p.score_stride, " < max_context ",
        p.batch.max_context);
  CHECK(p.block_size > 0 && (p.block_size & (p.block_size - 1)) == 0, "block_size ", p.block_size);
}

}  // namespace

size_t dsa_topk_workspace_bytes(const DsaTopkParams& p) {
  check_params(p, /*need_pointers=*/false);
  const Plan plan = make_plan(p, 1);
  return make_layout(plan.rows, plan.list_cap).total;
}

void dsa_topk(const DsaTopkParams& p, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  check_params(p);
  if (p.batch.num_requests == 0) return;
  CHECK(p.scores != nullptr && p.slots != nullptr, "null scores or slots");
  CHECK(reinterpret_cast<uintptr_t>(p.scores) % sizeof(float) == 0,
        "dsa_topk scores must be 4-byte aligned");
  int device = 0, num_sms = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const Plan plan = make_plan(p, num_sms);
  const Layout layout = make_layout(plan.rows, plan.list_cap);
  CHECK(workspace != nullptr && workspace_bytes >= layout.total, "dsa_topk workspace of ",
        workspace_bytes, " bytes, need ", layout.total);
  CHECK(reinterpret_cast<uintptr_t>(workspace) % dsa::kAlign == 0,
        "dsa_topk workspace must be 256-byte aligned");
  const int64_t stream_blocks = plan.rows * plan.num_chunks;
  CHECK(stream_blocks < (int64_t{1} << 31), "dsa_topk: ", plan.rows, " rows x ", plan.num_chunks,
        " chunks");
  const bool many = p.topk > 4 * kSelectThreads;
  const SelectLayout select =
      many ? select_layout<16>(plan.list_cap) : select_layout<4>(plan.list_cap);
  CHECK(select.total + sizeof(SelectShared) <= static_cast<size_t>(max_smem),
        "dsa_topk select needs ", select.total + sizeof(SelectShared),
        " bytes of shared memory, the device has ", max_smem);
  auto* base = static_cast<char*>(workspace);
  auto* hist0 = reinterpret_cast<int*>(base + layout.hist0);
  const TopkArgs a{.p = p,
                   .chunk_len = plan.chunk_len,
                   .num_chunks = plan.num_chunks,
                   .list_cap = plan.list_cap,
                   .position_bits = plan.position_bits,
                   .hist0 = p.histogram != nullptr ? p.histogram : hist0,
                   .hist0_out = hist0,
                   .fill = reinterpret_cast<int*>(base + layout.fill),
                   .hist1 = reinterpret_cast<int*>(base + layout.hist1),
                   .state = reinterpret_cast<int4*>(base + layout.state),
                   .state2 = reinterpret_cast<int4*>(base + layout.state2),
                   .list = reinterpret_cast<uint64_t*>(base + layout.list)};
  // hist0 (when computed here), fill and hist1 start at zero.
  const size_t zero_from = p.histogram != nullptr ? layout.fill : layout.hist0;
  CUDA_CHECK(cudaMemsetAsync(base + zero_from, 0,
                             layout.hist1 + sizeof(int) * plan.rows * kBins - zero_from, stream));
  const auto grid = static_cast<unsigned>(stream_blocks);
  if (p.histogram == nullptr) {
    hist_kernel<<<grid, kStreamThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  collect_kernel<<<grid, kStreamThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
  refine_kernel<<<grid, kStreamThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
  auto* select_fn = many ? select_kernel<16> : select_kernel<4>;
  CUDA_CHECK(cudaFuncSetAttribute(select_fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(select.total)));
  select_fn<<<static_cast<unsigned>(plan.rows), kSelectThreads, select.total, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
