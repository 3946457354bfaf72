// The MoE's grouped GEMM on CUTLASS (grouped_gemm_bf16.cu): one launch runs every expert's
// rows against that expert's weight matrix, on Hopper warpgroup MMAs fed by TMA (CUTLASS's
// SM90 pointer-array grouped kernel, cooperative schedule, 128 x 128 x 64 tiles). The problem
// list is built on the device from the buckets, so no token count comes back to the host.
// Plain CUDA types only: the CUTLASS templates stay inside the one .cu that instantiates them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/mlp/params.h"

namespace hyserve::cuda::moe_internal {

// For each projection j < num_projections and each active record a of `active` whose expert
// has at least min_rows rows (the others are left to other kernels):
//   d[j][r, :] = a[r, :] . W^T  for the rows r in [first, first + rows) of the record,
// W = the expert's matrix number projection[j] (0 gate, 1 up, 2 down) of `table`, bf16
// [n, k] row-major; a bf16 [rows, k] with row pitch a_pitch; d[j] fp32 [rows, n] with row
// pitch d_pitch[j]; fp32 accumulate.
struct ExpertGemm {
  const int4* active = nullptr;  // [num_experts] {expert, first row, rows, 0}, then {-1, ...}
  const void* table = nullptr;   // ExpertPtrs [num_experts] (moe_common.cuh), device
  int32_t num_experts = 0;
  int32_t min_rows = 1;
  int32_t num_projections = 1;  // 1 or 2
  int32_t projection[2] = {0, 1};
  const uint16_t* a = nullptr;
  float* d[2] = {nullptr, nullptr};
  int64_t n = 0;
  int64_t k = 0;
  int64_t a_pitch = 0;          // >= k, a multiple of 8
  int64_t d_pitch[2] = {0, 0};  // >= n, multiples of 4
};

// n and k the kernel takes: multiples of 8 (16-byte TMA rows).
bool expert_gemm_supported(int64_t n, int64_t k);
// The problem list and CUTLASS's own workspace for num_experts * num_projections problems.
size_t expert_gemm_workspace_bytes(int64_t num_experts, int num_projections);
void expert_gemm_bf16(const ExpertGemm& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

// The routed experts with at least min_rows rows, BF16 weights, on expert_gemm_bf16
// (moe_grouped.cu): gather their rows of x as bf16, gate and up in one grouped GEMM,
// h = act(gate, up) rounded to bf16, down, and each row's output written to its slot.
// Work lists: scan_kernel's prefill units (an expert's tiles of up to 128 sorted rows).
// Numerics of the prefill kernels (moe_prefill.cuh): x and h rounded to bf16, fp32
// accumulate, act in fp32 on the fp32 gate and up.
struct GroupedExperts {
  const int4* active = nullptr;  // Buckets::active
  const int4* units = nullptr;   // {expert, first sorted row, rows <= 128, 0}
  const int32_t* unit_count = nullptr;
  int64_t max_units = 0;  // host bound on *unit_count: the grid
  const int32_t* sorted_slots = nullptr;
  const void* table = nullptr;  // ExpertPtrs [num_experts]
  int32_t num_experts = 0;
  int32_t min_rows = 1;
  const float* x = nullptr;  // [tokens, hidden]
  int64_t top_k = 0;
  int64_t hidden = 0;
  int64_t inter = 0;
  GatedActivation act;
  uint16_t* rows = nullptr;        // [slots, max(hidden, inter)] bf16: x's rows, then h
  float* gate = nullptr;           // [slots, inter]
  float* out = nullptr;            // [slots, max(hidden, inter)]: up, then down's output
  void* gemm_workspace = nullptr;  // expert_gemm_workspace_bytes(num_experts, 2)
  size_t gemm_workspace_bytes = 0;
  float* slot_out = nullptr;  // [slots, hidden]
};

void grouped_experts_bf16(const GroupedExperts& p, cudaStream_t stream);

}  // namespace hyserve::cuda::moe_internal
