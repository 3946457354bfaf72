// Routed experts' LoRA adapters in the CUDA MoE (issue 48; MoeParams::expert_lora_table), on
// the experts' fp32 paths (the GEMV kernel and mma_tile.cuh's tiles, which keep h in fp32):
//   1. shrink   u[pos] = (A_gate x, A_up x) for each sorted position whose token's adapter
//               adapts its expert's gate or up (rank-r vectors, kMaxLoraRank apart)
//   2. gate/up  the expert kernels add scale B u to gate and up before the activation
//               (lora_gate_up below, in their epilogues)
//   3. down     slot_out[slot] += scale B_down (A_down h[pos]) after the down kernels
// as cpu::mlp does for one expert (gate += lora, up += lora, act, down, y += lora). Each
// position's terms are fp32 in a fixed order (lane-strided dot products, a butterfly sum; the
// expand's sum over rank in order), so a token's bits never depend on its batch; a position
// without an adapter on its expert is untouched (no +0.0 added).
#pragma once

#include <cstdint>

#include "kernels/lora/cuda/shrink.cuh"
#include "kernels/lora/params.h"
#include "kernels/moe/cuda/moe_common.cuh"

namespace hyserve::cuda::moe_internal {

struct ExpertLora {
  const LoraMatrices* table = nullptr;  // [num_experts][3][num_slots]; null: no LoRA
  int32_t num_slots = 0;
  const int32_t* token_slots = nullptr;  // [num_tokens]
  int64_t top_k = 0;
  float* u = nullptr;  // [sorted positions][2][kMaxLoraRank]: gate's and up's shrink
};

constexpr int kLoraThreads = 256;
constexpr int kLoraWarps = kLoraThreads / 32;
// Blocks per active expert (each strides over the expert's positions).
constexpr int kLoraBlocksPerExpert = 32;

// The matrices of proj (0 gate, 1 up, 2 down) of expert for the token of sorted slot `slot`,
// or null when its adapter does not adapt them.
__device__ __forceinline__ const LoraMatrices* expert_lora_of(const ExpertLora& l, int32_t expert,
                                                              int proj, int32_t slot) {
  const int32_t s = l.token_slots[slot / l.top_k];
  if (s < 0 || s >= l.num_slots) return nullptr;
  const LoraMatrices* m = l.table + (static_cast<int64_t>(expert) * 3 + proj) * l.num_slots + s;
  return m->a != nullptr && m->rank > 0 && m->rank <= kMaxLoraRank ? m : nullptr;
}

// Step 1: block (a, y) takes positions y, y + kLoraBlocksPerExpert, ... of the a-th active
// expert; x rows by token ([num_tokens, hidden]).
__global__ void __launch_bounds__(kLoraThreads)
    expert_lora_shrink_kernel(Buckets b, ExpertLora l, const float* __restrict__ x,
                              int64_t hidden) {
  const int4 rec = b.active[blockIdx.x];
  if (rec.x < 0) return;
  for (int32_t m = blockIdx.y; m < rec.z; m += gridDim.y) {
    const int32_t pos = rec.y + m;
    const int32_t slot = b.sorted_slots[pos];
    const float* xt = x + static_cast<int64_t>(slot / l.top_k) * hidden;
    for (int proj = 0; proj < 2; ++proj) {
      const LoraMatrices* mat = expert_lora_of(l, rec.x, proj, slot);
      if (mat != nullptr) {
        cuda::lora_shrink<kLoraWarps>(*mat, xt, hidden,
                                      l.u + (static_cast<int64_t>(pos) * 2 + proj) * kMaxLoraRank);
      }
    }
  }
}

// Step 2, in the gate/up kernels' epilogues: gate and up of sorted position pos (slot
// sorted_slots[pos]) at column n, with the adapters' terms added when there are any.
__device__ __forceinline__ void lora_gate_up(const ExpertLora& l, int32_t expert, int32_t pos,
                                             int32_t slot, int64_t n, float& gate, float& up) {
  if (l.table == nullptr) return;
  float* v[2] = {&gate, &up};
#pragma unroll
  for (int proj = 0; proj < 2; ++proj) {
    const LoraMatrices* m = expert_lora_of(l, expert, proj, slot);
    if (m == nullptr) continue;
    const float* u = l.u + (static_cast<int64_t>(pos) * 2 + proj) * kMaxLoraRank;
    const float* bn = m->b + n * m->rank;
    float acc = 0.0f;
    for (int64_t r = 0; r < m->rank; ++r) acc = fmaf(bn[r], u[r], acc);
    *v[proj] += m->scale * acc;
  }
}

// Step 3: block (a, y) as in step 1; h rows by position ([positions, inter]), slot_out rows
// by slot ([slots, hidden]).
__global__ void __launch_bounds__(kLoraThreads)
    expert_lora_down_kernel(Buckets b, ExpertLora l, const float* __restrict__ h, int64_t inter,
                            float* __restrict__ slot_out, int64_t hidden) {
  __shared__ float u[kMaxLoraRank];
  const int4 rec = b.active[blockIdx.x];
  if (rec.x < 0) return;
  for (int32_t m = blockIdx.y; m < rec.z; m += gridDim.y) {
    const int32_t pos = rec.y + m;
    const int32_t slot = b.sorted_slots[pos];
    const LoraMatrices* mat = expert_lora_of(l, rec.x, 2, slot);
    if (mat == nullptr) continue;  // the same for the whole block
    cuda::lora_shrink<kLoraWarps>(*mat, h + static_cast<int64_t>(pos) * inter, inter, u);
    __syncthreads();
    float* y = slot_out + static_cast<int64_t>(slot) * hidden;
    for (int64_t o = threadIdx.x; o < hidden; o += kLoraThreads) {
      const float* bo = mat->b + o * mat->rank;
      float acc = 0.0f;
      for (int64_t r = 0; r < mat->rank; ++r) acc = fmaf(bo[r], u[r], acc);
      y[o] += mat->scale * acc;
    }
    __syncthreads();
  }
}

}  // namespace hyserve::cuda::moe_internal
