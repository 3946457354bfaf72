// PEFT adapters read and checked against a model's adaptable projections.
#include "model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
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

void LoraTargets::add(std::string name, const Weight& w, int64_t layer, Cut cut, int part,
                      int parts) {
  if (w.empty()) return;
  Target t{std::move(name), &w, layer, cut, part, parts, w.rows, w.cols};
  if (cut == Cut::kRows) t.full_rows = w.rows * parts;
  if (cut == Cut::kCols) t.full_cols = w.cols * parts;
  by_name_[t.name] = static_cast<int64_t>(targets_.size());
  by_weight_[&w] = static_cast<int64_t>(targets_.size());
  targets_.push_back(std::move(t));
}

LoraTargets::LoraTargets(const ModelWeights& weights, const LoraShard& shard) {
  CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size && shard.dcp >= 1 &&
            shard.size % shard.dcp == 0,
        "LoRA: rank ", shard.rank, " of ", shard.size, " (DCP ", shard.dcp, ")");
  whole_ = shard.size == 1;
  // The cuts of shard_weights (model/tensor_parallel.cpp), rule for rule.
  const int r = shard.rank, n = shard.size;
  const Cut rows = n > 1 ? Cut::kRows : Cut::kWhole;
  const Cut cols = n > 1 ? Cut::kCols : Cut::kWhole;
  experts_.resize(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    const auto layer = static_cast<int64_t>(i);
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    const MlaWeights& m = l.mla;
    add(a + "q_proj", m.q_proj, layer, rows, r, n);
    add(a + "q_a_proj", m.q_a_proj, layer);
    add(a + "q_b_proj", m.q_b_proj, layer, rows, r, n);
    add(a + "kv_a_proj_with_mqa", m.kv_a_proj, layer);
    // The DCP group's heads (a rank attends with every head of its group).
    add(a + "kv_b_proj", m.kv_b_proj, layer, n / shard.dcp > 1 ? Cut::kRows : Cut::kWhole,
        r / shard.dcp, n / shard.dcp);
    add(a + "o_proj", m.o_proj, layer, cols, r, n);
    add(a + "g_proj", m.g_proj, layer, rows, r, n);
    const KdaWeights& k = l.kda;
    add(a + "q_proj", k.q_proj, layer, rows, r, n);
    add(a + "k_proj", k.k_proj, layer, rows, r, n);
    add(a + "v_proj", k.v_proj, layer, rows, r, n);
    add(a + "f_a_proj", k.f_a_proj, layer);
    add(a + "f_b_proj", k.f_b_proj, layer, rows, r, n);
    add(a + "b_proj", k.b_proj, layer, rows, r, n);
    add(a + "g_a_proj", k.g_a_proj, layer);
    add(a + "g_b_proj", k.g_b_proj, layer, rows, r, n);
    add(a + "g_proj", k.g_proj, layer, rows, r, n);
    add(a + "o_proj", k.o_proj, layer, cols, r, n);
    auto mlp = [&](const std::string& q, const MlpWeights& w, bool cut) {
      add(q + "gate_proj", w.gate, layer, cut ? rows : Cut::kWhole, r, n);
      add(q + "up_proj", w.up, layer, cut ? rows : Cut::kWhole, r, n);
      add(q + "down_proj", w.down, layer, cut ? cols : Cut::kWhole, r, n);
    };
    mlp(p + "mlp.", l.dense, true);
    const auto count = static_cast<int64_t>(l.moe.experts.size());
    Experts& ex = experts_[i];
    ex.count = count;
    ex.total = count;
    if (shard.expert_parallel && count > 0) {
      // Whole experts, by index: the rank's [first, first + count) of count * size.
      ex.first = count * r;
      ex.total = count * n;
    }
    const auto before = static_cast<int64_t>(targets_.size());
    for (int64_t e = 0; e < count; ++e) {
      mlp(p + "mlp.experts." + std::to_string(ex.first + e) + ".", l.moe.experts[e],
          !shard.expert_parallel);
    }
    if (count > 0 && std::ssize(targets_) == before + 3 * count) ex.first_target = before;
    if (l.moe.has_shared) mlp(p + "mlp.shared_experts.", l.moe.shared, true);
  }
}

bool LoraTargets::full_shape(const std::string& name, int64_t& rows, int64_t& cols) const {
  int64_t t = find(name);
  if (t < 0) {
    // A routed expert another rank holds: the shape of this rank's first expert's projection.
    const std::string_view experts = ".mlp.experts.";
    const size_t at = name.find(experts);
    if (!starts_with(name, "layers.") || at == std::string::npos) return false;
    int64_t layer = -1, e = -1;
    try {
      size_t used = 0;
      layer = std::stoll(name.substr(7, at - 7), &used);
      if (used != at - 7) return false;
      const size_t dot = name.find('.', at + experts.size());
      if (dot == std::string::npos) return false;
      const std::string index = name.substr(at + experts.size(), dot - at - experts.size());
      e = std::stoll(index, &used);
      if (used != index.size()) return false;
      const std::string proj = name.substr(dot);
      if (proj != ".gate_proj" && proj != ".up_proj" && proj != ".down_proj") return false;
      if (layer < 0 || layer >= std::ssize(experts_)) return false;
      const Experts& ex = experts_[static_cast<size_t>(layer)];
      if (e < 0 || e >= ex.total || ex.count == 0) return false;
      t = find(name.substr(0, at + experts.size()) + std::to_string(ex.first) + proj);
    } catch (const std::exception&) {
      return false;
    }
    if (t < 0) return false;
  }
  rows = targets_[static_cast<size_t>(t)].full_rows;
  cols = targets_[static_cast<size_t>(t)].full_cols;
  return true;
}

int64_t LoraTargets::experts_first_target(const Weight* expert0_gate) const {
  const int64_t t = find(expert0_gate);
  if (t < 0) return -1;
  const Experts& ex = experts_[static_cast<size_t>(targets_[t].layer)];
  return ex.first_target == t ? t : -1;
}

int64_t LoraTargets::num_experts(int64_t layer) const {
  if (layer < 0 || layer >= std::ssize(experts_)) return 0;
  return experts_[static_cast<size_t>(layer)].total;
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
// E is the whole model's expert count (expert parallelism: other ranks' experts included).
void add_fused_experts(const std::string& canon, const FusedExperts& f, const LoraTargets& targets,
                       int64_t rank, float scale, const std::string& file_name,
                       std::map<std::string, LoraAdapter::Pair>& pairs,
                       std::map<std::string, std::string>& module_of) {
  CHECK(f.a != nullptr && f.b != nullptr, "LoRA adapter ", file_name, ": module ", f.module,
        " has only one of lora_A.weight and lora_B.weight");
  const bool gate_up = canon.ends_with(".base_layer");
  const std::string prefix = canon.substr(0, canon.rfind(".experts")) + ".experts.";
  const std::vector<const char*> projs = gate_up
                                             ? std::vector<const char*>{".gate_proj", ".up_proj"}
                                             : std::vector<const char*>{".down_proj"};
  int64_t layer = -1;
  try {
    layer = std::stoll(canon.substr(7));  // "layers.N."
  } catch (const std::exception&) {
  }
  const int64_t num_experts = targets.num_experts(layer);
  int64_t in = 0, out_each = 0;
  CHECK(num_experts > 0 && targets.full_shape(prefix + "0" + projs[0], out_each, in),
        "LoRA adapter ", file_name, ": module ", f.module,
        ": the model has no routed experts there");
  const int64_t out = out_each * static_cast<int64_t>(projs.size());
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
    for (size_t part = 0; part < projs.size(); ++part) {
      const std::string module = prefix + std::to_string(e) + projs[part];
      CHECK(!pairs.contains(module), "LoRA adapter ", file_name, ": module ", f.module, ": expert ",
            e, " is also given per expert");
      LoraAdapter::Pair& p = pairs[module];
      p.target = targets.find(module);
      p.module = module;
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
      module_of[module] = f.module;
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
  // A field PEFT may write as null reads as absent; one of another type is refused.
  const auto field = [&](const char* key) -> const nlohmann::json* {
    const auto it = config.find(key);
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  const auto flag = [&](const char* key) {
    const nlohmann::json* v = field(key);
    CHECK(v == nullptr || v->is_boolean(), "LoRA adapter ", config_path.string(), ": ", key,
          " must be true or false");
    return v != nullptr && v->get<bool>();
  };
  const nlohmann::json* alpha = field("lora_alpha");
  CHECK(alpha == nullptr || alpha->is_number(), "LoRA adapter ", config_path.string(),
        ": lora_alpha must be a number");
  ad.alpha = alpha != nullptr ? alpha->get<double>() : static_cast<double>(ad.rank);
  ad.rslora = flag("use_rslora");
  CHECK(ad.rank > 0 && ad.rank <= max_rank, "LoRA adapter ", config_path.string(), ": rank ",
        ad.rank, " is over --max-lora-rank ", max_rank);
  for (const char* unsupported : {"rank_pattern", "alpha_pattern"}) {
    const nlohmann::json* v = field(unsupported);
    CHECK(v == nullptr || v->empty(), "LoRA adapter ", config_path.string(), ": ", unsupported,
          " is not supported");
  }
  CHECK(!flag("use_dora"), "LoRA adapter ", config_path.string(), ": DoRA is not supported");
  // Weights stored transposed (GPT-2's Conv1D layers) and trained biases change the math.
  CHECK(!flag("fan_in_fan_out"), "LoRA adapter ", config_path.string(),
        ": fan_in_fan_out (transposed weights) is not supported");
  CHECK(!flag("lora_bias"), "LoRA adapter ", config_path.string(), ": lora_bias is not supported");
  if (const nlohmann::json* bias = field("bias")) {
    CHECK(bias->is_string() && bias->get<std::string>() == "none", "LoRA adapter ",
          config_path.string(), ": bias ", bias->dump(), " is not supported (only \"none\")");
  }
  const std::set<std::string> modules = read_target_modules(config, config_path);
  const float scale = static_cast<float>(
      ad.rslora ? ad.alpha / std::sqrt(static_cast<double>(ad.rank)) : ad.alpha / ad.rank);

  const SafetensorsFile file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  const std::string file_name = file.path().string();
  std::map<std::string, LoraAdapter::Pair> pairs;  // by canonical module name
  std::map<std::string, std::string> module_of;
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
    int64_t rows = 0, cols = 0;
    CHECK(!canon.empty() && targets.full_shape(canon, rows, cols), "LoRA adapter ", file_name,
          ": tensor ", t.name, ": unknown module or one this model cannot adapt (", module, ")");
    CHECK(listed(modules, module), "LoRA adapter ", file_name, ": tensor ", t.name, ": module ",
          module, " is not in target_modules");
    CHECK(is_float(t.dtype) && t.shape.size() == 2, "LoRA adapter ", file_name, ": tensor ", t.name,
          " must be a 2-D float tensor");
    const std::vector<int64_t> want =
        is_a ? std::vector<int64_t>{ad.rank, cols} : std::vector<int64_t>{rows, ad.rank};
    CHECK(t.shape == want, "LoRA adapter ", file_name, ": tensor ", t.name, " has shape [",
          t.shape[0], ", ", t.shape[1], "], expected [", want[0], ", ", want[1], "] (r = ", ad.rank,
          ", the module's weight is [", rows, ", ", cols, "])");
    LoraAdapter::Pair& p = pairs[canon];
    std::vector<float>& dst = is_a ? p.a : p.b;
    CHECK(dst.empty(), "LoRA adapter ", file_name, ": tensor ", t.name, " given twice");
    dst.resize(static_cast<size_t>(t.num_elements()));
    convert_to_f32(t.data, t.dtype, dst.data(), t.num_elements());
    p.target = targets.find(canon);
    p.module = canon;
    p.rank = ad.rank;
    p.scale = scale;
    module_of[canon] = module;
  }
  for (const auto& [canon, f] : fused) {
    add_fused_experts(canon, f, targets, ad.rank, scale, file_name, pairs, module_of);
  }
  CHECK(!pairs.empty(), "LoRA adapter ", file_name, " has no lora_A / lora_B tensors");
  for (auto& [canon, p] : pairs) {
    CHECK(!p.a.empty() && !p.b.empty(), "LoRA adapter ", file_name, ": module ", module_of[canon],
          " has only one of lora_A.weight and lora_B.weight");
    ad.pairs.push_back(std::move(p));
  }
  // Target order (this rank's modules first; those of other ranks' experts after).
  std::stable_sort(
      ad.pairs.begin(), ad.pairs.end(), [](const LoraAdapter::Pair& x, const LoraAdapter::Pair& y) {
        const auto key = [](int64_t t) { return t < 0 ? std::numeric_limits<int64_t>::max() : t; };
        return key(x.target) < key(y.target);
      });
  return ad;
}

LoraAdapter lora_share(const std::shared_ptr<const LoraAdapter>& whole,
                       const LoraTargets& targets) {
  CHECK(whole != nullptr, "LoRA: no adapter to share");
  LoraAdapter share;
  share.name = whole->name;
  share.path = whole->path;
  share.rank = whole->rank;
  share.alpha = whole->alpha;
  share.rslora = whole->rslora;
  share.whole = whole;
  for (const LoraAdapter::Pair& w : whole->pairs) {
    int64_t rows = 0, cols = 0;
    CHECK(targets.full_shape(w.module, rows, cols), "LoRA adapter ", whole->name, ": module ",
          w.module, " is not one this model can adapt");
    CHECK(w.rank > 0 && std::ssize(w.a) == w.rank * cols && std::ssize(w.b) == rows * w.rank,
          "LoRA adapter ", whole->name, ": module ", w.module, ": A has ", w.a.size(), " and B ",
          w.b.size(), " values, expected [", w.rank, ", ", cols, "] and [", rows, ", ", w.rank,
          "]");
    const int64_t target = targets.find(w.module);
    if (target < 0) continue;  // another rank's expert
    const LoraTargets::Target& t = targets.targets()[static_cast<size_t>(target)];
    LoraAdapter::Pair& p = share.pairs.emplace_back();
    p.target = target;
    p.module = w.module;
    p.rank = w.rank;
    p.scale = w.scale;
    switch (t.cut) {
      case LoraTargets::Cut::kWhole:
        p.a = w.a;
        p.b = w.b;
        break;
      case LoraTargets::Cut::kRows: {
        // B's output rows of this rank's share.
        const int64_t n = t.weight->rows;
        p.a = w.a;
        p.b.assign(w.b.begin() + t.part * n * w.rank, w.b.begin() + (t.part + 1) * n * w.rank);
        break;
      }
      case LoraTargets::Cut::kCols: {
        // A's input columns of this rank's share.
        const int64_t n = t.weight->cols;
        p.a.resize(static_cast<size_t>(w.rank * n));
        for (int64_t j = 0; j < w.rank; ++j) {
          std::copy_n(w.a.begin() + j * cols + t.part * n, n, p.a.begin() + j * n);
        }
        p.b = w.b;
        break;
      }
    }
  }
  std::sort(
      share.pairs.begin(), share.pairs.end(),
      [](const LoraAdapter::Pair& x, const LoraAdapter::Pair& y) { return x.target < y.target; });
  return share;
}

}  // namespace hyserve
