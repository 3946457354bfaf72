// CUDA MLA attention, absorbed form with split-KV (cuda.h). Three kernels:
//   absorb_q_kernel         block per (t, h): q_abs = [q_nope W_UK | q_pe]
//   attend_kernel           block per ((t, h), split): online softmax over a slice of
//                           the query's key slots, kKeyTile keys at a time; a warp per
//                           key for the logits, a thread per latent column for o_lat
//   combine_project_kernel  block per (t, h): merge the splits by their maxima, then
//                           out = W_UV o_lat (a warp per output column)
//
// Workspace (each part 256-byte aligned):
//   q_abs  [T*H, kv_lora + dr] | part_o [T*H, splits, kv_lora] | part_ml [T*H, splits, 2]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/cuda/dtype.cuh"
#include "kernels/attention/mla/check.h"
#include "kernels/attention/mla/cuda.h"
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
  float* dst = a.q_abs + row * width;
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t d = 0; d < p.dn; ++d) acc += q_nope_s[d] * weight_at(a.kv_b, w_row0 + d, l);
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

// Shared memory: o_lat [kv_lora] | split weight [splits].
__global__ void combine_project_kernel(MlaArgs a) {
  extern __shared__ float smem_f[];
  const MlaAttentionParams& p = a.p;
  float* o_s = smem_f;
  float* weight_s = o_s + p.kv_lora;
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
  for (int64_t d = warp; d < p.dv; d += blockDim.x / 32) {
    float acc = 0.0f;
    for (int64_t l = lane; l < p.kv_lora; l += 32) acc += weight_at(a.kv_b, w_row0 + d, l) * o_s[l];
    acc = warp_sum(acc);
    if (lane == 0) out[d] = acc;
  }
}

// validate(p), then the CUDA-only limit: one block per (query, head).
void check_params(const MlaAttentionParams& p) {
  validate(p);
  CHECK(p.num_tokens * p.num_heads < (int64_t{1} << 31),
        "mla_attention: T*H = ", p.num_tokens * p.num_heads);
}

}  // namespace

size_t mla_attention_workspace_bytes(const MlaAttentionParams& p) {
  return make_plan(p, /*batch_invariant=*/false).total_bytes();  // one split needs less
}

void mla_attention_absorbed(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, bool batch_invariant) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const Plan plan = make_plan(p, batch_invariant);
  CHECK(workspace != nullptr && workspace_bytes >= plan.total_bytes(), "MLA workspace of ",
        workspace_bytes, " bytes, need ", plan.total_bytes());
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

  absorb_q_kernel<<<rows, kAbsorbThreads, sizeof(float) * p.dn, stream>>>(a);
  CUDA_CHECK_LAUNCH();

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

  const size_t combine_smem = sizeof(float) * (p.kv_lora + plan.num_splits);
  combine_project_kernel<<<rows, kCombineThreads, combine_smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
