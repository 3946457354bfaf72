// CUDA FP8-latent helper ops (cuda.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/dtype.cuh"
#include "core/paged.h"
#include "kernels/attention/latent/check.h"
#include "kernels/attention/latent/cuda.h"
#include "kernels/linear/cuda/dequant.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTokenTile = 8;  // tokens per block of the per-head products

__global__ void quantize_kernel(QuantizeE4m3Params p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p.codes[i] = f32_to_e4m3(__fmul_rn(p.x[i], p.inv_scale));
  }
}

// core/dtype.h f32_to_bf16's integer steps, so that NaNs match the CPU's too.
__global__ void round_bf16_kernel(RoundBf16Params p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t u = __float_as_uint(p.x[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      p.out[i] = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      p.out[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

// Block (token tile, head): q_nope of the tile in shared memory [kTokenTile, dn]; thread
// per latent column l: q_lat[t, h, l] = sum_d q_nope[t, d] W_UK[d, l].
template <WFmt F>
__global__ void absorb_kernel(MlaAbsorbParams p, WRef w) {
  extern __shared__ float q_s[];
  const int64_t h = blockIdx.y;
  const int64_t t0 = blockIdx.x * int64_t{kTokenTile};
  const int n = static_cast<int>(min(int64_t{kTokenTile}, p.num_tokens - t0));
  const int64_t dqk = p.dn + p.dr;
  for (int64_t i = threadIdx.x; i < kTokenTile * p.dn; i += blockDim.x) {
    const int64_t j = i / p.dn;
    q_s[i] = j < n ? p.q[((t0 + j) * p.num_heads + h) * dqk + i % p.dn] : 0.0f;
  }
  for (int64_t i = threadIdx.x; i < n * p.dr; i += blockDim.x) {
    const int64_t t = t0 + i / p.dr;
    p.q_pe[(t * p.num_heads + h) * p.dr + i % p.dr] =
        p.q[(t * p.num_heads + h) * dqk + p.dn + i % p.dr];
  }
  __syncthreads();
  const int64_t row0 = h * (p.dn + p.dv);
  for (int64_t l = threadIdx.x; l < p.kv_lora; l += blockDim.x) {
    float acc[kTokenTile] = {};
    for (int64_t d = 0; d < p.dn; ++d) {
      const float wv = element<F>(w, row0 + d, l);
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j) acc[j] += q_s[j * p.dn + d] * wv;
    }
    for (int j = 0; j < n; ++j) p.q_lat[((t0 + j) * p.num_heads + h) * p.kv_lora + l] = acc[j];
  }
}

// Block (token tile, head): o_lat of the tile in shared memory [kTokenTile, kv_lora]; a
// warp per output column j: out[t, h, j] = sum_l W_UV[j, l] o_lat[t, l].
template <WFmt F>
__global__ void project_kernel(MlaProjectParams p, WRef w) {
  extern __shared__ float o_s[];
  const int64_t h = blockIdx.y;
  const int64_t t0 = blockIdx.x * int64_t{kTokenTile};
  const int n = static_cast<int>(min(int64_t{kTokenTile}, p.num_tokens - t0));
  for (int64_t i = threadIdx.x; i < kTokenTile * p.kv_lora; i += blockDim.x) {
    const int64_t j = i / p.kv_lora;
    o_s[i] = j < n ? p.o_lat[((t0 + j) * p.num_heads + h) * p.kv_lora + i % p.kv_lora] : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = h * (p.dn + p.dv) + p.dn;
  for (int64_t c = warp; c < p.dv; c += blockDim.x / 32) {
    float acc[kTokenTile] = {};
    for (int64_t l = lane; l < p.kv_lora; l += 32) {
      const float wv = element<F>(w, row0 + c, l);
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j) acc[j] += wv * o_s[j * p.kv_lora + l];
    }
#pragma unroll
    for (int j = 0; j < kTokenTile; ++j) {
      for (int off = 16; off > 0; off /= 2) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
    }
    if (lane == 0) {
      for (int j = 0; j < n; ++j) p.out[((t0 + j) * p.num_heads + h) * p.dv + c] = acc[j];
    }
  }
}

__global__ void query_slots_kernel(DsaQuerySlotsParams p) {
  const int64_t total = p.num_tokens * p.topk;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.topk;
    const int32_t pos = p.positions[i];
    const int32_t* table = p.block_table + t * p.table_stride;
    p.slots[i] = pos < 0 ? -1 : static_cast<int32_t>(slot_index(table, p.block_size, pos));
    if (i % p.topk == 0) p.seq_lens[t] = static_cast<int32_t>(p.q_pos[t] + 1);
  }
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

}  // namespace

void quantize_e4m3(const QuantizeE4m3Params& p, cudaStream_t stream) {
  validate(p);
  if (p.n == 0) return;
  quantize_kernel<<<grid_for(p.n), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void round_bf16(const RoundBf16Params& p, cudaStream_t stream) {
  validate(p);
  if (p.n == 0) return;
  round_bf16_kernel<<<grid_for(p.n), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void mla_absorb_q(const MlaAbsorbParams& p, cudaStream_t stream) {
  validate(p);
  if (p.num_tokens == 0) return;
  const WRef w = make_wref(*p.kv_b);
  const size_t smem = sizeof(float) * kTokenTile * p.dn;
  // CUDA-only limits: the block's shared memory and the grid's y dimension.
  CHECK(smem <= 48 * 1024, "mla_absorb_q: qk_nope_head_dim ", p.dn, " too large");
  CHECK(p.num_heads <= 65535, "mla_absorb_q: ", p.num_heads, " heads");
  const dim3 grid(static_cast<unsigned>((p.num_tokens + kTokenTile - 1) / kTokenTile),
                  static_cast<unsigned>(p.num_heads));
  dispatch_format(weight_wfmt(*p.kv_b), [&]<WFmt F>() {
    absorb_kernel<F><<<grid, kThreads, smem, stream>>>(p, w);
    CUDA_CHECK_LAUNCH();
  });
}

void mla_project_uv(const MlaProjectParams& p, cudaStream_t stream) {
  validate(p);
  if (p.num_tokens == 0) return;
  const WRef w = make_wref(*p.kv_b);
  const size_t smem = sizeof(float) * kTokenTile * p.kv_lora;
  // CUDA-only limits: the block's shared memory and the grid's y dimension.
  CHECK(smem <= 48 * 1024, "mla_project_uv: kv_lora_rank ", p.kv_lora, " too large");
  CHECK(p.num_heads <= 65535, "mla_project_uv: ", p.num_heads, " heads");
  const dim3 grid(static_cast<unsigned>((p.num_tokens + kTokenTile - 1) / kTokenTile),
                  static_cast<unsigned>(p.num_heads));
  dispatch_format(weight_wfmt(*p.kv_b), [&]<WFmt F>() {
    project_kernel<F><<<grid, kThreads, smem, stream>>>(p, w);
    CUDA_CHECK_LAUNCH();
  });
}

void dsa_query_slots(const DsaQuerySlotsParams& p, cudaStream_t stream) {
  validate(p);
  if (p.num_tokens == 0) return;
  query_slots_kernel<<<grid_for(p.num_tokens * p.topk), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
