// Weight bytes per GPU from a ModelConfig alone (no checkpoint needed), for the memory
// plan of `hyserve info`: how much of each GPU the weights leave to the KV cache.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace hyserve {

// Weights held by one GPU under TP, at their storage sizes: bf16 2 B per value; FP8 e4m3
// 1 B + one fp32 scale per 128x128 block; MXFP4 0.5 B + one e8m0 per 32 values; INT4
// 0.5 B + one bf16 scale per 32 values.
// Replicated on every TP rank (whole): what produces replicated state or is too small to
// split: q_a_proj + q_a_layernorm and kv_a_proj_with_mqa + kv_a_layernorm (the latents),
// the whole DSA indexer (index keys are replicated and the top-k needs the full score),
// KDA f_a_proj / g_a_proj / o_norm (rank-128 bottlenecks), routers, and every norm.
// Split by TP: embeddings and lm_head (vocab), q_b/q_proj, kv_b_proj, o_proj, g_proj (heads),
// KDA projections, convs, A_log, dt_bias, f_b/g_b, b_proj, o_proj (heads), dense MLP, shared
// and routed experts (intermediate dim). Small float tensors (A_log, dt_bias) are counted as
// bf16 like everything unquantized. FP8 applies to the linear weights of attention, KDA and
// MLPs when the config says fp8_block_weights; routed experts follow expert_format.
struct WeightBytes {
  int64_t replicated = 0;      // held whole by every rank
  int64_t sharded = 0;         // this rank's 1/tp share, routed experts excluded
  int64_t routed_experts = 0;  // this rank's share of every routed expert
  int64_t total() const { return replicated + sharded + routed_experts; }
};

WeightBytes estimate_weight_bytes_per_gpu(const ModelConfig& c, int64_t tp);

}  // namespace hyserve
