// Mixture of experts, MODEL.md §5: the sigmoid router with grouped top-k, and
// the expert computation y = sum_i w_i * expert_{id_i}(x) + shared(x).
#pragma once

#include <cstdint>

#include "core/weight.h"
#include "kernels/mlp/params.h"

namespace hyserve {

// s = sigmoid(x gate^T); s' = s + bias. With n_group > 1 the experts form n_group
// groups of E/n_group consecutive experts; a group scores the sum of its top-2 s'
// and only the topk_group best groups stay eligible. The top_k eligible experts
// by s' are chosen, ordered by descending s'; their weights are s (no bias),
// divided by (sum + 1e-20) when renormalize, times scaling_factor.
// Ties (groups and experts): the lower index wins.
struct RouterParams {
  const float* x = nullptr;      // [num_tokens, D]
  const Weight* gate = nullptr;  // [num_experts, D]
  const float* bias = nullptr;   // [num_experts] e_score_correction_bias, or null
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool renormalize = true;
  float scaling_factor = 1.0f;
  int32_t* expert_ids = nullptr;    // [num_tokens, top_k] out
  float* expert_weights = nullptr;  // [num_tokens, top_k] out
};

// Tokens are grouped by expert, so each expert's weights are decoded once per
// call. y[t] accumulates w_i * expert(x[t]) in slot order i, then shared(x[t]);
// the result does not depend on the thread count or on the other tokens.
struct MoeParams {
  const float* x = nullptr;  // [num_tokens, hidden]
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  const MlpWeights* experts = nullptr;  // [num_experts]
  int64_t num_experts = 0;
  const int32_t* expert_ids = nullptr;    // [num_tokens, top_k]
  const float* expert_weights = nullptr;  // [num_tokens, top_k]
  int64_t top_k = 0;
  const MlpWeights* shared = nullptr;  // the shared experts as one MLP, or null
  float* y = nullptr;                  // [num_tokens, hidden]; may equal x
  GatedActivation act;                 // of every expert and the shared MLP
  // Expert parallelism: `experts` are the router's experts [expert_offset, expert_offset +
  // num_experts) only, and a slot whose id is outside them adds nothing (another rank has
  // its expert). false: every id must be one of the experts.
  bool local_experts_only = false;
  int64_t expert_offset = 0;
  // LoRA adapters (kernels/lora/params.h): expert_lora [num_experts] each expert's, with
  // token_slots [num_tokens] the slots of this call's tokens (the kernel regroups them with
  // the tokens; the CPU backend's form); shared_lora the shared MLP's. null: none.
  const MlpLora* expert_lora = nullptr;
  const MlpLora* shared_lora = nullptr;
  // The routed experts' adapters in the CUDA kernels' form (device memory, the same matrices
  // as expert_lora): expert_lora_table [num_experts][3][lora_num_slots], expert e's gate, up
  // and down by adapter slot (entries with a == null: that slot does not adapt it), and
  // lora_token_slots [num_tokens] each token's slot (-1: none). null: none.
  const LoraMatrices* expert_lora_table = nullptr;
  int64_t lora_num_slots = 0;
  const int32_t* lora_token_slots = nullptr;
};

namespace cpu {

// The argument checks of route_experts, shared with the CUDA router.
void check_router_params(const RouterParams& p);
void route_experts(const RouterParams& p);
// Every expert's and the shared expert's MLP as mlp(.., gemm) computes it. (The router's
// logits always take the reference order: an expert choice never depends on the batch.)
void moe(const MoeParams& p, CpuGemm gemm = CpuGemm::kReference);

}  // namespace cpu
}  // namespace hyserve
