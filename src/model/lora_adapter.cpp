// PEFT adapters read and checked against a model's adaptable projections.
#include "model/lora_adapter.h"

#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "util/error.h"

namespace hyserve {

namespace {

bool starts_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

// Replaces each occurrence of `from` (a whole dotted component run) by `to`.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

}  // namespace

void LoraTargets::add(std::string name, const Weight& w, int64_t layer) {
  if (w.empty()) return;
  by_name_[name] = static_cast<int64_t>(targets_.size());
  by_weight_[&w] = static_cast<int64_t>(targets_.size());
  targets_.push_back({std::move(name), &w, layer});
}

LoraTargets::LoraTargets(const ModelWeights& weights) {
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    const auto layer = static_cast<int64_t>(i);
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    const MlaWeights& m = l.mla;
    add(a + "q_proj", m.q_proj, layer);
    add(a + "q_a_proj", m.q_a_proj, layer);
    add(a + "q_b_proj", m.q_b_proj, layer);
    add(a + "kv_a_proj_with_mqa", m.kv_a_proj, layer);
    add(a + "kv_b_proj", m.kv_b_proj, layer);
    add(a + "o_proj", m.o_proj, layer);
    add(a + "g_proj", m.g_proj, layer);
    const KdaWeights& k = l.kda;
    add(a + "q_proj", k.q_proj, layer);
    add(a + "k_proj", k.k_proj, layer);
    add(a + "v_proj", k.v_proj, layer);
    add(a + "f_a_proj", k.f_a_proj, layer);
    add(a + "f_b_proj", k.f_b_proj, layer);
    add(a + "b_proj", k.b_proj, layer);
    add(a + "g_a_proj", k.g_a_proj, layer);
    add(a + "g_b_proj", k.g_b_proj, layer);
    add(a + "g_proj", k.g_proj, layer);
    add(a + "o_proj", k.o_proj, layer);
    auto mlp = [&](const std::string& q, const MlpWeights& w) {
      add(q + "gate_proj", w.gate, layer);
      add(q + "up_proj", w.up, layer);
      add(q + "down_proj", w.down, layer);
    };
    mlp(p + "mlp.", l.dense);
    for (size_t e = 0; e < l.moe.experts.size(); ++e) {
      mlp(p + "mlp.experts." + std::to_string(e) + ".", l.moe.experts[e]);
    }
    if (l.moe.has_shared) mlp(p + "mlp.shared_experts.", l.moe.shared);
  }
}

int64_t LoraTargets::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

int64_t LoraTargets::find(const Weight* w) const {
  auto it = by_weight_.find(w);
  return it == by_weight_.end() ? -1 : it->second;
}

std::string LoraTargets::canonical_name(const std::string& module_path) {
  std::string s = module_path;
  for (std::string_view prefix : {"base_model.model.", "language_model."}) {
    if (starts_with(s, prefix)) s.erase(0, prefix.size());
  }
  if (!starts_with(s, "model.layers.")) return {};
  s.erase(0, 6);  // "model."
  // kimi_* name the MLP block block_sparse_moe and the experts' projections w1 / w3 / w2.
  replace_all(s, ".block_sparse_moe.", ".mlp.");
  if (s.find(".experts.") != std::string::npos) {
    for (auto [from, to] :
         {std::pair{".w1", ".gate_proj"}, {".w3", ".up_proj"}, {".w2", ".down_proj"}}) {
      const std::string_view f = from;
      if (s.size() > f.size() && s.compare(s.size() - f.size(), f.size(), f) == 0) {
        s.replace(s.size() - f.size(), f.size(), to);
      }
    }
  }
  return s;
}

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  CHECK(in.good(), "LoRA adapter: cannot read ", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    HYSERVE_THROW(InvalidArgument, "LoRA adapter: ", path.string(), " is not JSON: ", e.what());
  }
}

// target_modules as a set of module names (PEFT matches a module whose path ends in one);
// empty when it is a string (a regex or "all-linear": every tensor's module accepted).
std::set<std::string> read_target_modules(const nlohmann::json& config,
                                          const std::filesystem::path& path) {
  std::set<std::string> names;
  if (!config.contains("target_modules") || config["target_modules"].is_null()) return names;
  const nlohmann::json& t = config["target_modules"];
  if (t.is_string()) return names;
  CHECK(t.is_array(), "LoRA adapter ", path.string(), ": target_modules must be a list or string");
  for (const auto& x : t) {
    CHECK(x.is_string(), "LoRA adapter ", path.string(), ": target_modules entries are strings");
    names.insert(x.get<std::string>());
  }
  return names;
}

bool listed(const std::set<std::string>& names, const std::string& module) {
  if (names.empty()) return true;
  for (const std::string& n : names) {
    if (module == n) return true;
    if (module.size() > n.size() && module.compare(module.size() - n.size(), n.size(), n) == 0 &&
        module[module.size() - n.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

// One layer's fused expert LoRA tensors.
struct FusedExperts {
  std::string module;
  const TensorInfo* a = nullptr;
  const TensorInfo* b = nullptr;
};

// "layers.N.mlp.experts.base_layer" (gate and up) or "layers.N.mlp.experts" (down).
bool is_fused_experts(const std::string& canon) {
  const auto ends = [&](std::string_view x) {
    return canon.size() > x.size() && canon.compare(canon.size() - x.size(), x.size(), x) == 0;
  };
  return ends(".mlp.experts.base_layer") || ends(".mlp.experts");
}

// The per-expert pairs of a fused form: expert e's A is rows [e r, (e + 1) r) of lora_A (the
// expert index slowest), its B the columns e, E + e, 2E + e, ... of lora_B (the expert index
// fastest), as PEFT lays them out and vLLM reads them; gate_up's B rows are gate's then up's.
void add_fused_experts(const std::string& canon, const FusedExperts& f, const LoraTargets& targets,
                       int64_t rank, float scale, const std::string& file_name,
                       std::map<int64_t, LoraAdapter::Pair>& pairs,
                       std::map<int64_t, std::string>& module_of) {
  CHECK(f.a != nullptr && f.b != nullptr, "LoRA adapter ", file_name, ": module ", f.module,
        " has only one of lora_A.weight and lora_B.weight");
  const bool gate_up = canon.ends_with(".base_layer");
  const std::string prefix = canon.substr(0, canon.rfind(".experts")) + ".experts.";
  std::vector<std::vector<int64_t>> by_expert;  // targets per expert: gate, up or down
  for (int64_t e = 0;; ++e) {
    const std::string p = prefix + std::to_string(e);
    std::vector<int64_t> ts;
    for (const char* proj : gate_up ? std::vector<const char*>{".gate_proj", ".up_proj"}
                                    : std::vector<const char*>{".down_proj"}) {
      ts.push_back(targets.find(p + proj));
    }
    if (ts.front() < 0) break;
    by_expert.push_back(std::move(ts));
  }
  const auto num_experts = static_cast<int64_t>(by_expert.size());
  CHECK(num_experts > 0, "LoRA adapter ", file_name, ": module ", f.module,
        ": the model has no routed experts there");
  const Weight& w0 = *targets.targets()[by_expert[0][0]].weight;
  const int64_t in = w0.cols, out_each = w0.rows;
  const int64_t out = out_each * static_cast<int64_t>(by_expert[0].size());
  const int64_t er = num_experts * rank;
  CHECK(f.a->shape == (std::vector<int64_t>{er, in}), "LoRA adapter ", file_name, ": tensor ",
        f.a->name, " has shape [", f.a->shape[0], ", ", f.a->shape[1], "], expected [", er, ", ",
        in, "] (", num_experts, " experts x r = ", rank, ")");
  CHECK(f.b->shape == (std::vector<int64_t>{out, er}), "LoRA adapter ", file_name, ": tensor ",
        f.b->name, " has shape [", f.b->shape[0], ", ", f.b->shape[1], "], expected [", out, ", ",
        er, "] (", num_experts, " experts x r = ", rank, ")");
  std::vector<float> a(static_cast<size_t>(er * in)), b(static_cast<size_t>(out * er));
  convert_to_f32(f.a->data, f.a->dtype, a.data(), f.a->num_elements());
  convert_to_f32(f.b->data, f.b->dtype, b.data(), f.b->num_elements());
  for (int64_t e = 0; e < num_experts; ++e) {
    for (size_t part = 0; part < by_expert[static_cast<size_t>(e)].size(); ++part) {
      const int64_t target = by_expert[static_cast<size_t>(e)][part];
      CHECK(target >= 0 && !pairs.contains(target), "LoRA adapter ", file_name, ": module ",
            f.module, ": expert ", e, " is also given per expert");
      LoraAdapter::Pair& p = pairs[target];
      p.target = target;
      p.rank = rank;
      p.scale = scale;
      p.a.assign(a.begin() + e * rank * in, a.begin() + (e + 1) * rank * in);
      p.b.resize(static_cast<size_t>(out_each * rank));
      for (int64_t o = 0; o < out_each; ++o) {
        for (int64_t r = 0; r < rank; ++r) {
          p.b[static_cast<size_t>(o * rank + r)] = b[static_cast<size_t>(
              (static_cast<int64_t>(part) * out_each + o) * er + r * num_experts + e)];
        }
      }
      module_of[target] = f.module;
    }
  }
}

}  // namespace

LoraAdapter read_lora_adapter(const std::filesystem::path& dir, const std::string& name,
                              const LoraTargets& targets, int64_t max_rank) {
  const std::filesystem::path config_path = dir / "adapter_config.json";
  const nlohmann::json config = read_json(config_path);
  LoraAdapter ad;
  ad.name = name;
  ad.path = dir;
  CHECK(config.contains("r") && config["r"].is_number_integer(), "LoRA adapter ",
        config_path.string(), ": r must be an integer");
  ad.rank = config["r"].get<int64_t>();
  ad.alpha = config.value("lora_alpha", static_cast<double>(ad.rank));
  ad.rslora = config.value("use_rslora", false);
  CHECK(ad.rank > 0 && ad.rank <= max_rank, "LoRA adapter ", config_path.string(), ": rank ",
        ad.rank, " is over --max-lora-rank ", max_rank);
  for (const char* unsupported : {"rank_pattern", "alpha_pattern"}) {
    CHECK(!config.contains(unsupported) || config[unsupported].empty(), "LoRA adapter ",
          config_path.string(), ": ", unsupported, " is not supported");
  }
  CHECK(!config.value("use_dora", false), "LoRA adapter ", config_path.string(),
        ": DoRA is not supported");
  const std::set<std::string> modules = read_target_modules(config, config_path);
  const float scale = static_cast<float>(
      ad.rslora ? ad.alpha / std::sqrt(static_cast<double>(ad.rank)) : ad.alpha / ad.rank);

  const SafetensorsFile file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  const std::string file_name = file.path().string();
  std::map<int64_t, LoraAdapter::Pair> pairs;
  std::map<int64_t, std::string> module_of;
  // vLLM's fused 3-D expert form (PEFT target_parameters): per layer, experts.base_layer
  // (gate and up) and experts (down), lora_A [E*r, in] and lora_B [out, E*r].
  std::map<std::string, FusedExperts> fused;
  const bool has_target_parameters =
      config.contains("target_parameters") && !config["target_parameters"].empty();
  for (const TensorInfo& t : file.tensors()) {
    bool is_a = false;
    std::string module;
    for (auto [suffix, a] : {std::pair{".lora_A.weight", true}, {".lora_B.weight", false}}) {
      const std::string_view s = suffix;
      if (t.name.size() > s.size() && t.name.compare(t.name.size() - s.size(), s.size(), s) == 0) {
        module = t.name.substr(0, t.name.size() - s.size());
        is_a = a;
      }
    }
    CHECK(!module.empty(), "LoRA adapter ", file_name, ": tensor ", t.name,
          " is not a lora_A.weight or lora_B.weight");
    const std::string canon = LoraTargets::canonical_name(module);
    if (is_fused_experts(canon)) {
      CHECK(has_target_parameters || listed(modules, module), "LoRA adapter ", file_name,
            ": tensor ", t.name, ": module ", module, " is not in target_modules");
      CHECK(is_float(t.dtype) && t.shape.size() == 2, "LoRA adapter ", file_name, ": tensor ",
            t.name, " must be a 2-D float tensor");
      FusedExperts& f = fused[canon];
      f.module = module;
      const TensorInfo*& slot = is_a ? f.a : f.b;
      CHECK(slot == nullptr, "LoRA adapter ", file_name, ": tensor ", t.name, " given twice");
      slot = &t;
      continue;
    }
    const int64_t target = canon.empty() ? -1 : targets.find(canon);
    CHECK(target >= 0, "LoRA adapter ", file_name, ": tensor ", t.name,
          ": unknown module or one this model cannot adapt (", module, ")");
    CHECK(listed(modules, module), "LoRA adapter ", file_name, ": tensor ", t.name, ": module ",
          module, " is not in target_modules");
    CHECK(is_float(t.dtype) && t.shape.size() == 2, "LoRA adapter ", file_name, ": tensor ", t.name,
          " must be a 2-D float tensor");
    const Weight& w = *targets.targets()[target].weight;
    const std::vector<int64_t> want =
        is_a ? std::vector<int64_t>{ad.rank, w.cols} : std::vector<int64_t>{w.rows, ad.rank};
    CHECK(t.shape == want, "LoRA adapter ", file_name, ": tensor ", t.name, " has shape [",
          t.shape[0], ", ", t.shape[1], "], expected [", want[0], ", ", want[1], "] (r = ", ad.rank,
          ", the module's weight is [", w.rows, ", ", w.cols, "])");
    LoraAdapter::Pair& p = pairs[target];
    std::vector<float>& dst = is_a ? p.a : p.b;
    CHECK(dst.empty(), "LoRA adapter ", file_name, ": tensor ", t.name, " given twice");
    dst.resize(static_cast<size_t>(t.num_elements()));
    convert_to_f32(t.data, t.dtype, dst.data(), t.num_elements());
    p.target = target;
    p.rank = ad.rank;
    p.scale = scale;
    module_of[target] = module;
  }
  for (const auto& [canon, f] : fused) {
    add_fused_experts(canon, f, targets, ad.rank, scale, file_name, pairs, module_of);
  }
  CHECK(!pairs.empty(), "LoRA adapter ", file_name, " has no lora_A / lora_B tensors");
  for (auto& [target, p] : pairs) {
    CHECK(!p.a.empty() && !p.b.empty(), "LoRA adapter ", file_name, ": module ", module_of[target],
          " has only one of lora_A.weight and lora_B.weight");
    ad.pairs.push_back(std::move(p));
  }
  return ad;
}

}  // namespace hyserve
