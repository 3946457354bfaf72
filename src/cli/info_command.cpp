// `hyserve info [PATH] [--json]`: what a checkpoint is, from its config alone: the
// layers by kind, parameter counts, and cache bytes per token for every cache
// dtype combination.
#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "kv/cache_format.h"
#include "kv/cache_plan.h"
#include "kv/memory_plan.h"
#include "model/attention_backend.h"
#include "model/config.h"
#include "model/param_count.h"
#include "model/weight_bytes.h"
#include "util/error.h"
#include "util/format.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

std::string human(int64_t v) {
  char buf[32];
  const double d = static_cast<double>(v);
  if (d >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.2fT", d / 1e12);
  } else if (d >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.1fB", d / 1e9);
  } else if (d >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1fM", d / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  }
  return buf;
}

// "0-2, 4-6, 8" for the layers whose kind matches.
std::string ranges(const std::vector<bool>& pick) {
  std::string out;
  const int64_t n = static_cast<int64_t>(pick.size());
  for (int64_t i = 0; i < n;) {
    if (!pick[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j + 1 < n && pick[j + 1]) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kBf16:
      return "bf16";
    case ExpertFormat::kFp8Block:
      return "fp8 128x128 blocks";
    case ExpertFormat::kMxfp4:
      return "mxfp4";
    case ExpertFormat::kInt4:
      return "int4 (groups of 32)";
  }
  return "?";
}

struct PlanArgs {
  std::string gpu_memory;  // e.g. "141GB"; empty: no plan
  int64_t tp = 1;
  int64_t dcp = 1;
  std::string kv_cache_dtype = "auto";  // as serve
  std::string index_cache_dtype = "fp8";
  std::string attention_backend = "auto";
  double gpu_memory_utilization = 0.9;
  std::string reserve = "8GiB";
};

// "141GB", "141GiB", "1.5TB", "123456" (bytes).
int64_t parse_bytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    HYSERVE_THROW(InvalidArgument, flag, ": cannot read a size from '", s, "'");
  }
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mult = 1.0;
  if (unit.empty() || unit == "B") {
    mult = 1.0;
  } else if (unit == "KB") {
    mult = 1e3;
  } else if (unit == "MB") {
    mult = 1e6;
  } else if (unit == "GB") {
    mult = 1e9;
  } else if (unit == "TB") {
    mult = 1e12;
  } else if (unit == "KIB") {
    mult = 1024.0;
  } else if (unit == "MIB") {
    mult = 1024.0 * 1024;
  } else if (unit == "GIB") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    HYSERVE_THROW(InvalidArgument, flag, ": unknown unit in '", s,
                  "' (B, KB, MB, GB, TB, KiB, MiB, GiB)");
  }
  CHECK(v >= 0, flag, " must not be negative");
  return static_cast<int64_t>(v * mult);
}

// The MLA layers' attention backend under the flags (as serve and the model choose it), or
// none for a model without MLA layers.
std::optional<AttentionChoice> attention_choice(const ModelConfig& c, const PlanArgs& a) {
  const AttentionBackend requested = parse_attention_backend(a.attention_backend);
  if (c.num_mla_layers() == 0) return std::nullopt;
  AttentionInputs in;
  in.latent_cache =
      resolve_latent_cache_dtype(parse_latent_cache_dtype(a.kv_cache_dtype), c.cache_spec());
  in.indexer_fp8 = parse_index_cache_dtype(a.index_cache_dtype) == IndexCacheDtype::kFp8;
  in.dcp_size = static_cast<int>(a.dcp);
  in.requested = requested;
  return choose_attention_backend(c, in);
}

void print_plan(const ModelConfig& c, const PlanArgs& a) {
  CachePlanOptions o;
  o.latent = resolve_latent_cache_dtype(parse_latent_cache_dtype(a.kv_cache_dtype), c.cache_spec());
  o.index = parse_index_cache_dtype(a.index_cache_dtype);
  o.tp = a.tp;
  o.dcp = a.dcp;
  const CachePlan plan = plan_cache(c.cache_spec(), o);
  MemoryBudget b;
  b.gpu_memory_bytes = parse_bytes(a.gpu_memory, "--gpu-memory");
  CHECK(b.gpu_memory_bytes > 0, "--gpu-memory must be > 0, got '", a.gpu_memory, "'");
  b.gpu_memory_utilization = a.gpu_memory_utilization;
  b.weight_bytes = estimate_weight_bytes_per_gpu(c, a.tp).total();
  b.reserve_bytes = parse_bytes(a.reserve, "--reserve");
  std::printf("%s", format_cache_plan(plan, plan_memory(plan, b)).c_str());
}

// Which layers are of which kind: [num_layers] each.
struct LayerKinds {
  std::vector<bool> kda, mla, dense;
  int64_t num_dense = 0;
};

LayerKinds layer_kinds(const ModelConfig& c) {
  LayerKinds k;
  k.kda.resize(c.num_hidden_layers);
  k.mla.resize(c.num_hidden_layers);
  k.dense.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    k.kda[i] = c.is_kda(i);
    k.mla[i] = !c.is_kda(i);
    k.dense[i] = !c.is_moe(i);
    k.num_dense += k.dense[i];
  }
  return k;
}

struct CacheRow {
  LatentCacheDtype latent;
  IndexCacheDtype index;
  int64_t bytes;
  bool keys = true;  // index keys included (models with an indexer)
};

// Cache bytes per token of every latent and index-key format the model can use.
std::vector<CacheRow> cache_rows(const ModelConfig& c) {
  const std::vector<LatentCacheDtype> latents = {LatentCacheDtype::kBf16, LatentCacheDtype::kFp8,
                                                 LatentCacheDtype::kFp8WithScales,
                                                 LatentCacheDtype::kNvfp4};
  std::vector<IndexCacheDtype> indexes = {IndexCacheDtype::kFp8};
  if (c.has_indexer() && c.index_head_dim % 32 == 0) indexes.push_back(IndexCacheDtype::kMxfp4);
  std::vector<CacheRow> rows;
  const CacheSpec spec = c.cache_spec();
  if (c.num_mla_layers() == 0) return rows;
  for (auto l : latents) {
    if (l == LatentCacheDtype::kFp8WithScales && c.kv_lora_rank % 128 != 0) continue;
    if (l == LatentCacheDtype::kNvfp4 && c.kv_lora_rank % 16 != 0) continue;
    // With an indexer also the latent alone (Kimi K3's cache, without index keys).
    if (c.has_indexer() && l == LatentCacheDtype::kFp8)
      rows.push_back(
          {l, IndexCacheDtype::kFp8, c.num_mla_layers() * latent_bytes_per_token(spec, l), false});
    for (auto ix : indexes) rows.push_back({l, ix, cache_bytes_per_token(spec, l, ix)});
  }
  return rows;
}

void print_json(const std::filesystem::path& path, const ModelConfig& c, const ParamCount& p,
                const LayerKinds& kinds, const std::vector<CacheRow>& rows, int64_t kda_state,
                const std::optional<AttentionChoice>& attention) {
  nlohmann::json j;
  j["path"] = path.string();
  j["attention_backend"] =
      attention ? nlohmann::json(std::string(attention_backend_name(attention->backend))) : nullptr;
  j["model_type"] = c.model_type_name;
  j["num_layers"] = c.num_hidden_layers;
  j["num_kda_layers"] = c.num_kda_layers();
  j["num_mla_layers"] = c.num_mla_layers();
  j["indexer"] = c.has_indexer();
  j["num_dense_mlp_layers"] = kinds.num_dense;
  j["num_moe_layers"] = c.num_hidden_layers - kinds.num_dense;
  j["params_total"] = p.total;
  j["params_active"] = p.active;
  j["kda_state_bytes_per_request"] = kda_state;
  j["attn_res_block_size"] = c.attn_res_block_size;
  j["hidden_act"] = c.situ ? "situ" : "silu";
  j["kda_gate_lower_bound"] = c.kda_gate_lower_bound;
  j["kda_full_rank_gate"] = c.kda_full_rank_gate;
  j["moe_latent_size"] = c.moe_latent_size;
  j["unknown_fields"] = c.unknown_fields;
  nlohmann::json cache = nlohmann::json::array();
  for (const auto& r : rows) {
    cache.push_back(
        {{"latent", latent_cache_dtype_name(r.latent)},
         {"index", c.has_indexer() && r.keys ? index_cache_dtype_name(r.index) : "none"},
         {"bytes_per_token", r.bytes}});
  }
  j["cache"] = cache;
  std::printf("%s\n", j.dump(1).c_str());
}

// The attention layers: which are KDA and MLA, their shapes.
void print_attention(const ModelConfig& c, const LayerKinds& kinds) {
  std::printf("layers: %lld = %lld KDA + %lld %s\n", static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.num_kda_layers()),
              static_cast<long long>(c.num_mla_layers()),
              c.has_indexer() ? "MLA+DSA" : "MLA (dense)");
  std::printf("  KDA: %s\n", ranges(kinds.kda).c_str());
  std::printf("  MLA: %s\n", ranges(kinds.mla).c_str());
  if (c.num_mla_layers() > 0) {
    std::printf("  MLA: %lld heads, q_lora %lld, kv_lora %lld, qk %lld+%lld, v %lld, %s%s\n",
                static_cast<long long>(c.num_attention_heads),
                static_cast<long long>(c.q_lora_rank), static_cast<long long>(c.kv_lora_rank),
                static_cast<long long>(c.qk_nope_head_dim),
                static_cast<long long>(c.qk_rope_head_dim), static_cast<long long>(c.v_head_dim),
                c.rope.enabled ? (c.rope.yarn ? "YaRN RoPE" : "RoPE") : "NoPE",
                c.mla_output_gate ? ", output gate" : "");
  }
  if (c.has_indexer()) {
    std::printf("  indexer: %lld heads x %lld, top-%lld\n", static_cast<long long>(c.index_n_heads),
                static_cast<long long>(c.index_head_dim), static_cast<long long>(c.index_topk));
  }
  if (c.num_kda_layers() > 0) {
    std::printf("  KDA: %lld heads x %lld, conv %lld, %s forget gate, %s output gate\n",
                static_cast<long long>(c.linear_num_heads),
                static_cast<long long>(c.linear_head_dim),
                static_cast<long long>(c.linear_conv_kernel),
                c.kda_gate_lower_bound < 0 ? "bounded" : "softplus",
                c.kda_full_rank_gate ? "full-rank" : "low-rank");
  }
}

// The MLPs (dense and MoE), the activation and the residual stream.
void print_mlp(const ModelConfig& c, const LayerKinds& kinds) {
  std::printf("  MLP: dense %s; MoE %s\n", ranges(kinds.dense).c_str(),
              kinds.num_dense == c.num_hidden_layers ? "none" : "the rest");
  if (kinds.num_dense < c.num_hidden_layers) {
    std::printf(
        "  MoE: %lld experts, %lld active, %lld shared, width %lld, groups %lld/%lld, %s\n",
        static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_tok),
        static_cast<long long>(c.num_shared_experts),
        static_cast<long long>(c.moe_intermediate_size), static_cast<long long>(c.topk_group),
        static_cast<long long>(c.n_group), expert_format_name(c.expert_format));
    if (c.moe_latent_size > 0)
      std::printf("  MoE: latent experts at %lld%s\n", static_cast<long long>(c.moe_latent_size),
                  c.moe_latent_norm ? ", normed before the up-projection" : "");
  }
  std::printf("  activation: %s; residuals: %s\n", c.situ ? "SiTU" : "SiLU",
              c.has_attn_res() ? ("block AttnRes, a snapshot every " +
                                  std::to_string(c.attn_res_block_size) + " layers")
                                     .c_str()
                               : "plain");
}

void print_params(const ParamCount& p) {
  std::printf("parameters: total %s (%s), active %s (%s)\n", human(p.total).c_str(),
              with_commas(p.total).c_str(), human(p.active).c_str(), with_commas(p.active).c_str());
  std::printf(
      "  embeddings %s, MLA %s, KDA %s, dense MLP %s, routed experts %s, router+shared %s, norms "
      "%s\n",
      human(p.embedding).c_str(), human(p.attention_mla).c_str(), human(p.attention_kda).c_str(),
      human(p.dense_mlp).c_str(), human(p.routed_experts).c_str(), human(p.moe_other).c_str(),
      human(p.norms).c_str());
}

void print_cache_rows(const ModelConfig& c, const std::vector<CacheRow>& rows) {
  if (rows.empty()) return;
  std::printf("cache bytes per token (all %lld full-attention layers, per GPU):\n",
              static_cast<long long>(c.num_mla_layers()));
  std::printf("  %-12s %-12s %12s\n", "latent", "index keys", "bytes/token");
  for (const auto& r : rows) {
    std::printf(
        "  %-12s %-12s %12s\n", std::string(latent_cache_dtype_name(r.latent)).c_str(),
        c.has_indexer() && r.keys ? std::string(index_cache_dtype_name(r.index)).c_str() : "-",
        with_commas(r.bytes).c_str());
  }
}

int run_info(const std::string& path_arg, bool as_json, const PlanArgs& plan_args) {
  const std::filesystem::path path =
      path_arg.empty() ? default_model_dir() : std::filesystem::path(path_arg);
  const ModelConfig c = ModelConfig::load(path);
  if (const std::string w = c.unknown_fields_warning(); !w.empty())
    log::warn("{}: {}", path.string(), w);
  const ParamCount p = count_params(c);
  const LayerKinds kinds = layer_kinds(c);
  const std::vector<CacheRow> rows = cache_rows(c);
  const int64_t kda_state =
      c.num_kda_layers() > 0 ? kda_state_bytes_per_request(c.cache_spec()) : 0;
  // A combination of flags no backend runs is printed, not fatal: info describes the model.
  parse_attention_backend(plan_args.attention_backend);  // a bad name is an error
  std::optional<AttentionChoice> attention;
  std::string attention_refusal;
  try {
    attention = attention_choice(c, plan_args);
  } catch (const InvalidArgument& e) {
    attention_refusal = e.what();
  }
  if (as_json) {
    print_json(path, c, p, kinds, rows, kda_state, attention);
    return 0;
  }
  std::printf("model: %s (%s)\n", path.string().c_str(), c.model_type_name.c_str());
  print_attention(c, kinds);
  if (attention) std::printf("  attention backend: %s\n", attention->describe().c_str());
  if (!attention && c.num_mla_layers() > 0)
    std::printf("  attention backend: none (%s)\n", attention_refusal.c_str());
  print_mlp(c, kinds);
  print_params(p);
  print_cache_rows(c, rows);
  if (!plan_args.gpu_memory.empty()) {
    std::printf("\n");
    print_plan(c, plan_args);
  }
  if (kda_state > 0) {
    std::printf("KDA state per request (all %lld KDA layers, fp32, TP1): %s bytes (%.1f MiB)\n",
                static_cast<long long>(c.num_kda_layers()), with_commas(kda_state).c_str(),
                static_cast<double>(kda_state) / (1 << 20));
  }
  return 0;
}

}  // namespace

std::function<int()> add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Describe a model from its config.json");
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("path", *path, "checkpoint folder or config.json (default: the bundled model)");
  cmd->add_flag("--json", *as_json, "print JSON");
  auto plan = std::make_shared<PlanArgs>();
  cmd->add_option("--gpu-memory", plan->gpu_memory,
                  "GPU memory per device (e.g. 141GB): print the cache plan for it");
  cmd->add_option("--tp,--tensor-parallel-size", plan->tp, "tensor-parallel size")
      ->capture_default_str();
  cmd->add_option("--dcp,--decode-context-parallel-size", plan->dcp, "decode-context-parallel size")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", plan->kv_cache_dtype,
                  latent_cache_dtype_choices() +
                      " (auto: fp8 for DSA models with a 576-wide latent, bf16 otherwise)")
      ->capture_default_str();
  cmd->add_option("--index-cache-dtype", plan->index_cache_dtype, index_cache_dtype_choices())
      ->capture_default_str();
  cmd->add_option("--attention-backend", plan->attention_backend,
                  "how MLA layers attend: auto, mla, mla_sparse, dsa_fp8 or dsa_fp8_fused (auto: "
                  "from the config and the cache dtypes; see hyserve info)")
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", plan->gpu_memory_utilization,
                  "fraction of GPU memory hyserve may use")
      ->capture_default_str();
  cmd->add_option("--reserve", plan->reserve,
                  "memory kept for activations, workspaces and CUDA graphs")
      ->capture_default_str();
  return [path, as_json, plan] { return run_info(*path, *as_json, *plan); };
}

}  // namespace hyserve::cli
