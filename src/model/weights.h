// ModelWeights: every tensor of a checkpoint, found under the names its model type
// uses (MODEL.md §7), checked for shape and dtype. ModelWeights holds views only:
// Weight (matrices in their stored format) and Vec (small fp32 tensors: norms,
// biases, gate constants). On the host they point into the memory-mapped checkpoint
// and into LoadedWeights' own fp32 copies; a device backend makes a copy of the
// struct whose views point into device memory (for_each_tensor visits them all).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "core/weight.h"
#include "kernels/mlp/params.h"
#include "model/config.h"
#include "model/tensor_source.h"

namespace hyserve {

// A small fp32 tensor: a view.
struct Vec {
  const float* data = nullptr;
  int64_t size = 0;
  bool empty() const { return data == nullptr; }
};

struct MlaWeights {
  Weight q_proj;     // [H*(dn+dr), D] when q_lora_rank == 0
  Weight q_a_proj;   // [q_lora, D]
  Vec q_a_norm;      // [q_lora]
  Weight q_b_proj;   // [H*(dn+dr), q_lora]
  Weight kv_a_proj;  // [kv_lora + dr, D]
  Vec kv_a_norm;     // [kv_lora]
  Weight kv_b_proj;  // [H*(dn+dv), kv_lora]
  Weight o_proj;     // [D, H*dv]
  Weight g_proj;     // [H*dv, D] kimi_k3 output gate, else empty
  // DSA indexer (empty without index_* fields).
  Weight idx_wq_b;          // [Hi*di, q_lora or D]
  Weight idx_wk;            // [di, D]
  Vec idx_k_norm_w;         // [di]
  Vec idx_k_norm_b;         // [di]
  Weight idx_weights_proj;  // [Hi, D]
};

struct KdaWeights {
  Weight q_proj, k_proj, v_proj;  // [H*K, D]
  Vec q_conv, k_conv, v_conv;     // [H*K, W]
  Weight f_a_proj;                // [K, D]
  Weight f_b_proj;                // [H*K, K]
  Weight b_proj;                  // [H, D]
  Weight g_a_proj;                // [K, D]     low-rank output gate (Kimi Linear)
  Weight g_b_proj;                // [H*K, K]
  Weight g_proj;                  // [H*K, D]   full-rank output gate (use_full_rank_gate)
  Vec a_log;                      // [H] (a stored [>= H] tensor's first H entries)
  Vec dt_bias;                    // [H*K]
  Vec o_norm;                     // [K]
  Weight o_proj;                  // [D, H*K]
};

struct MoeWeights {
  Weight gate;                      // [E, D] router
  Vec score_bias;                   // [E] e_score_correction_bias (empty: none)
  std::vector<MlpWeights> experts;  // [E], on [*, De] inputs (De = expert_hidden_size)
  MlpWeights shared;                // all shared experts as one MLP on [*, D] (empty: none)
  bool has_shared = false;
  // The latent MoE (routed_expert_hidden_size; empty otherwise).
  Weight latent_down;  // [De, D] routed_expert_down_proj
  Vec latent_norm;     // [De] routed_expert_norm (latent_moe_use_norm)
  Weight latent_up;    // [D, De] routed_expert_up_proj
};

// Block AttnRes (K3.md §3.2): res_norm.weight [D] * res_proj.weight [1, D] folded into
// the one query vector the mix scores candidates against.
using AttnResQuery = Vec;  // [D]

struct LayerWeights {
  Vec input_norm;         // [D]
  Vec post_norm;          // [D]
  AttnResQuery attn_res;  // self_attention_res_{norm,proj} (AttnRes models, layers >= 1)
  AttnResQuery mlp_res;   // mlp_res_{norm,proj} (AttnRes models)
  MlaWeights mla;         // full-attention layers
  KdaWeights kda;         // KDA layers
  MlpWeights dense;       // dense-MLP layers
  MoeWeights moe;         // MoE layers
};

struct ModelWeights {
  Weight embed;             // [V, D]
  Weight lm_head;           // [V, D] (embed when tied)
  Vec final_norm;           // [D]
  AttnResQuery output_res;  // output_attn_res_{norm,proj} (AttnRes models)
  std::vector<LayerWeights> layers;
};

// Host weights: the views and the fp32 copies the Vec views point into.
struct LoadedWeights {
  ModelWeights views;
  std::deque<std::vector<float>> owned;  // a deque: elements never move
  // Matrices made here rather than viewed in the checkpoint (a tensor-parallel rank's
  // column slices, model/tensor_parallel.h).
  std::deque<std::vector<uint8_t>> owned_bytes;
};

// Finds and checks every tensor the config implies. Throws CheckpointError naming
// the file and tensor on the first missing / misshapen / mistyped one. The
// source must outlive the weights.
LoadedWeights load_weights(const ModelConfig& config, const TensorSource& source);

// Calls on_weight(Weight&) for every non-empty matrix and on_vec(Vec&) for every
// non-empty small tensor of w, in a fixed order.
template <typename OnWeight, typename OnVec>
void for_each_tensor(ModelWeights& w, OnWeight&& on_weight, OnVec&& on_vec) {
  auto wt = [&](Weight& x) {
    if (!x.empty()) on_weight(x);
  };
  auto vc = [&](Vec& x) {
    if (!x.empty()) on_vec(x);
  };
  auto mlp = [&](MlpWeights& m) {
    wt(m.gate);
    wt(m.up);
    wt(m.down);
  };
  wt(w.embed);
  wt(w.lm_head);
  vc(w.final_norm);
  vc(w.output_res);
  for (LayerWeights& l : w.layers) {
    vc(l.input_norm);
    vc(l.post_norm);
    vc(l.attn_res);
    vc(l.mlp_res);
    MlaWeights& a = l.mla;
    for (Weight* x : {&a.q_proj, &a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.kv_b_proj, &a.o_proj,
                      &a.g_proj, &a.idx_wq_b, &a.idx_wk, &a.idx_weights_proj})
      wt(*x);
    for (Vec* x : {&a.q_a_norm, &a.kv_a_norm, &a.idx_k_norm_w, &a.idx_k_norm_b}) vc(*x);
    KdaWeights& k = l.kda;
    for (Weight* x : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a_proj, &k.f_b_proj, &k.b_proj,
                      &k.g_a_proj, &k.g_b_proj, &k.g_proj, &k.o_proj})
      wt(*x);
    for (Vec* x : {&k.q_conv, &k.k_conv, &k.v_conv, &k.a_log, &k.dt_bias, &k.o_norm}) vc(*x);
    mlp(l.dense);
    wt(l.moe.gate);
    vc(l.moe.score_bias);
    for (MlpWeights& e : l.moe.experts) mlp(e);
    mlp(l.moe.shared);
    wt(l.moe.latent_down);
    vc(l.moe.latent_norm);
    wt(l.moe.latent_up);
  }
}

}  // namespace hyserve
