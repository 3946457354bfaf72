// ModelConfig (model/config.h): the model_type, the multimodal wrappers (text_config), the
// report of the fields nobody read, and loading; the per-section field readers are in
// config_parse.cpp and config_quantization.cpp (model/config_fields.h).
#include "model/config.h"

#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "model/config_fields.h"
#include "util/error.h"

namespace hyserve {
namespace {

using config_detail::Fields;
using config_detail::parse_quantization;
using config_detail::parse_text_config;
using nlohmann::json;

// Fields every Hugging Face config carries that do not change the forward pass
// (generation defaults, training-only settings, bookkeeping), and derived or unused
// geometry (head_dim, qk_head_dim: recomputed; num_nextn_predict_layers: MTP layers,
// not part of the main model's forward).
bool is_boilerplate_field(const std::string& name) {
  static const std::set<std::string> kFields = {"_name_or_path",
                                                "add_cross_attention",
                                                "architectures",
                                                "attention_dropout",
                                                "auto_map",
                                                "aux_loss_alpha",
                                                "bad_words_ids",
                                                "begin_suppress_tokens",
                                                "chunk_size_feed_forward",
                                                "cross_attention_hidden_size",
                                                "decoder_start_token_id",
                                                "diversity_penalty",
                                                "do_sample",
                                                "dtype",
                                                "early_stopping",
                                                "encoder_no_repeat_ngram_size",
                                                "ep_size",
                                                "exponential_decay_length_penalty",
                                                "finetuning_task",
                                                "forced_bos_token_id",
                                                "forced_eos_token_id",
                                                "head_dim",
                                                "id2label",
                                                "ignore_index",
                                                "initializer_range",
                                                "is_decoder",
                                                "is_encoder_decoder",
                                                "label2id",
                                                "length_penalty",
                                                "max_length",
                                                "min_length",
                                                "no_repeat_ngram_size",
                                                "num_beam_groups",
                                                "num_beams",
                                                "num_nextn_predict_layers",
                                                "num_return_sequences",
                                                "output_attentions",
                                                "output_hidden_states",
                                                "output_router_logits",
                                                "output_scores",
                                                "pad_token_id",
                                                "prefix",
                                                "pretraining_tp",
                                                "problem_type",
                                                "pruned_heads",
                                                "qk_head_dim",
                                                "remove_invalid_values",
                                                "repetition_penalty",
                                                "return_dict",
                                                "return_dict_in_generate",
                                                "router_aux_loss_coef",
                                                "seq_aux",
                                                "sep_token_id",
                                                "suppress_tokens",
                                                "task_specific_params",
                                                "temperature",
                                                "tf_legacy_loss",
                                                "tie_encoder_decoder",
                                                "tokenizer_class",
                                                "top_k",
                                                "top_p",
                                                "torch_dtype",
                                                "torchscript",
                                                "transformers_version",
                                                "typical_p",
                                                "use_bfloat16",
                                                "use_cache"};
  return kFields.count(name) > 0;
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
    case ModelType::kDeepseekV3:
      return "deepseek_v3";
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

CacheSpec ModelConfig::cache_spec() const {
  CHECK(num_hidden_layers == static_cast<int64_t>(layer_kinds.size()),
        "layer_kinds must have num_hidden_layers entries");
  CacheSpec spec;
  for (LayerKind k : layer_kinds)
    spec.layers.push_back(k == LayerKind::kKda ? CacheLayerKind::kKda
                                               : CacheLayerKind::kFullAttention);
  spec.kv_lora_rank = kv_lora_rank;
  spec.qk_rope_head_dim = qk_rope_head_dim;
  spec.index_head_dim = has_indexer() ? index_head_dim : 0;
  spec.kda_num_heads = linear_num_heads;
  spec.kda_head_dim = linear_head_dim;
  spec.kda_conv_kernel = linear_conv_kernel;
  return spec;
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
  ModelConfig c;
  std::set<std::string> used_top;
  const Fields top(j, &used_top);
  const auto type = top.opt_string({"model_type"});
  if (!type) HYSERVE_THROW(ConfigError, "config is missing required field 'model_type'");
  c.model_type_name = *type;
  if (*type == "kimi_k3") {
    c.model_type = ModelType::kKimiK3;
  } else if (*type == "kimi_linear") {
    c.model_type = ModelType::kKimiLinear;
  } else if (*type == "deepseek_v32") {
    c.model_type = ModelType::kDeepseekV32;
  } else if (*type == "deepseek_v3" || *type == "kimi_k2" || *type == "kimi_k25") {
    c.model_type = ModelType::kDeepseekV3;
  } else {
    HYSERVE_THROW(ConfigError, "config field 'model_type' = \"", *type,
                  "\" is not supported (kimi_k3, kimi_linear, deepseek_v32, deepseek_v3, "
                  "kimi_k2, kimi_k25)");
  }

  // The multimodal wrappers, Kimi K3's (K3.md §1) and Kimi K2.5's: the text model's
  // fields under text_config, its tensors under language_model., a vision tower beside.
  const bool kimi_k25 = *type == "kimi_k25";
  const json* text = top.find({"text_config"});
  std::string where;  // prefix of the text fields' names in messages
  std::set<std::string> used;
  if (kimi_k25 && !text)
    HYSERVE_THROW(ConfigError,
                  "kimi_k25 config is missing 'text_config' (Kimi K2.5 nests its text model "
                  "there)");
  if (text) {
    CONFIG_CHECK(c.model_type == ModelType::kKimiK3 || kimi_k25,
                 "'text_config' (a multimodal wrapper) is read for kimi_k3 and kimi_k25 only, "
                 "not ",
                 c.model_type_name);
    CONFIG_CHECK(text->is_object(), "'text_config' must be an object");
    c.tensor_prefix = "language_model.";
    where = "text_config.";
    const Fields tf(*text, &used);
    const auto tt = tf.opt_string({"model_type"});
    if (kimi_k25 && tt && *tt != "kimi_k2" && *tt != "deepseek_v3")
      HYSERVE_THROW(ConfigError, "config field 'text_config.model_type' = \"", *tt,
                    "\": a kimi_k25 text model is \"kimi_k2\" (DeepSeek-V3's architecture)");
    if (!kimi_k25 && tt && *tt != "kimi_linear" && *tt != "kimi_k3")
      HYSERVE_THROW(ConfigError, "config field 'text_config.model_type' = \"", *tt,
                    "\": a kimi_k3 text model is \"kimi_linear\"");
  }
  c.has_vision = top.find({"vision_config"}) != nullptr;
  const json& tj = text ? *text : j;
  const Fields f(tj, &used);
  try {
    parse_text_config(tj, f, c);
  } catch (const ConfigError& e) {
    // Name the nested field as it appears in the file.
    if (!text) throw;
    throw ConfigError(std::string("in 'text_config': ") + e.what());
  }
  // A wrapper may declare its quantization beside text_config rather than in it.
  if (text && !f.find({"quantization_config"})) parse_quantization(top, c);

  // Report what nobody read.
  const auto report = [&](const json& obj, const std::set<std::string>& read,
                          const std::string& prefix) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (read.count(it.key()) || is_boilerplate_field(it.key())) continue;
      c.unknown_fields.push_back(prefix + it.key());
    }
  };
  if (!text) used.insert(used_top.begin(), used_top.end());  // one object: read at either level
  report(tj, used, where);
  if (text) {
    used_top.insert({"text_config", "vision_config", "media_placeholder_token_id",
                     "image_placeholder", "video_placeholder", "use_unified_vision_chunk",
                     "bos_token_id", "eos_token_id", "tie_word_embeddings", "quantization_config"});
    report(j, used_top, "");
  }
  if (const json* la = f.find({"linear_attn_config"}); la && la->is_object()) {
    static const std::set<std::string> kRead = {
        "kda_layers",       "full_attn_layers",  "num_heads", "head_dim", "short_conv_kernel_size",
        "gate_lower_bound", "use_full_rank_gate"};
    report(*la, kRead, where + "linear_attn_config.");
  }
  if (const json* dsa = f.find({"dsa_config"}); dsa && dsa->is_object()) {
    static const std::set<std::string> kRead = {"index_n_heads", "index_head_dim", "index_topk",
                                                "layers", "index_k_norm_eps"};
    report(*dsa, kRead, where + "dsa_config.");
  }
  return c;
}

std::string ModelConfig::unknown_fields_warning() const {
  if (unknown_fields.empty()) return "";
  std::string s = "config fields hyserve does not know (not read; they should not change the " +
                  model_type_name + " forward pass):";
  for (size_t i = 0; i < unknown_fields.size(); ++i) s += (i == 0 ? " " : ", ") + unknown_fields[i];
  return s;
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
