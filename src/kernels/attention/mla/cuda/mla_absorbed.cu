// CUDA MLA attention, absorbed form with split-KV (cuda.h). Three kernels:
//   absorb_q_kernel         block per (t, h): q_abs = [q_nope W_UK | q_pe] (+ kv_b's LoRA
//                           adapter's s (q_nope B_UK) A, params.h)
//   attend_kernel           block per ((t, h), split): online softmax over a slice of
//                           the query's key slots, kKeyTile keys at a time; a warp per
//                           key for the logits, a thread per latent column for o_lat
//   combine_project_kernel  block per (t, h): merge the splits by their maxima, then
//                           out = W_UV o_lat (a warp per output column; + the adapter's
//                           s B_UV (A o_lat))
//
// Workspace (each part 256-byte aligned):
//   q_abs  [T*H, kv_lora + dr] | part_o [T*H, splits, kv_lora] | part_ml [T*H, splits, 2]
//
// Dense prefill on tensor cores (cuda.h, gemm_prefill): step 2 as two cuBLAS GEMMs per
// (key chunk, row chunk), one split, with the online softmax between them:
//   gather_latent_kernel   key chunk of the (paged) latent -> bf16 [Kc, kv_lora + dr]
//   scores = q_abs(bf16) lat^T                          cuBLAS, fp32 [Rc, Kc]
//   softmax_chunk_kernel   block per row: causal mask, running max / sum (part_ml), P bf16,
//                          the row's o_lat rescaled by exp(old max - new max)
//   o_lat += P lat[:, :kv_lora]                          cuBLAS, fp32 accumulate (part_o)
// then combine_project_kernel as for one split. With MlaAttentionParams::q_pos_first (a
// prefill slice), the keys no query of a row chunk sees are left out of its GEMMs. Its extra
// workspace:
//   q_bf16 [T*H, kv_lora + dr] | lat [Kc, kv_lora + dr] bf16 | scores [Rc, Kc] | P [Rc, Kc] bf16
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/cuda/dtype.cuh"
#include "kernels/attention/mla/check.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/attention/mla/cuda/mla_sparse_wgmma.cuh"
#include "kernels/linear/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kAbsorbThreads = 256;
constexpr int kAttendThreads = 128;
constexpr int kAttendWarps = kAttendThreads / 32;
constexpr int kKeyTile = 64;
constexpr int kCombineThreads = 256;
constexpr int64_t kMinKeysPerSplit = 128;
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kTargetBlocks = 1024;  // enough (t, h, split) blocks to fill an H200
constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

struct Plan {
  int64_t num_rows;        // T * H
  int64_t num_splits;      // splits of each query's key slots
  int64_t keys_per_split;  // slots per split
  size_t q_abs_bytes, part_o_bytes, part_ml_bytes;
  size_t total_bytes() const { return q_abs_bytes + part_o_bytes + part_ml_bytes; }
};

// batch_invariant: one split per query (the plan otherwise follows T and the key count).
Plan make_plan(const MlaAttentionParams& p, bool batch_invariant) {
  Plan plan{};
  plan.num_rows = p.num_tokens * p.num_heads;
  const int64_t num_slots = p.topk != nullptr ? p.topk_width : p.num_keys;
  const int64_t by_keys = (num_slots + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const int64_t by_fill = (kTargetBlocks + plan.num_rows - 1) / std::max<int64_t>(plan.num_rows, 1);
  plan.num_splits =
      batch_invariant ? 1 : std::max<int64_t>(1, std::min({kMaxSplits, by_keys, by_fill}));
  plan.keys_per_split = std::max<int64_t>(1, (num_slots + plan.num_splits - 1) / plan.num_splits);
  // The partials are sized for the most splits any context could use with these rows, so
  // the workspace depends on T and H only: a step at a longer context never needs more.
  const int64_t max_splits = std::max<int64_t>(1, std::min(kMaxSplits, by_fill));
  plan.q_abs_bytes = align_up(sizeof(float) * plan.num_rows * (p.kv_lora + p.dr));
  plan.part_o_bytes = align_up(sizeof(float) * plan.num_rows * max_splits * p.kv_lora);
  plan.part_ml_bytes = align_up(sizeof(float) * plan.num_rows * max_splits * 2);
  return plan;
}

// Element (r, c) of a Weight in fp32, as Weight::dequantize_row decodes it.
__device__ float weight_at(const Weight& w, int64_t r, int64_t c) {
  const auto* bytes = static_cast<const uint8_t*>(w.data);
  switch (w.format) {
    case WeightFormat::kDense: {
      const int64_t i = r * w.cols + c;
      if (w.dtype == DType::kF32) return static_cast<const float*>(w.data)[i];
      const uint16_t bits = static_cast<const uint16_t*>(w.data)[i];
      if (w.dtype == DType::kBF16) return bf16_bits_to_f32(bits);
      return __half2float(__ushort_as_half(bits));
    }
    case WeightFormat::kFp8Block: {
      const int64_t num_col_blocks = (w.cols + Weight::kFp8BlockSize - 1) / Weight::kFp8BlockSize;
      const int64_t si = (r / Weight::kFp8BlockSize) * num_col_blocks + c / Weight::kFp8BlockSize;
      const float scale = w.scales_dtype == DType::kF32
                              ? static_cast<const float*>(w.scales)[si]
                              : bf16_bits_to_f32(static_cast<const uint16_t*>(w.scales)[si]);
      return e4m3_to_f32(bytes[r * w.cols + c]) * scale;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t pair = bytes[r * (w.cols / 2) + c / 2];
      const uint8_t scale = static_cast<const uint8_t*>(
          w.scales)[r * (w.cols / Weight::kMxfp4BlockSize) + c / Weight::kMxfp4BlockSize];
      return e2m1_to_f32((c & 1) ? pair >> 4 : pair & 0xf) * e8m0_to_f32(scale);
    }
    case WeightFormat::kInt4: {
      const uint8_t pair = bytes[r * (w.cols / 2) + c / 2];
      const int q = static_cast<int>((c & 1) ? pair >> 4 : pair & 0xf) - 8;
      const int64_t si = r * (w.cols / Weight::kInt4GroupSize) + c / Weight::kInt4GroupSize;
      const auto* s16 = static_cast<const uint16_t*>(w.scales);
      const float scale = w.scales_dtype == DType::kF32 ? static_cast<const float*>(w.scales)[si]
                          : w.scales_dtype == DType::kBF16
                              ? bf16_bits_to_f32(s16[si])
                              : __half2float(__ushort_as_half(s16[si]));
      return static_cast<float>(q) * scale;
    }
  }
  return 0.0f;
}

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

struct MlaArgs {
  MlaAttentionParams p;
  Weight kv_b;
  int64_t latent_stride;  // elements between latent rows (kv_lora + dr)
  int64_t num_splits;
  int64_t keys_per_split;
  float* q_abs;    // [T*H, kv_lora + dr]
  float* part_o;   // [T*H, splits, kv_lora]
  float* part_ml;  // [T*H, splits, 2] running max, running sum
};

// Query t's adapter on kv_b (params.h lora_slots / kv_b_lora), or null: a slot of -1, out
// of range, without matrices or of a rank over kMaxLoraRank is none. Uniform over a block.
__device__ const LoraMatrices* kv_b_lora(const MlaAttentionParams& p, int64_t t) {
  if (p.lora_slots == nullptr) return nullptr;
  const int32_t slot = p.lora_slots[t];
  if (slot < 0 || slot >= p.kv_b_lora.num_slots) return nullptr;
  const LoraMatrices* m = p.kv_b_lora.slots + slot;
  if (m->a == nullptr || m->b == nullptr || m->rank <= 0 || m->rank > kMaxLoraRank) return nullptr;
  return m;
}

// Shared memory: q_nope [dn] | u [kMaxLoraRank] (kv_b's adapter: u = q_nope B_UK(h)).
__global__ void absorb_q_kernel(MlaArgs a) {
  extern __shared__ float q_nope_s[];
  const MlaAttentionParams& p = a.p;
  const int64_t row = blockIdx.x;
  const int64_t h = row % p.num_heads;
  const int64_t width = p.kv_lora + p.dr;
  const float* q = p.q + row * (p.dn + p.dr);
  for (int64_t d = threadIdx.x; d < p.dn; d += blockDim.x) q_nope_s[d] = q[d];
  __syncthreads();
  const int64_t w_row0 = h * (p.dn + p.dv);
  const LoraMatrices* m = kv_b_lora(p, row / p.num_heads);
  float* u_s = q_nope_s + p.dn;
  int64_t rank = 0;
  if (m != nullptr) {
    rank = m->rank;
    for (int64_t j = threadIdx.x; j < rank; j += blockDim.x) {
      float u = 0.0f;
      for (int64_t d = 0; d < p.dn; ++d) {
        u += q_nope_s[d] * m->b[(p.kv_b_lora_row0 + w_row0 + d) * rank + j];
      }
      u_s[j] = u;
    }
    __syncthreads();
  }
  float* dst = a.q_abs + row * width;
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t d = 0; d < p.dn; ++d) acc += q_nope_s[d] * weight_at(a.kv_b, w_row0 + d, l);
    if (m != nullptr) {
      float lora = 0.0f;
      for (int64_t j = 0; j < rank; ++j) lora += u_s[j] * m->a[j * p.kv_lora + l];
      acc += m->scale * lora;
    }
    dst[l] = acc;
  }
  for (int64_t i = threadIdx.x; i < p.dr; i += blockDim.x) dst[p.kv_lora + i] = q[p.dn + i];
}

// Shared memory: key row pointer [kKeyTile] (null: no key) | q_abs [kv_lora + dr] | o_lat [kv_lora]
// | logit [kKeyTile] | prob [kKeyTile].
// L: the latent's element type (float, or __nv_bfloat16 widened on load).
__device__ __forceinline__ float load_latent(const float* c, int64_t i) {
  return c[i];
}
__device__ __forceinline__ float load_latent(const __nv_bfloat16* c, int64_t i) {
  return __bfloat162float(c[i]);
}

template <typename L>
__global__ void attend_kernel(MlaArgs a, const L* latent) {
  extern __shared__ int64_t smem_i[];
  const MlaAttentionParams& p = a.p;
  const int64_t width = p.kv_lora + p.dr;
  const L** key_s = reinterpret_cast<const L**>(smem_i);
  float* q_s = reinterpret_cast<float*>(key_s + kKeyTile);
  float* o_s = q_s + width;
  float* logit_s = o_s + p.kv_lora;
  float* prob_s = logit_s + kKeyTile;

  const int64_t row = blockIdx.x;
  const int64_t t = row / p.num_heads;
  const int64_t split = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t q_pos = p.q_pos[t];
  const int64_t last_visible = q_pos < p.num_keys ? q_pos : p.num_keys - 1;
  const int64_t num_slots =
      p.topk != nullptr ? p.topk_width : (last_visible < 0 ? 0 : last_visible + 1);
  const int64_t begin = split * a.keys_per_split;
  const int64_t end = begin + a.keys_per_split < num_slots ? begin + a.keys_per_split : num_slots;

  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) q_s[i] = a.q_abs[row * width + i];
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) o_s[l] = 0.0f;
  __syncthreads();

  float run_max = -INFINITY;
  float run_sum = 0.0f;
  for (int64_t tile0 = begin; tile0 < end; tile0 += kKeyTile) {
    const int count = static_cast<int>(end - tile0 < kKeyTile ? end - tile0 : kKeyTile);
    for (int j = warp; j < count; j += kAttendWarps) {
      const int64_t slot = tile0 + j;
      const int64_t s = p.topk != nullptr ? p.topk[t * p.topk_width + slot] : slot;
      const bool valid = s >= 0 && s < p.num_keys && s <= q_pos;
      float dot = 0.0f;
      const L* c = valid
                       ? p.latent_pages.for_query(t, p.table_stride).row(latent, s, a.latent_stride)
                       : nullptr;
      if (valid) {
        for (int64_t i = lane; i < width; i += 32) dot += q_s[i] * load_latent(c, i);
        dot = warp_sum(dot);
      }
      if (lane == 0) {
        logit_s[j] = valid ? dot * p.softmax_scale : -INFINITY;
        key_s[j] = c;
      }
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int j = 0; j < count; ++j) tile_max = fmaxf(tile_max, logit_s[j]);
    const float new_max = fmaxf(run_max, tile_max);
    if (new_max != -INFINITY) {  // uniform: every thread read the same logits
      for (int j = threadIdx.x; j < count; j += blockDim.x) {
        prob_s[j] = expf(logit_s[j] - new_max);
      }
      __syncthreads();
      const float correction = expf(run_max - new_max);
      float tile_sum = 0.0f;
      for (int j = 0; j < count; ++j) tile_sum += prob_s[j];
      run_sum = run_sum * correction + tile_sum;
      run_max = new_max;
      for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
        float acc = o_s[l] * correction;
        for (int j = 0; j < count; ++j) {
          if (key_s[j] != nullptr) acc += prob_s[j] * load_latent(key_s[j], l);
        }
        o_s[l] = acc;
      }
    }
    __syncthreads();
  }

  const int64_t part = row * a.num_splits + split;
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
    a.part_o[part * p.kv_lora + l] = o_s[l];
  }
  if (threadIdx.x == 0) {
    a.part_ml[part * 2] = run_max;
    a.part_ml[part * 2 + 1] = run_sum;
  }
}

// Shared memory: o_lat [kv_lora] | split weight [splits] | v [kMaxLoraRank] (kv_b's
// adapter: v = A o_lat).
__global__ void combine_project_kernel(MlaArgs a) {
  extern __shared__ float smem_f[];
  const MlaAttentionParams& p = a.p;
  float* o_s = smem_f;
  float* weight_s = o_s + p.kv_lora;
  float* v_s = weight_s + a.num_splits;
  const int64_t row = blockIdx.x;
  const int64_t h = row % p.num_heads;
  const float* ml = a.part_ml + row * a.num_splits * 2;
  float* out = p.out + row * p.dv;

  float max_all = -INFINITY;
  for (int64_t i = 0; i < a.num_splits; ++i) max_all = fmaxf(max_all, ml[2 * i]);
  if (max_all == -INFINITY) {
    for (int64_t d = threadIdx.x; d < p.dv; d += blockDim.x) out[d] = 0.0f;
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = -INFINITY;
    return;
  }
  for (int64_t i = threadIdx.x; i < a.num_splits; i += blockDim.x) {
    weight_s[i] = expf(ml[2 * i] - max_all);
  }
  __syncthreads();
  float sum_all = 0.0f;
  for (int64_t i = 0; i < a.num_splits; ++i) sum_all += weight_s[i] * ml[2 * i + 1];
  const float* part_o = a.part_o + row * a.num_splits * p.kv_lora;
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < a.num_splits; ++i) acc += weight_s[i] * part_o[i * p.kv_lora + l];
    o_s[l] = acc / sum_all;
  }
  if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = max_all + logf(sum_all);
  __syncthreads();

  const int64_t w_row0 = h * (p.dn + p.dv) + p.dn;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const LoraMatrices* m = kv_b_lora(p, row / p.num_heads);
  if (m != nullptr) {
    for (int64_t j = threadIdx.x; j < m->rank; j += blockDim.x) {
      const float* a_row = m->a + j * p.kv_lora;
      float v = 0.0f;
      for (int64_t l = 0; l < p.kv_lora; ++l) v += a_row[l] * o_s[l];
      v_s[j] = v;
    }
    __syncthreads();
  }
  for (int64_t d = warp; d < p.dv; d += blockDim.x / 32) {
    float acc = 0.0f;
    for (int64_t l = lane; l < p.kv_lora; l += 32) acc += weight_at(a.kv_b, w_row0 + d, l) * o_s[l];
    acc = warp_sum(acc);
    if (lane == 0) {
      if (m != nullptr) {
        const float* b = m->b + (p.kv_b_lora_row0 + w_row0 + d) * m->rank;
        float lora = 0.0f;
        for (int64_t j = 0; j < m->rank; ++j) lora += b[j] * v_s[j];
        acc += m->scale * lora;
      }
      out[d] = acc;
    }
  }
}

// ---- Dense prefill on tensor cores ----

constexpr int kGemmThreads = 256;

struct GemmPlan {
  size_t q_bf16_bytes, lat_bytes, scores_bytes, probs_bytes;
  size_t total_bytes() const { return q_bf16_bytes + lat_bytes + scores_bytes + probs_bytes; }
};

GemmPlan make_gemm_plan(const MlaAttentionParams& p) {
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t width = p.kv_lora + p.dr;
  const int64_t rc = std::min(rows, kMlaGemmRowChunk);
  GemmPlan g{};
  g.q_bf16_bytes = align_up(sizeof(__nv_bfloat16) * rows * width);
  g.lat_bytes = align_up(sizeof(__nv_bfloat16) * kMlaGemmKeyChunk * width);
  g.scores_bytes = align_up(sizeof(float) * rc * kMlaGemmKeyChunk);
  g.probs_bytes = align_up(sizeof(__nv_bfloat16) * rc * kMlaGemmKeyChunk);
  return g;
}

__global__ void to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16(src[i]);
  }
}

// Block per key of the chunk [k0, k0 + gridDim.x): its latent row as bf16.
template <typename L>
__global__ void gather_latent_kernel(MlaAttentionParams p, const L* latent, int64_t width,
                                     int64_t k0, __nv_bfloat16* __restrict__ dst) {
  const int64_t j = blockIdx.x;
  const L* c = p.latent_pages.row(latent, k0 + j, width);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    dst[j * width + i] = __float2bfloat16(load_latent(c, i));
  }
}

__device__ float block_reduce(float v, float* scratch, bool is_max) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kGemmThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

// Block per row r of the chunk (row0 + r = t * H + h): the chunk's logits of keys
// [k0, k0 + kc) scaled and masked (key <= q_pos[t], < num_keys), the running max m and sum
// l (part_ml, one split) updated, P = exp(logit - m) as bf16 (l sums the rounded values the
// GEMM reads), and the row's o_lat scaled by exp(m_old - m) before the GEMM adds P lat.
__global__ void __launch_bounds__(kGemmThreads)
    softmax_chunk_kernel(MlaArgs a, int64_t row0, int64_t k0, int64_t kc,
                         const float* __restrict__ scores, __nv_bfloat16* __restrict__ probs) {
  __shared__ float scratch[kGemmThreads / 32];
  const MlaAttentionParams& p = a.p;
  const int64_t r = blockIdx.x;
  const int64_t row = row0 + r;
  const int64_t t = row / p.num_heads;
  const int64_t q_pos = p.q_pos[t];
  int64_t visible_end = q_pos + 1 < p.num_keys ? q_pos + 1 : p.num_keys;  // exclusive
  if (visible_end > k0 + kc) visible_end = k0 + kc;
  const int64_t n = visible_end > k0 ? visible_end - k0 : 0;
  const float* srow = scores + r * kc;
  __nv_bfloat16* prow = probs + r * kc;
  float* ml = a.part_ml + row * 2;
  const float m_old = ml[0];
  float local = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) local = fmaxf(local, srow[j]);
  const float chunk_max = block_reduce(local, scratch, true) * p.softmax_scale;
  const float m_new = n > 0 ? fmaxf(m_old, chunk_max) : m_old;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < kc; j += blockDim.x) {
    float e = 0.0f;
    if (j < n) e = expf(srow[j] * p.softmax_scale - m_new);
    const __nv_bfloat16 b = __float2bfloat16(e);
    prow[j] = b;
    sum += __bfloat162float(b);
  }
  sum = block_reduce(sum, scratch, false);
  const float correction = m_old == -INFINITY || m_new == -INFINITY ? 0.0f : expf(m_old - m_new);
  if (m_old != m_new && m_old != -INFINITY) {
    float* o = a.part_o + row * p.kv_lora;
    for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) o[l] *= correction;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ml[0] = m_new;
    ml[1] = (m_old == -INFINITY ? 0.0f : ml[1] * correction) + sum;
  }
}

__global__ void init_ml_kernel(float* ml, int64_t rows) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ml[2 * i] = -INFINITY;
    ml[2 * i + 1] = 0.0f;
  }
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
}

// Step 2 of a dense prefill as GEMMs (see the top of the file); a.num_splits == 1.
void attend_gemm(const MlaArgs& a, const GemmPlan& g, char* gemm_base, const Blas& blas,
                 cudaStream_t stream) {
  const MlaAttentionParams& p = a.p;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t width = p.kv_lora + p.dr;
  auto* q_bf16 = reinterpret_cast<__nv_bfloat16*>(gemm_base);
  auto* lat = reinterpret_cast<__nv_bfloat16*>(gemm_base + g.q_bf16_bytes);
  auto* scores = reinterpret_cast<float*>(gemm_base + g.q_bf16_bytes + g.lat_bytes);
  auto* probs =
      reinterpret_cast<__nv_bfloat16*>(gemm_base + g.q_bf16_bytes + g.lat_bytes + g.scores_bytes);
  to_bf16_kernel<<<grid_for(rows * width), 256, 0, stream>>>(a.q_abs, q_bf16, rows * width);
  CUDA_CHECK_LAUNCH();
  init_ml_kernel<<<grid_for(rows), 256, 0, stream>>>(a.part_ml, rows);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemsetAsync(a.part_o, 0, sizeof(float) * rows * p.kv_lora, stream));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t k0 = 0; k0 < p.num_keys; k0 += kMlaGemmKeyChunk) {
    const int64_t kc_all = std::min(kMlaGemmKeyChunk, p.num_keys - k0);
    if (p.q_pos_first >= 0 && p.q_pos_first + p.num_tokens - 1 < k0) break;  // no query sees it
    if (p.latent_bf16 != nullptr) {
      gather_latent_kernel<<<static_cast<unsigned>(kc_all), 128, 0, stream>>>(
          p, reinterpret_cast<const __nv_bfloat16*>(p.latent_bf16), width, k0, lat);
    } else {
      gather_latent_kernel<<<static_cast<unsigned>(kc_all), 128, 0, stream>>>(p, p.latent, width,
                                                                              k0, lat);
    }
    CUDA_CHECK_LAUNCH();
    for (int64_t r0 = 0; r0 < rows; r0 += kMlaGemmRowChunk) {
      const int64_t rc = std::min(kMlaGemmRowChunk, rows - r0);
      // Keys no query of the row chunk sees (past its last position, q_pos_first's hint) are
      // left out: whole chunks skipped, the last one cut.
      int64_t kc = kc_all;
      if (p.q_pos_first >= 0) {
        const int64_t last_pos = p.q_pos_first + (r0 + rc - 1) / p.num_heads;
        const int64_t visible = std::min(p.num_keys, last_pos + 1);
        if (visible <= k0) continue;
        kc = std::min(kc_all, visible - k0);
      }
      // scores[rc, kc] = q[rc, width] lat[kc, width]^T (row-major).
      CUBLAS_CHECK(cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kc),
                                static_cast<int>(rc), static_cast<int>(width), &one, lat,
                                CUDA_R_16BF, static_cast<int>(width), q_bf16 + r0 * width,
                                CUDA_R_16BF, static_cast<int>(width), &zero, scores, CUDA_R_32F,
                                static_cast<int>(kc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      softmax_chunk_kernel<<<static_cast<unsigned>(rc), kGemmThreads, 0, stream>>>(a, r0, k0, kc,
                                                                                   scores, probs);
      CUDA_CHECK_LAUNCH();
      // o_lat[rc, kv_lora] += P[rc, kc] lat[kc, :kv_lora] (row-major; lat's rows width apart).
      CUBLAS_CHECK(
          cublasGemmEx(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.kv_lora),
                       static_cast<int>(rc), static_cast<int>(kc), &one, lat, CUDA_R_16BF,
                       static_cast<int>(width), probs, CUDA_R_16BF, static_cast<int>(kc), &one,
                       a.part_o + r0 * p.kv_lora, CUDA_R_32F, static_cast<int>(p.kv_lora),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

// Whether a call attends on the sparse warpgroup kernel (cuda.h MlaSparseKernel).
bool uses_sparse_wgmma(const MlaAttentionParams& p, bool batch_invariant, MlaSparseKernel kernel) {
  static const bool env_on = [] {
    const char* env = std::getenv("HYSERVE_MLA_SPARSE_WGMMA");
    return env != nullptr && std::string_view(env) == "1";
  }();
  switch (kernel) {
    case MlaSparseKernel::kFp32:
      return false;
    case MlaSparseKernel::kWgmma:
      CHECK(mla_sparse_wgmma_supports(p),
            "mla_attention: the sparse warpgroup kernel takes top-k calls over the bf16 latent "
            "with kv_lora ",
            kMlaSparseLora, " and dr ", kMlaSparseWidth - kMlaSparseLora, " only");
      return true;
    case MlaSparseKernel::kAuto:
      break;
  }
  const int64_t groups = (p.num_heads + kMlaSparseHeads - 1) / kMlaSparseHeads;
  return env_on && !batch_invariant && mla_sparse_wgmma_supports(p) &&
         p.num_tokens * groups >= kMlaSparseWgmmaMinBlocks;
}

bool uses_gemm(const MlaAttentionParams& p, bool batch_invariant, bool gemm_prefill) {
  return gemm_prefill && !batch_invariant && p.topk == nullptr && p.table_stride == 0 &&
         p.num_tokens >= kMlaGemmMinTokens && p.num_keys > 0;
}

// validate(p), then the CUDA-only limit: one block per (query, head).
void check_params(const MlaAttentionParams& p) {
  validate(p);
  CHECK(p.num_tokens * p.num_heads < (int64_t{1} << 31),
        "mla_attention: T*H = ", p.num_tokens * p.num_heads);
}

}  // namespace

bool mla_sparse_wgmma_supports(const MlaAttentionParams& p) {
  return p.topk != nullptr && p.latent_bf16 != nullptr && p.kv_lora == kMlaSparseLora &&
         p.kv_lora + p.dr == kMlaSparseWidth && p.topk_width > 0 &&
         p.num_tokens * ((p.num_heads + kMlaSparseHeads - 1) / kMlaSparseHeads) <
             (int64_t{1} << 31);
}

size_t mla_attention_workspace_bytes(const MlaAttentionParams& p, bool gemm_prefill) {
  // One split needs less; the GEMM path's buffers when its calls may take it (any context).
  const size_t base = make_plan(p, /*batch_invariant=*/false).total_bytes();
  MlaAttentionParams any = p;
  any.num_keys = 1;
  if (!uses_gemm(any, false, gemm_prefill)) return base;
  return base + std::max(make_gemm_plan(p).total_bytes(), mla_flash_prefill_workspace_bytes(p));
}

size_t mla_attention_call_workspace_bytes(const MlaAttentionParams& p, bool gemm_prefill,
                                          bool batch_invariant) {
  const bool gemm = uses_gemm(p, batch_invariant, gemm_prefill);
  if (gemm && mla_flash_prefill_supports(p)) return mla_flash_prefill_workspace_bytes(p);
  return make_plan(p, batch_invariant).total_bytes() + (gemm ? make_gemm_plan(p).total_bytes() : 0);
}

void mla_attention_absorbed(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, bool batch_invariant, const Blas* blas,
                            MlaSparseKernel sparse) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const bool sparse_wgmma = uses_sparse_wgmma(p, batch_invariant, sparse);
  const bool gemm = uses_gemm(p, batch_invariant, blas != nullptr);
  if (gemm && mla_flash_prefill_supports(p)) {
    // The expanded form on tensor cores, its buffers from the workspace's start.
    mla_flash_prefill(p, workspace, workspace_bytes, *blas, stream);
    return;
  }
  Plan plan = make_plan(p, batch_invariant);
  if (gemm || sparse_wgmma) {
    plan.num_splits = 1;
    plan.keys_per_split = std::max<int64_t>(1, sparse_wgmma ? p.topk_width : p.num_keys);
  }
  const size_t need = plan.total_bytes() + (gemm ? make_gemm_plan(p).total_bytes() : 0);
  CHECK(workspace != nullptr && workspace_bytes >= need, "MLA workspace of ", workspace_bytes,
        " bytes, need ", need);
  CHECK(reinterpret_cast<uintptr_t>(workspace) % kAlign == 0, "MLA workspace must be ", kAlign,
        "-byte aligned");
  auto* base = static_cast<char*>(workspace);
  const MlaArgs a{.p = p,
                  .kv_b = *p.kv_b,
                  .latent_stride = p.kv_lora + p.dr,
                  .num_splits = plan.num_splits,
                  .keys_per_split = plan.keys_per_split,
                  .q_abs = reinterpret_cast<float*>(base),
                  .part_o = reinterpret_cast<float*>(base + plan.q_abs_bytes),
                  .part_ml = reinterpret_cast<float*>(base + plan.q_abs_bytes + plan.part_o_bytes)};
  const auto rows = static_cast<unsigned>(plan.num_rows);

  absorb_q_kernel<<<rows, kAbsorbThreads, sizeof(float) * (p.dn + kMaxLoraRank), stream>>>(a);
  CUDA_CHECK_LAUNCH();
  if (sparse_wgmma) {
    const MlaSparseWgmmaArgs sa{.q_abs = a.q_abs,
                                .latent = reinterpret_cast<const __nv_bfloat16*>(p.latent_bf16),
                                .pages = p.latent_pages,
                                .table_stride = p.table_stride,
                                .topk = p.topk,
                                .topk_width = p.topk_width,
                                .q_pos = p.q_pos,
                                .num_tokens = p.num_tokens,
                                .num_keys = p.num_keys,
                                .num_heads = p.num_heads,
                                .scale_log2 = p.softmax_scale * 1.4426950408889634f,
                                .part_o = a.part_o,
                                .part_ml = a.part_ml};
    launch_mla_sparse_wgmma(sa, stream);
    combine_project_kernel<<<rows, kCombineThreads, sizeof(float) * (p.kv_lora + 1 + kMaxLoraRank),
                             stream>>>(a);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (gemm) {
    CHECK(blas->stream() == stream, "MLA: the cuBLAS handle runs on another stream");
    attend_gemm(a, make_gemm_plan(p), base + plan.total_bytes(), *blas, stream);
    combine_project_kernel<<<rows, kCombineThreads, sizeof(float) * (p.kv_lora + 1 + kMaxLoraRank),
                             stream>>>(a);
    CUDA_CHECK_LAUNCH();
    return;
  }

  const size_t attend_smem =
      sizeof(const float*) * kKeyTile + sizeof(float) * (2 * p.kv_lora + p.dr + 2 * kKeyTile);
  // CUDA-only limit: the attend kernel's shared memory.
  CHECK(attend_smem <= 48 * 1024, "MLA: kv_lora ", p.kv_lora, " + dr ", p.dr,
        " too wide for the attend kernel's shared memory");
  const dim3 attend_grid(rows, static_cast<unsigned>(plan.num_splits));
  if (p.latent_bf16 != nullptr) {
    attend_kernel<<<attend_grid, kAttendThreads, attend_smem, stream>>>(
        a, reinterpret_cast<const __nv_bfloat16*>(p.latent_bf16));
  } else {
    attend_kernel<<<attend_grid, kAttendThreads, attend_smem, stream>>>(a, p.latent);
  }
  CUDA_CHECK_LAUNCH();

  const size_t combine_smem = sizeof(float) * (p.kv_lora + plan.num_splits + kMaxLoraRank);
  combine_project_kernel<<<rows, kCombineThreads, combine_smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
