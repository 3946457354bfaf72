// The arguments the MLA decode kernels share (dsa_mla.cu: the mma.sync kernel, the split
// plan and the combine; dsa_mla_wgmma.cu: the warpgroup-MMA kernel for 64-head groups).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/dsa/params.h"

namespace hyserve::cuda::dsa {

constexpr int kMlaTileKeys = 64;  // keys per tile of every MLA kernel (splits are whole tiles)

struct MlaArgs {
  DsaMlaParams p;
  int64_t num_splits;
  int64_t keys_per_split;  // multiple of kMlaTileKeys
  int64_t num_groups;      // head groups of the kernel's rows
  float* part_o;           // [B*n_q, H, splits, 512]
  float2* part_ml;         // [B*n_q, H, splits] (max, sum), base 2
};

// A block's split of one query row (b * n_q + i): its entries [begin, end) of the row's
// slot list (sparse) or of the visible positions (dense), num_tiles tiles of
// kMlaTileKeys; block_size is a power of two (check_cache), so a slot or position splits
// into (block, offset) by bs_shift and bs_mask.
struct MlaSplit {
  bool sparse;
  int64_t begin, end, num_tiles;
  const int32_t* list;   // the row's slot list (sparse), else null
  const int32_t* table;  // the request's block table
  int bs_shift;
  int32_t bs_mask;
};

__device__ __forceinline__ MlaSplit mla_split(const MlaArgs& a, int64_t row, int64_t split) {
  const DsaMlaParams& p = a.p;
  const int64_t b = row / p.batch.num_q;
  const int64_t i = row % p.batch.num_q;
  MlaSplit s;
  s.sparse = p.slots != nullptr;
  int64_t total = p.topk_width;
  if (!s.sparse) {
    const int64_t len = min(int64_t{p.batch.seq_lens[b]}, p.batch.max_context);
    const int64_t n = len - p.batch.num_q + i + 1;
    total = n < 0 ? 0 : n;
  }
  s.begin = a.keys_per_split * split;
  s.end = min(total, s.begin + a.keys_per_split);
  s.num_tiles = s.end > s.begin ? (s.end - s.begin + kMlaTileKeys - 1) / kMlaTileKeys : 0;
  s.list = s.sparse ? p.slots + row * p.topk_width : nullptr;
  s.table = p.batch.block_tables + b * p.batch.max_blocks;
  s.bs_shift = __ffs(p.cache.block_size) - 1;
  s.bs_mask = p.cache.block_size - 1;
  return s;
}

// The ids of tile k's entries for this thread's chunks tid + kThreads j (entry (tid +
// kThreads j) / kChunksPerKey of the tile): slot ids (sparse) or block ids (dense), -1
// past the split's end.
template <int kThreads, int kChunksPerKey, int kChunks>
__device__ __forceinline__ void mla_fetch_ids(const MlaSplit& s, int64_t k,
                                              int32_t (&ids)[kChunks]) {
  const int64_t tile0 = s.begin + k * kMlaTileKeys;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t e = tile0 + (static_cast<int>(threadIdx.x) + kThreads * j) / kChunksPerKey;
    ids[j] = -1;
    if (e < s.end) ids[j] = s.sparse ? s.list[e] : s.table[e >> s.bs_shift];
  }
}

// A query row's power-of-two scale for fp16, from the row's float4s spread over a warp's
// lanes (kVecs each, zero where the row has none): q / scale < 2^14 in every element;
// inv = 1 / scale (exact). Warp-wide.
template <int kVecs>
__device__ __forceinline__ float mla_q_scale(const float4 (&v)[kVecs], float& inv) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    amax = fmaxf(amax,
                 fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
  }
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  int exponent = 0;
  if (amax > 0.0f && isfinite(amax)) frexpf(amax, &exponent);  // amax in [2^(e-1), 2^e)
  inv = ldexpf(1.0f, 14 - exponent);
  return ldexpf(1.0f, exponent - 14);
}

// Four q elements times inv, rounded to fp16, packed in order.
__device__ __forceinline__ uint2 mla_q_f16x4(float4 v, float inv) {
  const __half2 lo = __floats2half2_rn(v.x * inv, v.y * inv);
  const __half2 hi = __floats2half2_rn(v.z * inv, v.w * inv);
  uint2 w;
  w.x = *reinterpret_cast<const uint32_t*>(&lo);
  w.y = *reinterpret_cast<const uint32_t*>(&hi);
  return w;
}

// Heads per block of the warpgroup-MMA kernel (the wgmma's M); a last group of fewer heads
// is padded with zero rows.
constexpr int kMlaWgmmaHeads = 64;
// Shared memory of one block of it (one block per SM).
size_t mla_wgmma_shared_bytes();
// Launches it over grid (head groups, splits, B * n_q), the partials in a.part_o/part_ml.
void launch_mla_wgmma(const MlaArgs& a, dim3 grid, cudaStream_t stream);

}  // namespace hyserve::cuda::dsa
