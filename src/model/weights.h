// ModelWeights: every tensor of a checkpoint, found under the names its model type
// uses (MODEL.md §7), checked for shape and dtype, and held as views (Weight) into
// the memory-mapped checkpoint. Small tensors (norms, biases, gates' constants)
// are converted to fp32 and owned here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight.h"
#include "kernels/mlp/params.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace hyserve {

struct MlaWeights {
  Weight q_proj;                 // [H*(dn+dr), D] when q_lora_rank == 0
  Weight q_a_proj;               // [q_lora, D]
  std::vector<float> q_a_norm;   // [q_lora]
  Weight q_b_proj;               // [H*(dn+dr), q_lora]
  Weight kv_a_proj;              // [kv_lora + dr, D]
  std::vector<float> kv_a_norm;  // [kv_lora]
  Weight kv_b_proj;              // [H*(dn+dv), kv_lora]
  Weight o_proj;                 // [D, H*dv]
  Weight g_proj;                 // [H*dv, D] kimi_k3 output gate, else empty
  // DSA indexer (empty without index_* fields).
  Weight idx_wq_b;                  // [Hi*di, q_lora or D]
  Weight idx_wk;                    // [di, D]
  std::vector<float> idx_k_norm_w;  // [di]
  std::vector<float> idx_k_norm_b;  // [di]
  Weight idx_weights_proj;          // [Hi, D]
};

struct KdaWeights {
  Weight q_proj, k_proj, v_proj;              // [H*K, D]
  std::vector<float> q_conv, k_conv, v_conv;  // [H*K, W]
  Weight f_a_proj;                            // [K, D]
  Weight f_b_proj;                            // [H*K, K]
  Weight b_proj;                              // [H, D]
  Weight g_a_proj;                            // [K, D]
  Weight g_b_proj;                            // [H*K, K]
  std::vector<float> a_log;                   // [H]
  std::vector<float> dt_bias;                 // [H*K]
  std::vector<float> o_norm;                  // [K]
  Weight o_proj;                              // [D, H*K]
};

struct MoeWeights {
  Weight gate;                      // [E, D] router
  std::vector<float> score_bias;    // [E] e_score_correction_bias (empty: none)
  std::vector<MlpWeights> experts;  // [E]
  MlpWeights shared;                // all shared experts as one MLP (empty when none)
  bool has_shared = false;
};

struct LayerWeights {
  std::vector<float> input_norm;  // [D]
  std::vector<float> post_norm;   // [D]
  MlaWeights mla;                 // full-attention layers
  KdaWeights kda;                 // KDA layers
  MlpWeights dense;               // dense-MLP layers
  MoeWeights moe;                 // MoE layers
};

struct ModelWeights {
  Weight embed;                   // [V, D]
  Weight lm_head;                 // [V, D] (embed when tied)
  std::vector<float> final_norm;  // [D]
  std::vector<LayerWeights> layers;
};

// Finds and checks every tensor the config implies. Throws CheckpointError naming
// the file and tensor on the first missing / misshapen / mistyped one. The
// checkpoint must outlive the weights.
ModelWeights load_weights(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace hyserve
