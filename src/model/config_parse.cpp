// The per-section field readers of a text model's config.json (model/config_fields.h):
// the geometry and token ids, the activation, the layer and MLP kinds, MoE routing, MLA with
// its RoPE, the DSA indexer and KDA. parse_text_config reads the sections in this order, so
// a config with several faults reports the same one first.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/config_fields.h"

namespace hyserve::config_detail {
namespace {

std::vector<LayerKind> parse_layer_kinds(const json& j, const Fields& f, ModelType type,
                                         int64_t num_layers) {
  std::vector<LayerKind> kinds;
  if (const json* lt = f.find({"layer_types"})) {
    CONFIG_CHECK(lt->is_array(), "'layer_types' must be a list of strings");
    CONFIG_CHECK(static_cast<int64_t>(lt->size()) == num_layers, "'layer_types' has ", lt->size(),
                 " entries but num_hidden_layers is ", num_layers);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      const std::string s = e.is_string() ? e.get<std::string>() : e.dump();
      // transformers writes DeepSeek-V3.2's MLA + DSA layers as "indexed_attention"
      // (5.17 on) or "deepseek_sparse_attention" (5.12-5.16); whether a layer has the
      // indexer follows from the index_* fields, not from this name.
      if (s == "linear_attention") {
        kinds.push_back(LayerKind::kKda);
      } else if (s == "full_attention" || s == "indexed_attention" ||
                 s == "deepseek_sparse_attention") {
        kinds.push_back(LayerKind::kMla);
      } else {
        HYSERVE_THROW(ConfigError, "config field 'layer_types[", i, "]' has unknown value ",
                      e.dump(),
                      " (expected one of \"linear_attention\", \"full_attention\", "
                      "\"indexed_attention\", \"deepseek_sparse_attention\")");
      }
    }
    return kinds;
  }
  if (const json* la = f.find({"linear_attn_config"})) {
    CONFIG_CHECK(la->is_object(), "'linear_attn_config' must be an object");
    std::vector<int> seen(num_layers, 0);
    kinds.assign(num_layers, LayerKind::kMla);
    for (const char* key : {"kda_layers", "full_attn_layers"}) {
      auto it = la->find(key);
      if (it == la->end())
        HYSERVE_THROW(ConfigError, "config is missing 'linear_attn_config.", key, "'");
      CONFIG_CHECK(it->is_array(), "'linear_attn_config.", key,
                   "' must be a list of layer numbers");
      for (const json& e : *it) {
        CONFIG_CHECK(e.is_number_integer(), "'linear_attn_config.", key, "' holds ", e.dump());
        const int64_t one_based = e.get<int64_t>();
        if (one_based < 1 || one_based > num_layers)
          HYSERVE_THROW(ConfigError, "'linear_attn_config.", key, "' lists layer ", one_based,
                        " outside 1..", num_layers, " (the list is 1-indexed)");
        ++seen[one_based - 1];
        kinds[one_based - 1] = std::string(key) == "kda_layers" ? LayerKind::kKda : LayerKind::kMla;
      }
    }
    for (int64_t i = 0; i < num_layers; ++i) {
      if (seen[i] != 1)
        HYSERVE_THROW(ConfigError, "'linear_attn_config': layer ", i + 1, " is listed ", seen[i],
                      " times in kda_layers + full_attn_layers (must be exactly once)");
    }
    return kinds;
  }
  if (is_deepseek_family(type)) return std::vector<LayerKind>(num_layers, LayerKind::kMla);
  (void)j;
  HYSERVE_THROW(ConfigError,
                "config has neither 'layer_types' nor 'linear_attn_config': "
                "cannot tell KDA layers from full-attention layers");
}

std::vector<MlpKind> parse_mlp_kinds(const Fields& f, int64_t num_layers, int64_t num_experts) {
  std::vector<MlpKind> kinds;
  if (const json* mt = f.find({"mlp_layer_types"})) {
    CONFIG_CHECK(mt->is_array(), "'mlp_layer_types' must be a list of strings");
    CONFIG_CHECK(static_cast<int64_t>(mt->size()) == num_layers, "'mlp_layer_types' has ",
                 mt->size(), " entries but num_hidden_layers is ", num_layers);
    for (size_t i = 0; i < mt->size(); ++i) {
      const json& e = (*mt)[i];
      const std::string s = e.is_string() ? e.get<std::string>() : e.dump();
      if (s == "dense") {
        kinds.push_back(MlpKind::kDense);
      } else if (s == "sparse" || s == "moe") {
        kinds.push_back(MlpKind::kMoe);
      } else {
        HYSERVE_THROW(ConfigError, "config field 'mlp_layer_types[", i, "]' has unknown value ",
                      e.dump(), " (expected \"dense\" or \"sparse\")");
      }
    }
    return kinds;
  }
  if (num_experts == 0) return std::vector<MlpKind>(num_layers, MlpKind::kDense);
  const auto first_dense = f.opt_int({"first_k_dense_replace"});
  if (!first_dense)
    HYSERVE_THROW(ConfigError,
                  "config has experts but neither 'mlp_layer_types' nor "
                  "'first_k_dense_replace'");
  CONFIG_CHECK(*first_dense >= 0, "'first_k_dense_replace' must be >= 0, got ", *first_dense);
  const int64_t freq = f.opt_int({"moe_layer_freq"}).value_or(1);
  CONFIG_CHECK(freq >= 1, "'moe_layer_freq' must be >= 1, got ", freq);
  for (int64_t i = 0; i < num_layers; ++i)
    kinds.push_back(i >= *first_dense && i % freq == 0 ? MlpKind::kMoe : MlpKind::kDense);
  return kinds;
}

void parse_rope(const Fields& f, ModelConfig& c) {
  if (!is_deepseek_family(c.model_type)) {
    // kimi_linear and kimi_k3 are NoPE: the rope dims exist but nothing rotates.
    if (auto nope = f.opt_bool({"mla_use_nope"}); nope && !*nope)
      HYSERVE_THROW(ConfigError, "config field 'mla_use_nope' is false, but ", c.model_type_name,
                    " MLA is NoPE in hyserve");
    f.find({"rope_theta", "rope_scaling", "rope_parameters"});  // NoPE: read, unused
    return;
  }
  c.rope.enabled = true;
  // transformers' DeepseekV3Config: rope_interleave true (the default, DeepSeek's own
  // layout) rotates interleaved pairs, as hyserve does; false rotates half-split pairs.
  if (auto interleave = f.opt_bool({"rope_interleave"}); interleave && !*interleave)
    HYSERVE_THROW(ConfigError,
                  "config field 'rope_interleave' is false (half-split MLA RoPE): hyserve "
                  "implements DeepSeek's interleaved MLA RoPE only");
  const json* params = f.find({"rope_parameters"});
  const json* scaling = f.find({"rope_scaling"});
  if (params) CONFIG_CHECK(params->is_object(), "'rope_parameters' must be an object");
  if (scaling) CONFIG_CHECK(scaling->is_object(), "'rope_scaling' must be an object");
  const json empty = json::object();
  const Fields p(params ? *params : empty);
  const Fields s(scaling ? *scaling : empty);
  if (auto t = f.opt_double({"rope_theta"})) c.rope.theta = *t;
  if (auto t = p.opt_double({"rope_theta"})) c.rope.theta = *t;
  CONFIG_CHECK(c.rope.theta > 0, "'rope_theta' must be positive");
  const Fields& src = params ? p : s;
  const auto type = src.opt_string({"rope_type", "type"});
  if (!type || *type == "default") return;
  if (*type != "yarn")
    HYSERVE_THROW(ConfigError, "config field 'rope_scaling.type' = \"", *type,
                  "\" is not supported (default or yarn)");
  c.rope.yarn = true;
  c.rope.factor = src.opt_double({"factor"}).value_or(1.0);
  CONFIG_CHECK(c.rope.factor >= 1.0, "'rope_scaling.factor' must be >= 1, got ", c.rope.factor);
  auto orig = src.opt_int({"original_max_position_embeddings"});
  if (!orig) orig = f.opt_int({"original_max_position_embeddings"});
  if (!orig)
    HYSERVE_THROW(ConfigError, "yarn rope needs 'rope_scaling.original_max_position_embeddings'");
  c.rope.original_max_position_embeddings = *orig;
  c.rope.beta_fast = src.opt_double({"beta_fast"}).value_or(32.0);
  c.rope.beta_slow = src.opt_double({"beta_slow"}).value_or(1.0);
  c.rope.mscale = src.opt_double({"mscale"}).value_or(0.0);
  c.rope.mscale_all_dim = src.opt_double({"mscale_all_dim"}).value_or(0.0);
}

bool is_power_of_two(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

// Refuses a boolean field that changes the math when it is true (biases hyserve's
// checkpoints never have).
void refuse_if_true(const Fields& f, const char* name, const char* what) {
  if (auto v = f.opt_bool({name}); v && *v)
    HYSERVE_THROW(ConfigError, "config field '", name, "' is true (", what,
                  "): not implemented in hyserve");
}

// The model's width, depth, norm eps and token ids; biases are refused.
void parse_basics(const Fields& f, ModelConfig& c) {
  c.vocab_size = f.positive({"vocab_size"}, "embedding rows");
  c.hidden_size = f.positive({"hidden_size"}, "model width");
  c.num_hidden_layers = f.positive({"num_hidden_layers"}, "decoder depth");
  c.rms_norm_eps = f.opt_double({"rms_norm_eps"}).value_or(1e-6);
  CONFIG_CHECK(c.rms_norm_eps > 0, "'rms_norm_eps' must be positive");
  c.max_position_embeddings =
      f.opt_int({"max_position_embeddings", "model_max_length"}).value_or(0);
  c.tie_word_embeddings = f.opt_bool({"tie_word_embeddings"}).value_or(false);
  c.bos_token_id = f.opt_int({"bos_token_id"}).value_or(-1);
  if (const json* eos = f.find({"eos_token_id"})) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const json& e : *eos) {
        CONFIG_CHECK(e.is_number_integer(), "'eos_token_id' holds ", e.dump());
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      HYSERVE_THROW(ConfigError, "config field 'eos_token_id' must be an integer or a list");
    }
  }
  refuse_if_true(f, "attention_bias", "biases on the attention projections");
  refuse_if_true(f, "mlp_bias", "biases on the MLP projections");
}

// The gated activation (K3.md §3.7) and block attention residuals (K3.md §3.2).
void parse_activation(const Fields& f, ModelConfig& c) {
  const std::string act = f.opt_string({"hidden_act"}).value_or("silu");
  if (act == "situ") {
    c.situ = true;
    const auto beta = f.opt_double({"activation_situ_beta"});
    if (!beta)
      HYSERVE_THROW(ConfigError, "'hidden_act' is \"situ\" but 'activation_situ_beta' is missing");
    CONFIG_CHECK(*beta > 0, "'activation_situ_beta' must be positive, got ", *beta);
    c.situ_beta = *beta;
    c.situ_linear_beta = f.opt_double({"activation_situ_linear_beta"}).value_or(0.0);
    CONFIG_CHECK(c.situ_linear_beta >= 0, "'activation_situ_linear_beta' must be positive or null");
  } else if (act != "silu") {
    HYSERVE_THROW(ConfigError, "config field 'hidden_act' = \"", act,
                  "\" is not supported (silu, situ)");
  }

  // Block attention residuals (K3.md §3.2).
  if (auto bs = f.opt_int({"attn_res_block_size"})) {
    CONFIG_CHECK(*bs >= 1, "'attn_res_block_size' must be >= 1, got ", *bs);
    c.attn_res_block_size = *bs;
  }
}

// MoE: the experts, their routing (grouped top-k, sigmoid, noaux_tc) and the latent MoE.
void parse_moe(const Fields& f, ModelConfig& c) {
  c.num_experts = f.opt_int({"num_experts", "n_routed_experts", "num_local_experts"}).value_or(0);
  CONFIG_CHECK(c.num_experts >= 0, "'num_experts' must be >= 0");
  c.mlp_kinds = parse_mlp_kinds(f, c.num_hidden_layers, c.num_experts);
  c.moe_layer_freq = f.opt_int({"moe_layer_freq"}).value_or(1);
  bool any_moe = false, any_dense = false;
  for (MlpKind k : c.mlp_kinds) (k == MlpKind::kMoe ? any_moe : any_dense) = true;
  if (any_dense) c.intermediate_size = f.positive({"intermediate_size"}, "dense MLP width");
  if (any_moe) {
    CONFIG_CHECK(c.num_experts > 0, "MoE layers need 'num_experts' (or 'n_routed_experts') > 0");
    c.num_experts_per_tok =
        f.positive({"num_experts_per_token", "num_experts_per_tok"}, "routed experts per token");
    CONFIG_CHECK(c.num_experts_per_tok <= c.num_experts, "'num_experts_per_token' (",
                 c.num_experts_per_tok, ") exceeds 'num_experts' (", c.num_experts, ")");
    c.moe_intermediate_size = f.positive({"moe_intermediate_size"}, "expert MLP width");
    c.num_shared_experts = f.opt_int({"num_shared_experts", "n_shared_experts"}).value_or(0);
    CONFIG_CHECK(c.num_shared_experts >= 0, "'num_shared_experts' must be >= 0");
    c.n_group = f.opt_int({"num_expert_group", "n_group"}).value_or(1);
    c.topk_group = f.opt_int({"topk_group"}).value_or(1);
    // use_grouped_topk false: plain top-k whatever the group fields say.
    if (auto grouped = f.opt_bool({"use_grouped_topk"}); grouped && !*grouped) {
      c.n_group = 1;
      c.topk_group = 1;
    }
    CONFIG_CHECK(c.n_group >= 1 && c.num_experts % c.n_group == 0, "'n_group' (", c.n_group,
                 ") must divide num_experts (", c.num_experts, ")");
    CONFIG_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group, "'topk_group' (", c.topk_group,
                 ") must be in 1..n_group (", c.n_group, ")");
    CONFIG_CHECK(c.num_experts_per_tok <= c.topk_group * (c.num_experts / c.n_group),
                 "'num_experts_per_token' exceeds the experts of the kept groups");
    c.routed_scaling_factor = f.opt_double({"routed_scaling_factor"}).value_or(1.0);
    c.norm_topk_prob = f.opt_bool({"moe_renormalize", "norm_topk_prob"}).value_or(true);
    if (auto act_fn = f.opt_string({"moe_router_activation_func", "scoring_func"});
        act_fn && *act_fn != "sigmoid")
      HYSERVE_THROW(ConfigError, "router activation '", *act_fn, "' is not supported (sigmoid)");
    if (auto method = f.opt_string({"topk_method"}); method && *method != "noaux_tc")
      HYSERVE_THROW(ConfigError, "config field 'topk_method' = \"", *method,
                    "\" is not supported (noaux_tc: the bias-corrected selection)");
    // The latent MoE (K3.md §3.5).
    if (auto latent = f.opt_int({"routed_expert_hidden_size"})) {
      CONFIG_CHECK(*latent >= 1, "'routed_expert_hidden_size' must be positive, got ", *latent);
      c.moe_latent_size = *latent;
    }
    c.moe_latent_norm = f.opt_bool({"latent_moe_use_norm"}).value_or(false);
    CONFIG_CHECK(!c.moe_latent_norm || c.moe_latent_size > 0,
                 "'latent_moe_use_norm' needs 'routed_expert_hidden_size' (the latent it norms)");
  }
}

// MLA: heads and the latent ranks, the output gate and RoPE.
void parse_mla(const Fields& f, ModelConfig& c) {
  if (f.find({"mla_output_gate"}))
    HYSERVE_THROW(ConfigError,
                  "config field 'mla_output_gate' is not a published field: Kimi K3 names the "
                  "MLA output gate 'mla_use_output_gate'");
  if (c.num_mla_layers() > 0) {
    c.num_attention_heads = f.positive({"num_attention_heads"}, "MLA heads");
    c.q_lora_rank = f.opt_int({"q_lora_rank"}).value_or(0);
    CONFIG_CHECK(c.q_lora_rank >= 0, "'q_lora_rank' must be >= 0 or null");
    c.kv_lora_rank = f.positive({"kv_lora_rank"}, "MLA latent width");
    c.qk_nope_head_dim = f.positive({"qk_nope_head_dim"}, "MLA no-rope head dim");
    c.qk_rope_head_dim = f.positive({"qk_rope_head_dim"}, "MLA rope head dim");
    c.v_head_dim = f.positive({"v_head_dim"}, "MLA value head dim");
    if (auto kvh = f.opt_int({"num_key_value_heads"}))
      CONFIG_CHECK(*kvh == c.num_attention_heads, "'num_key_value_heads' (", *kvh,
                   ") must equal num_attention_heads (", c.num_attention_heads, ") for MLA");
    c.mla_output_gate = f.opt_bool({"mla_use_output_gate"}).value_or(false);
    if (c.mla_output_gate && is_deepseek_family(c.model_type))
      HYSERVE_THROW(ConfigError, "'mla_use_output_gate' is a Kimi K3 field, not ",
                    c.model_type_name, "'s");
    parse_rope(f, c);
  } else {
    f.find({"mla_use_output_gate", "mla_use_nope", "rope_theta", "rope_scaling"});
  }
}

// The DSA indexer: all three fields or none, at top level (DeepSeek-V3.2) or in Kimi K3.1
// Pro's dsa_config block (K3.md §6), whose layer list must be the full-attention layers.
void parse_dsa(const Fields& f, ModelConfig& c) {
  const bool any_mla = c.num_mla_layers() > 0;
  const json* dsa = f.find({"dsa_config"});
  const json empty = json::object();
  if (dsa) CONFIG_CHECK(dsa->is_object(), "'dsa_config' must be an object");
  const Fields df(dsa ? *dsa : empty);
  auto ih = f.opt_int({"index_n_heads"});
  auto id = f.opt_int({"index_head_dim"});
  auto ik = f.opt_int({"index_topk"});
  if (dsa) {
    CONFIG_CHECK(!(ih || id || ik),
                 "config sets 'index_*' fields both at top level and in 'dsa_config'");
    ih = df.opt_int({"index_n_heads"});
    id = df.opt_int({"index_head_dim"});
    ik = df.opt_int({"index_topk"});
    if (!(ih && id && ik))
      HYSERVE_THROW(ConfigError,
                    "'dsa_config' needs 'index_n_heads', 'index_head_dim' and 'index_topk'");
    if (const json* layers = df.find({"layers"})) {
      CONFIG_CHECK(layers->is_array(), "'dsa_config.layers' must be a list of layer numbers");
      std::vector<int64_t> listed, full;
      for (const json& e : *layers) {
        CONFIG_CHECK(e.is_number_integer(), "'dsa_config.layers' holds ", e.dump());
        listed.push_back(e.get<int64_t>());
      }
      for (int64_t i = 0; i < c.num_hidden_layers; ++i)
        if (c.layer_kinds[i] == LayerKind::kMla) full.push_back(i + 1);
      std::sort(listed.begin(), listed.end());
      CONFIG_CHECK(listed == full,
                   "'dsa_config.layers' (1-based) must list exactly the full-attention layers: "
                   "hyserve runs the indexer on every MLA layer or on none");
    }
  }
  if (ih || id || ik) {
    if (!(ih && id && ik))
      HYSERVE_THROW(ConfigError,
                    "config sets only some of 'index_n_heads', 'index_head_dim', "
                    "'index_topk' (all three or none)");
    CONFIG_CHECK(c.model_type != ModelType::kKimiLinear,
                 "kimi_linear has no DSA indexer ('index_*' fields)");
    CONFIG_CHECK(c.model_type != ModelType::kDeepseekV3, c.model_type_name,
                 " has no DSA indexer, but the config sets 'index_*' fields (DeepSeek-V3.2 "
                 "with the indexer is model_type deepseek_v32)");
    CONFIG_CHECK(any_mla, "the DSA indexer ('index_*' fields) needs full-attention layers");
    c.index_n_heads = *ih;
    c.index_head_dim = *id;
    c.index_topk = *ik;
    CONFIG_CHECK(c.index_n_heads > 0, "'index_n_heads' must be positive");
    CONFIG_CHECK(is_power_of_two(c.index_head_dim), "'index_head_dim' must be a power of two (",
                 "the Hadamard rotation), got ", c.index_head_dim);
    CONFIG_CHECK(c.index_topk > 0, "'index_topk' must be positive");
    if (c.model_type == ModelType::kDeepseekV32) {
      c.index_rope_dims = c.qk_rope_head_dim;
      CONFIG_CHECK(c.index_rope_dims <= c.index_head_dim,
                   "qk_rope_head_dim exceeds index_head_dim");
    } else {
      // Kimi K3.1 Pro: the dsa_config declares no eps; llama.cpp, the one published
      // implementation, takes rms_norm_eps (docs/DECISIONS.md).
      c.index_k_norm_eps = df.opt_double({"index_k_norm_eps"}).value_or(c.rms_norm_eps);
    }
  } else if (c.model_type == ModelType::kDeepseekV32) {
    HYSERVE_THROW(ConfigError,
                  "deepseek_v32 config is missing 'index_n_heads', 'index_head_dim', 'index_topk'");
  }
}

// KDA: heads, head dim, the short convolution and the gate, at top level or in
// linear_attn_config.
void parse_kda(const Fields& f, ModelConfig& c) {
  const json empty = json::object();
  const json* la = f.find({"linear_attn_config"});
  const Fields lf(la && la->is_object() ? *la : empty);
  if (c.num_kda_layers() > 0) {
    CONFIG_CHECK(!is_deepseek_family(c.model_type), c.model_type_name,
                 " has no linear-attention layers");
    auto heads = f.opt_int({"linear_num_heads"});
    if (!heads) heads = lf.opt_int({"num_heads"});
    auto dim = f.opt_int({"linear_head_dim"});
    if (!dim) dim = lf.opt_int({"head_dim"});
    auto conv = f.opt_int({"linear_conv_kernel_dim"});
    if (!conv) conv = lf.opt_int({"short_conv_kernel_size"});
    if (!heads)
      HYSERVE_THROW(ConfigError,
                    "config is missing 'linear_num_heads' (or linear_attn_config.num_heads)");
    if (!dim)
      HYSERVE_THROW(ConfigError,
                    "config is missing 'linear_head_dim' (or linear_attn_config.head_dim)");
    c.linear_num_heads = *heads;
    c.linear_head_dim = *dim;
    c.linear_conv_kernel = conv.value_or(4);
    CONFIG_CHECK(c.linear_num_heads > 0, "'linear_num_heads' must be positive");
    CONFIG_CHECK(c.linear_head_dim > 0, "'linear_head_dim' must be positive");
    CONFIG_CHECK(c.linear_conv_kernel >= 1, "'linear_conv_kernel_dim' must be >= 1");
    if (auto lb = lf.opt_double({"gate_lower_bound"})) {
      CONFIG_CHECK(*lb < 0 && std::isfinite(*lb),
                   "'linear_attn_config.gate_lower_bound' must be negative, got ", *lb);
      c.kda_gate_lower_bound = *lb;
    }
    c.kda_full_rank_gate = lf.opt_bool({"use_full_rank_gate"}).value_or(false);
  }
}

// Marks the fields hyserve knows that this config's layers happen not to use as read.
void mark_known_fields(const Fields& f) {
  f.find({"intermediate_size",
          "first_k_dense_replace",
          "moe_intermediate_size",
          "num_experts_per_token",
          "num_experts_per_tok",
          "num_shared_experts",
          "n_shared_experts",
          "num_expert_group",
          "n_group",
          "topk_group",
          "routed_scaling_factor",
          "moe_renormalize",
          "norm_topk_prob",
          "moe_router_activation_func",
          "scoring_func",
          "topk_method",
          "use_grouped_topk",
          "routed_expert_hidden_size",
          "latent_moe_use_norm",
          "num_attention_heads",
          "num_key_value_heads",
          "q_lora_rank",
          "kv_lora_rank",
          "qk_nope_head_dim",
          "qk_rope_head_dim",
          "v_head_dim",
          "mla_use_nope",
          "rope_interleave",
          "linear_num_heads",
          "linear_head_dim",
          "linear_conv_kernel_dim",
          "activation_situ_beta",
          "activation_situ_linear_beta",
          "quantization_config"});
}

}  // namespace

void parse_text_config(const json& j, const Fields& f, ModelConfig& c) {
  parse_basics(f, c);
  parse_activation(f, c);
  c.layer_kinds = parse_layer_kinds(j, f, c.model_type, c.num_hidden_layers);
  parse_moe(f, c);
  parse_mla(f, c);
  parse_dsa(f, c);
  parse_kda(f, c);
  mark_known_fields(f);
  parse_quantization(f, c);
  if (c.expert_format == ExpertFormat::kMxfp4 || c.expert_format == ExpertFormat::kInt4) {
    CONFIG_CHECK(c.expert_hidden_size() % 32 == 0 && c.moe_intermediate_size % 32 == 0,
                 c.expert_format == ExpertFormat::kInt4 ? "INT4" : "MXFP4",
                 " experts need their input and output widths (", c.expert_hidden_size(), ", ",
                 c.moe_intermediate_size, ") to be multiples of 32");
  }
}

}  // namespace hyserve::config_detail
