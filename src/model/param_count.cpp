#include "model/param_count.h"

namespace hyserve {

int64_t indexer_layer_params(const ModelConfig& c) {
  if (!c.has_indexer()) return 0;
  const int64_t d = c.hidden_size, hi = c.index_n_heads, di = c.index_head_dim;
  const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : d;
  return hi * di * q_in  // wq_b
         + di * d        // wk
         + 2 * di        // k_norm weight + bias
         + hi * d;       // weights_proj
}

int64_t mla_layer_params(const ModelConfig& c) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads;
  const int64_t q_out = h * c.qk_head_dim();
  int64_t n = 0;
  if (c.q_lora_rank > 0) {
    n += c.q_lora_rank * d + c.q_lora_rank + q_out * c.q_lora_rank;  // q_a, q_a_norm, q_b
  } else {
    n += q_out * d;  // q_proj
  }
  n += (c.kv_lora_rank + c.qk_rope_head_dim) * d;                 // kv_a_proj_with_mqa
  n += c.kv_lora_rank;                                            // kv_a_layernorm
  n += h * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank;  // kv_b_proj
  n += d * h * c.v_head_dim;                                      // o_proj
  if (c.mla_output_gate) n += h * c.v_head_dim * d;               // g_proj
  return n + indexer_layer_params(c);
}

int64_t kda_layer_params(const ModelConfig& c) {
  const int64_t d = c.hidden_size, hk = c.linear_num_heads, k = c.linear_head_dim;
  const int64_t width = hk * k;
  return 3 * width * d                                 // q, k, v proj
         + 3 * width * c.linear_conv_kernel            // q, k, v conv1d
         + k * d + width * k                           // f_a, f_b
         + hk * d                                      // b_proj
         + (c.kda_full_rank_gate ? width * d           // g_proj (full-rank output gate)
                                 : k * d + width * k)  // g_a, g_b
         + hk + width                                  // A_log (its H entries; a padded tensor
                                                       // stores more), dt_bias
         + k                                           // o_norm
         + d * width;                                  // o_proj
}

ParamCount count_params(const ModelConfig& c) {
  ParamCount p;
  const int64_t d = c.hidden_size;
  p.embedding = c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2) + d;
  // AttnRes: a norm and a [1, D] projection per mix; two mixes per layer (layer 0's
  // attention-side pair is stored though never read) and the output mix.
  if (c.has_attn_res()) p.norms += 2 * d * (2 * c.num_hidden_layers + 1);
  int64_t routed_active = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    p.norms += 2 * d;
    if (c.is_kda(i)) {
      p.attention_kda += kda_layer_params(c);
    } else {
      p.attention_mla += mla_layer_params(c);
    }
    if (c.is_moe(i)) {
      const int64_t de = c.expert_hidden_size();
      const int64_t expert = 3 * de * c.moe_intermediate_size;
      p.routed_experts += c.num_experts * expert;
      routed_active += c.num_experts_per_tok * expert;
      p.moe_other += c.num_experts * d + c.num_experts  // router + correction bias
                     + c.num_shared_experts * 3 * d * c.moe_intermediate_size;
      if (c.moe_latent_size > 0)  // routed_expert_{down,up}_proj (+ routed_expert_norm)
        p.moe_other += 2 * de * d + (c.moe_latent_norm ? de : 0);
    } else {
      p.dense_mlp += 3 * d * c.intermediate_size;
    }
  }
  const int64_t always =
      p.embedding + p.attention_mla + p.attention_kda + p.dense_mlp + p.moe_other + p.norms;
  p.total = always + p.routed_experts;
  p.active = always + routed_active;
  return p;
}

}  // namespace hyserve
