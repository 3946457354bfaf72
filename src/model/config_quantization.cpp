// quantization_config of a checkpoint's config.json (model/config_fields.h): fp8 blocks,
// MXFP4, or compressed-tensors W4A16 experts; anything else is refused naming the field.
#include <optional>
#include <string>

#include "model/config_fields.h"

namespace hyserve::config_detail {
namespace {

// compressed-tensors, weight-only, 4 bits in groups of 32 along the input, for the routed
// experts, in one of two formats (every group the same):
//   "mxfp4-pack-quantized"  the published Kimi K3 (K3.md §4.3): e2m1 codes two per byte,
//                           one e8m0 scale per 32 inputs                     -> kMxfp4
//   "pack-quantized"        Kimi K2 Thinking / K2.5: symmetric int4 q in [-8, 7], stored
//                           q + 8 eight per int32, one float scale per 32    -> INT4
// Anything else (other bit widths, group sizes, zero points, activation or KV-cache
// quantization, reordered groups) changes the math and is refused, naming the field.
void parse_compressed_tensors(const json& q, ModelConfig& c) {
  const Fields qf(q);
  if (auto status = qf.opt_string({"quantization_status"}); status && *status != "compressed")
    HYSERVE_THROW(ConfigError, "'quantization_config.quantization_status' = \"", *status,
                  "\" (only compressed checkpoints are read)");
  if (const json* kv = qf.find({"kv_cache_scheme"}))
    HYSERVE_THROW(ConfigError, "'quantization_config.kv_cache_scheme' = ", kv->dump(),
                  ": KV-cache quantization is not implemented");
  const json* groups = qf.find({"config_groups"});
  CONFIG_CHECK(groups && groups->is_object() && !groups->empty(),
               "compressed-tensors 'quantization_config' needs 'config_groups'");
  const auto top_format = qf.opt_string({"format"});
  std::optional<std::string> seen_format;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string name = "quantization_config.config_groups." + it.key();
    CONFIG_CHECK(it->is_object(), "'", name, "' must be an object");
    const Fields g(*it);
    const std::string format = g.opt_string({"format"}).value_or(top_format.value_or(""));
    if (format != "mxfp4-pack-quantized" && format != "pack-quantized")
      HYSERVE_THROW(ConfigError, "'", name, ".format' = \"", format,
                    "\" is not supported (mxfp4-pack-quantized, pack-quantized)");
    if (seen_format && *seen_format != format)
      HYSERVE_THROW(ConfigError, "'", name, ".format' = \"", format, "\" but another group is \"",
                    *seen_format, "\" (experts in one format only)");
    seen_format = format;
    for (const char* key : {"input_activations", "output_activations"}) {
      if (const json* a = g.find({key}))
        HYSERVE_THROW(ConfigError, "'", name, ".", key, "' = ", a->dump(),
                      ": activation quantization is not implemented (weight-only W4A16)");
    }
    const json* w = g.find({"weights"});
    CONFIG_CHECK(w && w->is_object(), "'", name, ".weights' must be an object");
    const Fields wf(*w);
    const auto bits = wf.opt_int({"num_bits"});
    const auto type = wf.opt_string({"type"});
    const auto group = wf.opt_int({"group_size"});
    const auto strategy = wf.opt_string({"strategy"});
    if (format == "mxfp4-pack-quantized") {
      if (bits != 4 || type != "float" || group != 32 || (strategy && *strategy != "group"))
        HYSERVE_THROW(ConfigError, "'", name, ".weights' = ", w->dump(),
                      ": only 4-bit float (e2m1) weights in groups of 32 are supported");
      if (auto sym = wf.opt_bool({"symmetric"}); sym && !*sym)
        HYSERVE_THROW(ConfigError, "'", name, ".weights.symmetric' is false (zero points)");
    } else {
      const std::string at = "'" + name + ".weights.";
      if (bits != 4)
        HYSERVE_THROW(ConfigError, at, "num_bits' = ", bits ? std::to_string(*bits) : "absent",
                      ": pack-quantized experts must be 4-bit (int4)");
      if (type != "int")
        HYSERVE_THROW(ConfigError, at, "type' = ", type.value_or("absent"),
                      ": pack-quantized experts must be \"int\"");
      if (strategy != "group")
        HYSERVE_THROW(ConfigError, at, "strategy' = ", strategy.value_or("absent"),
                      ": only \"group\" (one scale per group of inputs) is supported");
      if (group != 32)
        HYSERVE_THROW(ConfigError, at, "group_size' = ", group ? std::to_string(*group) : "absent",
                      ": only groups of 32 are supported");
      if (wf.opt_bool({"symmetric"}) != true)
        HYSERVE_THROW(ConfigError, at,
                      "symmetric' is not true: zero points (asymmetric int4) are not implemented");
      if (wf.opt_bool({"dynamic"}).value_or(false))
        HYSERVE_THROW(ConfigError, at, "dynamic' is true: weights must be stored quantized");
      if (const json* order = wf.find({"actorder"}))
        HYSERVE_THROW(ConfigError, at, "actorder' = ", order->dump(),
                      ": reordered groups (weight_g_idx) are not implemented");
    }
  }
  if (*seen_format == "pack-quantized") {
    c.expert_format = ExpertFormat::kInt4;
  } else {
    c.expert_format = ExpertFormat::kMxfp4;
  }
}

}  // namespace

void parse_quantization(const Fields& f, ModelConfig& c) {
  const json* q = f.find({"quantization_config"});
  if (!q) return;
  CONFIG_CHECK(q->is_object(), "'quantization_config' must be an object");
  const Fields qf(*q);
  const auto method = qf.opt_string({"quant_method"});
  if (!method) HYSERVE_THROW(ConfigError, "config is missing 'quantization_config.quant_method'");
  if (*method == "mxfp4") {
    c.expert_format = ExpertFormat::kMxfp4;
  } else if (*method == "compressed-tensors") {
    parse_compressed_tensors(*q, c);
  } else if (*method == "fp8") {
    if (const json* b = qf.find({"weight_block_size"})) {
      CONFIG_CHECK(*b == json::array({128, 128}),
                   "'quantization_config.weight_block_size' must be [128, 128], got ", b->dump());
    }
    c.fp8_block_weights = true;
    c.expert_format = ExpertFormat::kFp8Block;
  } else {
    HYSERVE_THROW(ConfigError, "config field 'quantization_config.quant_method' = \"", *method,
                  "\" is not supported (mxfp4, fp8, compressed-tensors)");
  }
}

}  // namespace hyserve::config_detail
