#include "model/config.h"

#include <cmath>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::json;

#define CONFIG_CHECK(cond, ...) CHECK_AS(::hyserve::ConfigError, cond, __VA_ARGS__)

// Reads config fields under any of their spellings; every error names the field.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  const json* find(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      auto it = j_.find(n);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  std::optional<int64_t> opt_int(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) {
      if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())
        return static_cast<int64_t>(v->get<double>());
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be an integer, got ",
                    v->dump());
    }
    return v->get<int64_t>();
  }

  int64_t req_int(std::initializer_list<const char*> names, const char* why) const {
    auto v = opt_int(names);
    if (!v)
      HYSERVE_THROW(ConfigError, "config is missing required field '", *names.begin(), "' (", why,
                    ")");
    return *v;
  }

  int64_t positive(std::initializer_list<const char*> names, const char* why) const {
    const int64_t v = req_int(names, why);
    if (v <= 0)
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be positive, got ", v);
    return v;
  }

  std::optional<double> opt_double(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_number())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be a number, got ",
                    v->dump());
    return v->get<double>();
  }

  std::optional<bool> opt_bool(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be true or false, got ",
                    v->dump());
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (!v) return std::nullopt;
    if (!v->is_string())
      HYSERVE_THROW(ConfigError, "config field '", *names.begin(), "' must be a string, got ",
                    v->dump());
    return v->get<std::string>();
  }

 private:
  const json& j_;
};

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
      if (s == "linear_attention") {
        kinds.push_back(LayerKind::kKda);
      } else if (s == "full_attention" || s == "indexed_attention") {
        kinds.push_back(LayerKind::kMla);
      } else {
        HYSERVE_THROW(ConfigError, "config field 'layer_types[", i, "]' has unknown value ",
                      e.dump(), " (expected \"linear_attention\" or \"full_attention\")");
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
  if (type == ModelType::kDeepseekV32) return std::vector<LayerKind>(num_layers, LayerKind::kMla);
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
  for (int64_t i = 0; i < num_layers; ++i)
    kinds.push_back(i < *first_dense ? MlpKind::kDense : MlpKind::kMoe);
  return kinds;
}

void parse_rope(const Fields& f, ModelConfig& c) {
  if (c.model_type != ModelType::kDeepseekV32) {
    // kimi_linear and kimi_k3 are NoPE: the rope dims exist but nothing rotates.
    if (auto nope = f.opt_bool({"mla_use_nope"}); nope && !*nope)
      HYSERVE_THROW(ConfigError, "config field 'mla_use_nope' is false, but ", c.model_type_name,
                    " MLA is NoPE in hyserve");
    return;
  }
  c.rope.enabled = true;
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

void parse_quantization(const Fields& f, ModelConfig& c) {
  const json* q = f.find({"quantization_config"});
  if (!q) return;
  CONFIG_CHECK(q->is_object(), "'quantization_config' must be an object");
  const Fields qf(*q);
  const auto method = qf.opt_string({"quant_method"});
  if (!method) HYSERVE_THROW(ConfigError, "config is missing 'quantization_config.quant_method'");
  if (*method == "mxfp4") {
    c.expert_format = ExpertFormat::kMxfp4;
  } else if (*method == "fp8") {
    if (const json* b = qf.find({"weight_block_size"})) {
      CONFIG_CHECK(*b == json::array({128, 128}),
                   "'quantization_config.weight_block_size' must be [128, 128], got ", b->dump());
    }
    c.fp8_block_weights = true;
    c.expert_format = ExpertFormat::kFp8Block;
  } else {
    HYSERVE_THROW(ConfigError, "config field 'quantization_config.quant_method' = \"", *method,
                  "\" is not supported (mxfp4 or fp8)");
  }
}

bool is_power_of_two(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

}  // namespace

const char* model_type_name(ModelType t) {
  switch (t) {
    case ModelType::kKimiK3:
      return "kimi_k3";
    case ModelType::kKimiLinear:
      return "kimi_linear";
    case ModelType::kDeepseekV32:
      return "deepseek_v32";
  }
  return "?";
}

int64_t ModelConfig::num_kda_layers() const {
  int64_t n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::kKda;
  return n;
}

int64_t ModelConfig::num_mla_layers() const {
  return static_cast<int64_t>(layer_kinds.size()) - num_kda_layers();
}

double ModelConfig::mla_softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.enabled && rope.yarn && rope.mscale_all_dim > 0 && rope.factor > 1.0) {
    const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

ModelConfig ModelConfig::from_json(const json& j) {
  CONFIG_CHECK(j.is_object(), "config.json must hold a JSON object");
  const Fields f(j);
  ModelConfig c;
  const auto type = f.opt_string({"model_type"});
  if (!type) HYSERVE_THROW(ConfigError, "config is missing required field 'model_type'");
  c.model_type_name = *type;
  if (*type == "kimi_k3") {
    c.model_type = ModelType::kKimiK3;
  } else if (*type == "kimi_linear") {
    c.model_type = ModelType::kKimiLinear;
  } else if (*type == "deepseek_v32") {
    c.model_type = ModelType::kDeepseekV32;
  } else {
    HYSERVE_THROW(ConfigError, "config field 'model_type' = \"", *type,
                  "\" is not supported (kimi_k3, kimi_linear, deepseek_v32)");
  }

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

  c.layer_kinds = parse_layer_kinds(j, f, c.model_type, c.num_hidden_layers);

  // MoE.
  c.num_experts = f.opt_int({"num_experts", "n_routed_experts", "num_local_experts"}).value_or(0);
  CONFIG_CHECK(c.num_experts >= 0, "'num_experts' must be >= 0");
  c.mlp_kinds = parse_mlp_kinds(f, c.num_hidden_layers, c.num_experts);
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
    CONFIG_CHECK(c.n_group >= 1 && c.num_experts % c.n_group == 0, "'n_group' (", c.n_group,
                 ") must divide num_experts (", c.num_experts, ")");
    CONFIG_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group, "'topk_group' (", c.topk_group,
                 ") must be in 1..n_group (", c.n_group, ")");
    CONFIG_CHECK(c.num_experts_per_tok <= c.topk_group * (c.num_experts / c.n_group),
                 "'num_experts_per_token' exceeds the experts of the kept groups");
    c.routed_scaling_factor = f.opt_double({"routed_scaling_factor"}).value_or(1.0);
    c.norm_topk_prob = f.opt_bool({"moe_renormalize", "norm_topk_prob"}).value_or(true);
    if (auto act = f.opt_string({"moe_router_activation_func", "scoring_func"});
        act && *act != "sigmoid")
      HYSERVE_THROW(ConfigError, "router activation '", *act, "' is not supported (sigmoid)");
  }

  // MLA.
  const bool any_mla = c.num_mla_layers() > 0;
  if (any_mla) {
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
    c.mla_output_gate = f.opt_bool({"mla_output_gate"}).value_or(false);
    if (c.mla_output_gate && c.model_type != ModelType::kKimiK3)
      HYSERVE_THROW(ConfigError, "'mla_output_gate' is a kimi_k3 field");
    parse_rope(f, c);
  }

  // DSA indexer: all three fields or none.
  const auto ih = f.opt_int({"index_n_heads"});
  const auto id = f.opt_int({"index_head_dim"});
  const auto ik = f.opt_int({"index_topk"});
  if (ih || id || ik) {
    if (!(ih && id && ik))
      HYSERVE_THROW(ConfigError,
                    "config sets only some of 'index_n_heads', 'index_head_dim', "
                    "'index_topk' (all three or none)");
    CONFIG_CHECK(c.model_type != ModelType::kKimiLinear,
                 "kimi_linear has no DSA indexer ('index_*' fields)");
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
    }
  } else if (c.model_type == ModelType::kDeepseekV32) {
    HYSERVE_THROW(ConfigError,
                  "deepseek_v32 config is missing 'index_n_heads', 'index_head_dim', 'index_topk'");
  }

  // KDA.
  if (c.num_kda_layers() > 0) {
    CONFIG_CHECK(c.model_type != ModelType::kDeepseekV32,
                 "deepseek_v32 has no linear-attention layers");
    const json* la = f.find({"linear_attn_config"});
    const json empty = json::object();
    const Fields lf(la && la->is_object() ? *la : empty);
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
  }

  parse_quantization(f, c);
  if (c.expert_format == ExpertFormat::kMxfp4) {
    CONFIG_CHECK(c.hidden_size % 32 == 0 && c.moe_intermediate_size % 32 == 0,
                 "MXFP4 experts need hidden_size and moe_intermediate_size multiples of 32");
  }
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) file = path / "config.json";
  std::ifstream in(file);
  if (!in) HYSERVE_THROW(ConfigError, "cannot open ", file.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    HYSERVE_THROW(ConfigError, file.string(), ": invalid JSON: ", e.what());
  }
  try {
    return from_json(j);
  } catch (const ConfigError& e) {
    throw ConfigError(file.string() + ": " + e.what());
  }
}

}  // namespace hyserve
