// ModelConfig: everything hyserve needs from a checkpoint's config.json, for the
// model types it serves (MODEL.md §1; kimi_k3 as published, K3.md §1; DeepSeek-V3's
// architecture as deepseek_v3 and Kimi K2 / K2.5 ship it). Parsing accepts every
// spelling the real checkpoints use, the multimodal wrappers (Kimi K3's and Kimi
// K2.5's, with the text model under `text_config` and its tensors under
// `language_model.`) included, and refuses unknown types, missing fields,
// inconsistent sizes and fields known to change the math that hyserve does not
// implement with a ConfigError naming the field. Fields it does not know are listed in
// `unknown_fields` (reported at load), never silently dropped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kv/cache_spec.h"

namespace hyserve {

// kDeepseekV3: DeepSeek-V3's architecture (MLA with interleaved YaRN RoPE, dense over the
// whole context, + the noaux_tc MoE), the deepseek_v32 model without its indexer. The
// config.json model_types deepseek_v3 (DeepSeek-V3 / R1), kimi_k2 (Kimi K2) and
// kimi_k25 (Kimi K2.5's multimodal wrapper) all map to it; model_type_name keeps which.
enum class ModelType { kKimiK3, kKimiLinear, kDeepseekV32, kDeepseekV3 };

// Attention kind of one decoder layer.
enum class LayerKind {
  kKda,  // Kimi Delta Attention ("linear_attention")
  kMla,  // multi-head latent attention ("full_attention"), with the DSA indexer when
         // the config has index_* fields
};

// Feed-forward kind of one decoder layer.
enum class MlpKind { kDense, kMoe };

// Rotary embedding of MLA's rope dims (deepseek_v32, deepseek_v3 and Kimi K2: interleaved
// pairs). kimi_linear and kimi_k3 are NoPE.
struct RopeConfig {
  bool enabled = false;
  double theta = 10000.0;
  bool yarn = false;  // rope_scaling.type == "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0: absent
  double mscale_all_dim = 0.0;  // 0: absent
};

// How routed-expert weights are stored, from quantization_config.
enum class ExpertFormat { kBf16, kFp8Block, kMxfp4, kInt4 };

struct ModelConfig {
  ModelType model_type = ModelType::kKimiK3;
  std::string model_type_name;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t intermediate_size = 0;  // dense MLP
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  std::vector<LayerKind> layer_kinds;  // [num_hidden_layers]
  std::vector<MlpKind> mlp_kinds;      // [num_hidden_layers]

  // MLA (full-attention layers).
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double kv_norm_eps = 1e-6;     // kv_a_layernorm / q_a_layernorm eps
  bool mla_output_gate = false;  // mla_use_output_gate (kimi_k3): o *= sigmoid(g_proj(x))
  RopeConfig rope;

  // DSA indexer; index_n_heads == 0 means dense MLA.
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t index_rope_dims = 0;     // deepseek_v32: qk_rope_head_dim; kimi_k3: 0 (NoPE)
  double index_k_norm_eps = 1e-6;  // k_norm (LayerNorm): 1e-6 (deepseek_v32), rms_norm_eps
                                   // (kimi_k3's dsa_config, which declares none)

  // KDA (linear-attention layers).
  int64_t linear_num_heads = 0;
  int64_t linear_head_dim = 0;
  int64_t linear_conv_kernel = 0;
  // linear_attn_config.gate_lower_bound (kimi_k3, K3.md §3.3): < 0 selects the bounded
  // forget gate lb * sigmoid(exp(A_log) * (f + dt_bias)); 0 (absent) Kimi Linear's
  // -exp(A_log) * softplus(f + dt_bias).
  double kda_gate_lower_bound = 0.0;
  // linear_attn_config.use_full_rank_gate: the KDA output gate is one g_proj [H*K, D]
  // instead of g_b_proj(g_a_proj(x)).
  bool kda_full_rank_gate = false;

  // MoE.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  int64_t moe_layer_freq = 1;  // layer i >= first_k_dense_replace is MoE iff i % freq == 0
  // routed_expert_hidden_size (kimi_k3's latent MoE, K3.md §3.5): the routed experts run
  // on a [T, moe_latent_size] projection of the input; 0: on the input itself.
  int64_t moe_latent_size = 0;
  bool moe_latent_norm = false;  // latent_moe_use_norm: RMSNorm of the combined latent
  // kInt4: compressed-tensors "pack-quantized" routed experts (Kimi K2 Thinking / K2.5),
  // w = (n - 8) * scale, one scale per 32 inputs (WeightFormat::kInt4).
  ExpertFormat expert_format = ExpertFormat::kBf16;
  // FP8 block scales apply to every linear weight that has a weight_scale_inv
  // (deepseek's "fp8" quant_method); recorded for reporting.
  bool fp8_block_weights = false;

  // The gated activation of every MLP and expert: hidden_act "silu" (SwiGLU) or "situ"
  // (K3.md §3.7, with activation_situ_beta and activation_situ_linear_beta; the latter
  // 0 when null).
  bool situ = false;
  double situ_beta = 0.0;
  double situ_linear_beta = 0.0;

  // Block attention residuals (K3.md §3.2): a snapshot of the residual stream every
  // attn_res_block_size layers, mixed in before each sublayer's norm; 0: the plain
  // residual stream of MODEL.md §0.
  int64_t attn_res_block_size = 0;

  // The published Kimi K3 / Kimi K2.5 wrappers: tensor names under this prefix
  // ("language_model."), a vision tower that text-only serving skips.
  std::string tensor_prefix;
  bool has_vision = false;
  // Config fields hyserve does not know (dotted paths, e.g. "text_config.foo"): they
  // are reported at load; a known field that changes the math and is not implemented
  // is refused instead.
  std::vector<std::string> unknown_fields;

  bool has_indexer() const { return index_n_heads > 0; }
  bool has_attn_res() const { return attn_res_block_size > 0; }
  // AttnRes snapshots a forward pass holds at most: layers 0, bs, 2 bs, ...
  int64_t num_attn_res_snapshots() const {
    return has_attn_res() ? (num_hidden_layers + attn_res_block_size - 1) / attn_res_block_size : 0;
  }
  // Width the routed experts run at.
  int64_t expert_hidden_size() const { return moe_latent_size > 0 ? moe_latent_size : hidden_size; }
  bool is_kda(int64_t layer) const { return layer_kinds.at(layer) == LayerKind::kKda; }
  bool is_moe(int64_t layer) const { return mlp_kinds.at(layer) == MlpKind::kMoe; }
  int64_t num_kda_layers() const;
  int64_t num_mla_layers() const;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // What the KV cache's layout needs of this model (kv/ reads nothing else).
  CacheSpec cache_spec() const;
  // Softmax scale of MLA: (dn+dr)^-0.5, times mscale^2 under YaRN.
  double mla_softmax_scale() const;

  // "" when every field is known, else one line naming the unknown fields.
  std::string unknown_fields_warning() const;

  // Parses a config.json object. Throws ConfigError naming the field.
  static ModelConfig from_json(const nlohmann::json& j);
  // Reads PATH, a config.json or a folder holding one.
  static ModelConfig load(const std::filesystem::path& path);
};

const char* model_type_name(ModelType t);

}  // namespace hyserve
