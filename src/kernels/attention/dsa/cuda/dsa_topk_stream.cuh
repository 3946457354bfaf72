// The top-k's streaming machinery (dsa_topk.cu holds the algorithm, its kernels and the
// launcher): the tuning constants, the kernels' arguments, a row's and a chunk's geometry,
// the composite (key, position) entries, the aligned float4 tile walk, shared and global
// histograms, the bin scan, and the appends of a tile's taken keys to the row's list as one
// run. Included by dsa_topk.cu only.
#pragma once

#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"

namespace hyserve::cuda::topk_stream {

constexpr int kBins = kDsaTopkBins;
constexpr int kBinShift = kDsaTopkBinShift;
constexpr int kStreamThreads = 256;  // hist, collect, refine
constexpr int kStreamWarps = kStreamThreads / 32;
constexpr int kSelectThreads = 512;  // one block per row
constexpr int kStreamVecs = 4;       // float4 loads per thread and tile: 64 bytes in flight
constexpr int kKeysPerThread = 4 * kStreamVecs;  // bit k of a tile's masks = key k
constexpr int64_t kStreamTile = int64_t{kStreamThreads} * kKeysPerThread;
static_assert(kStreamWarps * kStreamVecs == 32, "append_tile scans a tile's vectors in a warp");
// Streaming blocks to aim for, even at one row: 2 waves of kStreamResident (measured
// against 1 and 4 waves: B = 64 x 1M 296 -> 245 us, 2026-11-30, H200).
constexpr int64_t kBlocksPerSm = 8;
constexpr int kStreamResident = 4;  // streaming blocks per SM the registers must allow
// The list must leave room beside the winners for the rest of the threshold's bucket: at
// topk 8192, 12288 more keys before a row falls back to the slow full-row select.
constexpr int64_t kMaxTopk = 8192;
constexpr int64_t kListCap = 20480;  // list entries per row (8 bytes each, in select's smem)
constexpr int kOrderedItems = 8;     // full rows: positions per thread and ordered step
constexpr int kRunItems = 4;         // select: tiles per thread and step of the runs' scan
constexpr int kLoadItems = 8;        // select: list entries per thread in flight
constexpr int kPutItems = 8;         // select: winners per thread whose slots load at once
static_assert(kMaxTopk == kDsaMaxTopk, "the models' bound (params.h) is this kernel's");
constexpr unsigned kFullMask = 0xffffffffu;

struct TopkArgs {
  DsaTopkParams p;
  int64_t chunk_len;   // aligned slots per chunk, a multiple of kStreamTile
  int64_t num_chunks;  // per row
  int list_cap;        // entries per row's list
  int num_tiles;       // tiles per row in run_count and run_base
  const int* hist0;    // [rows, kBins]: p.histogram, or hist0_out
  int* hist0_out;      // [rows, kBins]: hist_kernel's output
  int* fill;           // [rows]
  int* hist1;          // [rows, kBins]
  int4* state;         // [rows] T, A, C, 1 when the row needs refine_kernel
  int4* state2;        // [rows] T2, A2, C2, 1 when the row is full
  int* run_count;      // [rows, num_tiles] entries of a tile's run, 0 when none
  int* run_base;       // [rows, num_tiles] a run's first index in the row's list
  uint64_t* list;      // [rows, list_cap]
  bool keep_scores;    // the first pass's loads evict-last (dsa::keep_scores_in_l2)
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

__device__ __forceinline__ uint32_t composite_key(uint64_t c) {
  return static_cast<uint32_t>(c >> 32);
}

// Calls visit(keys, valid, first) for each tile of kBlock * 4 kVecs aligned slots in
// [slot_begin, slot_end) (slot_begin a multiple of the tile). Key k = 4 u + e of thread t
// is position first + 4 u kBlock + e (first = tile + 4 t - head); bit k of valid says it
// is visible (< n; invalid keys read 0). Every thread calls visit equally often, so visit
// may use warp- and block-wide primitives. policy: the L2 eviction priority of the loads
// (dsa_common.cuh): evict-last where a later kernel reads the scores again.
template <int kBlock, int kVecs, class Visit>
__device__ __forceinline__ void for_each_tile(const Row& r, int64_t slot_begin, int64_t slot_end,
                                              uint64_t policy, Visit&& visit) {
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
      for (int u = 0; u < kVecs; ++u) {
        v[u] = dsa::load_f4(aligned + tile / 4 + u * kBlock + threadIdx.x, policy);
      }
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        keys[4 * u] = float_order_key(v[u].x);
        keys[4 * u + 1] = float_order_key(v[u].y);
        keys[4 * u + 2] = float_order_key(v[u].z);
        keys[4 * u + 3] = float_order_key(v[u].w);
      }
      valid = (1u << kKeys) - 1u;
    } else {
#pragma unroll
      for (int k = 0; k < kKeys; ++k) {
        const int64_t s = first + int64_t{k / 4} * 4 * kBlock + k % 4;
        const bool ok = s >= 0 && s < r.n;
        keys[k] = ok ? float_order_key(__ldg(r.scores + s)) : 0u;
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
  // append_tile: a warp's keys taken from each vector (8-bit fields), and where in the run
  // those of warp w and vector u start.
  uint32_t warp_count[kStreamWarps];
  int warp_start[kStreamWarps][kStreamVecs];
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

// Appends this thread's keys flagged in take (bits as in for_each_tile) to the row's list
// as the tile's run, in ascending position order, and records the run; one global atomic
// per block and tile. Key k = 4 u + e of thread t is position first + 4 u kStreamThreads +
// e, so position order is (u, t, e), not the threads' order: a key's index is the run's
// base + the keys taken from the vectors below u + those from vector u of the threads
// before t + its rank among this thread's keys of vector u. Block-wide.
__device__ __forceinline__ void append_tile(const TopkArgs& a, const Row& r, StreamShared& sh,
                                            uint32_t take, const uint32_t (&keys)[kKeysPerThread],
                                            int64_t first) {
  if (__syncthreads_or(take != 0u) == 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The keys taken from each vector, one 8-bit field per vector, scanned over the warp at
  // once (a warp's field sums at most 128 keys, so never carries).
  uint32_t mine = 0;
#pragma unroll
  for (int u = 0; u < kStreamVecs; ++u) {
    mine |= static_cast<uint32_t>(__popc((take >> (4 * u)) & 0xfu)) << (8 * u);
  }
  uint32_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t v = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) sh.warp_count[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    // Lane u * kStreamWarps + w counts vector u of warp w: the run's order.
    const int u = lane / kStreamWarps, w = lane % kStreamWarps;
    const int count = static_cast<int>((sh.warp_count[w] >> (8 * u)) & 0xffu);
    int start = count;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int v = __shfl_up_sync(kFullMask, start, off);
      if (lane >= off) start += v;
    }
    sh.warp_start[w][u] = start - count;
    if (lane == 31) {
      sh.block_base = atomicAdd(a.fill + r.index, start);
      // Thread t's first position is the tile's first slot + 4 t - head.
      const int64_t tile = first - 4 * lane + row_head(r.scores);
      const int64_t run = r.index * a.num_tiles + tile / kStreamTile;
      a.run_count[run] = start;
      a.run_base[run] = sh.block_base;
    }
  }
  __syncthreads();
  const uint32_t before = incl - mine;
  uint64_t* list = a.list + r.index * a.list_cap;
#pragma unroll
  for (int u = 0; u < kStreamVecs; ++u) {
    if (((take >> (4 * u)) & 0xfu) == 0u) continue;  // most vectors take nothing
    int idx =
        sh.block_base + sh.warp_start[warp][u] + static_cast<int>((before >> (8 * u)) & 0xffu);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if ((take >> (4 * u + e)) & 1u) {
        if (idx < a.list_cap) {
          list[idx] = composite(keys[4 * u + e], first + int64_t{u} * 4 * kStreamThreads + e);
        }
        ++idx;
      }
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

// Appends every visible key >= threshold of the chunk to the row's list, one run per
// tile (the collect's list rows: threshold T << 21; the refine's: (T, T2) << 10). The
// chunk's last pass over the scores, so its loads are evict-first.
__device__ __forceinline__ void append_at_least(const TopkArgs& a, const Chunk& c, StreamShared& sh,
                                                uint32_t threshold) {
  for_each_tile<kStreamThreads, kStreamVecs>(
      c.row, c.begin, c.end, dsa::l2_evict_first(),
      [&](const uint32_t(&keys)[kKeysPerThread], uint32_t valid, int64_t first) {
        uint32_t take = 0;
#pragma unroll
        for (int k = 0; k < kKeysPerThread; ++k) {
          take |= static_cast<uint32_t>(keys[k] >= threshold) << k;
        }
        append_tile(a, c.row, sh, take & valid, keys, first);
      });
}

}  // namespace hyserve::cuda::topk_stream
