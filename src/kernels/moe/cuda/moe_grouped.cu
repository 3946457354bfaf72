// The MoE prefill experts on CUTLASS's grouped GEMM (grouped_gemm.h): the row gather before
// gate/up, the activation between the two GEMMs and the scatter to slots after down. Each
// kernel walks scan_kernel's prefill units, one block per unit of up to 128 rows.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/moe/cuda/grouped_gemm.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda::moe_internal {
namespace {

constexpr int kThreads = 256;

// rows[r, :] = bf16(x[token of sorted row r, :]).
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const int4* __restrict__ units, const int32_t* __restrict__ unit_count,
                  const int32_t* __restrict__ sorted_slots, int64_t top_k,
                  const float* __restrict__ x, int64_t hidden, uint16_t* __restrict__ rows,
                  int64_t pitch) {
  if (static_cast<int32_t>(blockIdx.x) >= *unit_count) return;
  const int4 unit = units[blockIdx.x];
  for (int32_t r = 0; r < unit.z; ++r) {
    const int64_t pos = unit.y + r;
    const float* src = x + sorted_slots[pos] / top_k * hidden;
    uint16_t* dst = rows + pos * pitch;
    if constexpr (kVec) {
      for (int64_t c = threadIdx.x * 4; c < hidden; c += kThreads * 4) {
        const float4 v = *reinterpret_cast<const float4*>(src + c);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(dst + c) = packed;
      }
    } else {
      for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
        dst[c] = __bfloat16_as_ushort(__float2bfloat16_rn(src[c]));
      }
    }
  }
}

// rows[r, :] = bf16(act(gate[r, :], up[r, :])) (inter a multiple of 4: 16-byte loads).
__global__ void __launch_bounds__(kThreads)
    act_kernel(const int4* __restrict__ units, const int32_t* __restrict__ unit_count,
               const float* __restrict__ gate, const float* __restrict__ up, int64_t inter,
               int64_t pitch, GatedActivation act, uint16_t* __restrict__ rows) {
  if (static_cast<int32_t>(blockIdx.x) >= *unit_count) return;
  const int4 unit = units[blockIdx.x];
  for (int32_t r = 0; r < unit.z; ++r) {
    const int64_t pos = unit.y + r;
    for (int64_t c = threadIdx.x * 4; c < inter; c += kThreads * 4) {
      const float4 g = *reinterpret_cast<const float4*>(gate + pos * inter + c);
      const float4 u = *reinterpret_cast<const float4*>(up + pos * pitch + c);
      const __nv_bfloat162 lo =
          __floats2bfloat162_rn(gated_activation(g.x, u.x, act), gated_activation(g.y, u.y, act));
      const __nv_bfloat162 hi =
          __floats2bfloat162_rn(gated_activation(g.z, u.z, act), gated_activation(g.w, u.w, act));
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(rows + pos * pitch + c) = packed;
    }
  }
}

// slot_out[slot of sorted row r, :] = out[r, :] (hidden a multiple of 4).
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const int4* __restrict__ units, const int32_t* __restrict__ unit_count,
                   const int32_t* __restrict__ sorted_slots, const float* __restrict__ out,
                   int64_t hidden, float* __restrict__ slot_out) {
  if (static_cast<int32_t>(blockIdx.x) >= *unit_count) return;
  const int4 unit = units[blockIdx.x];
  for (int32_t r = 0; r < unit.z; ++r) {
    const int64_t pos = unit.y + r;
    const float* src = out + pos * hidden;
    float* dst = slot_out + static_cast<int64_t>(sorted_slots[pos]) * hidden;
    for (int64_t c = threadIdx.x * 4; c < hidden; c += kThreads * 4) {
      *reinterpret_cast<float4*>(dst + c) = *reinterpret_cast<const float4*>(src + c);
    }
  }
}

}  // namespace

void grouped_experts_bf16(const GroupedExperts& p, cudaStream_t stream) {
  CHECK(p.units != nullptr && p.unit_count != nullptr && p.sorted_slots != nullptr &&
            p.x != nullptr && p.rows != nullptr && p.gate != nullptr && p.out != nullptr &&
            p.slot_out != nullptr,
        "grouped_experts_bf16: null pointer");
  CHECK(expert_gemm_supported(p.inter, p.hidden) && expert_gemm_supported(p.hidden, p.inter),
        "grouped_experts_bf16: hidden ", p.hidden, " and inter ", p.inter,
        " must be multiples of 8");
  CHECK(p.max_units > 0 && p.max_units <= INT32_MAX, "grouped_experts_bf16: ", p.max_units,
        " units");
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  CHECK(aligned(p.rows) && aligned(p.gate) && aligned(p.out) && aligned(p.slot_out),
        "grouped_experts_bf16: buffers must be 16-byte aligned");
  const int64_t pitch = std::max(p.hidden, p.inter);
  const auto grid = static_cast<unsigned>(p.max_units);
  if (aligned(p.x)) {
    gather_kernel<true><<<grid, kThreads, 0, stream>>>(p.units, p.unit_count, p.sorted_slots,
                                                       p.top_k, p.x, p.hidden, p.rows, pitch);
  } else {
    gather_kernel<false><<<grid, kThreads, 0, stream>>>(p.units, p.unit_count, p.sorted_slots,
                                                        p.top_k, p.x, p.hidden, p.rows, pitch);
  }
  CUDA_CHECK_LAUNCH();
  ExpertGemm gemm{.active = p.active,
                  .table = p.table,
                  .num_experts = p.num_experts,
                  .min_rows = p.min_rows,
                  .num_projections = 2,
                  .projection = {0, 1},
                  .a = p.rows,
                  .d = {p.gate, p.out},
                  .n = p.inter,
                  .k = p.hidden,
                  .a_pitch = pitch,
                  .d_pitch = {p.inter, pitch}};
  expert_gemm_bf16(gemm, p.gemm_workspace, p.gemm_workspace_bytes, stream);
  act_kernel<<<grid, kThreads, 0, stream>>>(p.units, p.unit_count, p.gate, p.out, p.inter, pitch,
                                            p.act, p.rows);
  CUDA_CHECK_LAUNCH();
  gemm.num_projections = 1;
  gemm.projection[0] = 2;
  gemm.d[0] = p.out;
  gemm.d[1] = nullptr;
  gemm.n = p.hidden;
  gemm.k = p.inter;
  gemm.a_pitch = pitch;
  gemm.d_pitch[0] = p.hidden;
  expert_gemm_bf16(gemm, p.gemm_workspace, p.gemm_workspace_bytes, stream);
  scatter_kernel<<<grid, kThreads, 0, stream>>>(p.units, p.unit_count, p.sorted_slots, p.out,
                                                p.hidden, p.slot_out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda::moe_internal
