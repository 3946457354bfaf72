// LoRA adapters in PEFT's format (issue 48): a folder with adapter_config.json (r,
// lora_alpha, use_rslora, target_modules; base_model_name_or_path is ignored) and
// adapter_model.safetensors holding, per adapted module,
//   base_model.model.<module path>.lora_A.weight  [r, in]
//   base_model.model.<module path>.lora_B.weight  [out, r]
// (also without the base_model.model. prefix, and with the published Kimi K3's
// language_model. before model.layers). The module paths are the checkpoint's
// (model.layers.N.self_attn.q_a_proj, ...mlp.experts.E.gate_proj, ...); LoraTargets names
// the ones a model can adapt and their shapes.
//
// An adapter is read whole into fp32 host memory, checked against the model (every
// tensor's module known and adapted, its shape [r, in] / [out, r], r <= the rank limit)
// and then never changes: a loaded adapter is shared (shared_ptr) by the slot table and
// the requests using it, so an unload or a replacement never pulls weights from under a
// request in flight.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/weight.h"

namespace hyserve {

struct ModelWeights;

// A model's adaptable projections: canonical names ("layers.3.self_attn.q_a_proj",
// "layers.5.mlp.experts.7.gate_proj", "layers.5.mlp.shared_experts.up_proj") and the
// weights they add to.
class LoraTargets {
 public:
  struct Target {
    std::string name;
    const Weight* weight = nullptr;  // in the model's weights: [out, in]
    int64_t layer = 0;
  };
  LoraTargets() = default;
  explicit LoraTargets(const ModelWeights& weights);

  const std::vector<Target>& targets() const { return targets_; }
  // The index of a canonical name, or -1.
  int64_t find(const std::string& name) const;
  // The index of the target that adds to w, or -1.
  int64_t find(const Weight* w) const;
  // A checkpoint-style module path (prefixes and naming variants of MODEL.md §7 accepted)
  // as its canonical name; empty when it is not a decoder layer's module.
  static std::string canonical_name(const std::string& module_path);

 private:
  void add(std::string name, const Weight& w, int64_t layer);
  std::vector<Target> targets_;
  std::map<std::string, int64_t, std::less<>> by_name_;
  std::map<const Weight*, int64_t> by_weight_;
};

struct LoraAdapter {
  struct Pair {
    int64_t target = 0;    // LoraTargets index
    std::vector<float> a;  // [rank, in]
    std::vector<float> b;  // [out, rank]
    int64_t rank = 0;
    float scale = 0.0f;
  };
  std::string name;
  std::filesystem::path path;
  int64_t rank = 0;         // r
  double alpha = 0.0;       // lora_alpha
  bool rslora = false;      // use_rslora: scale alpha / sqrt(r), else alpha / r
  std::vector<Pair> pairs;  // in target order
};

// Reads and checks the adapter in dir. Throws InvalidArgument naming the file, tensor or
// module on: a missing file, an unknown or unadapted module, a tensor without its partner,
// a shape other than [r, in] / [out, r], r over max_rank, a module not in target_modules
// (when that is a list).
LoraAdapter read_lora_adapter(const std::filesystem::path& dir, const std::string& name,
                              const LoraTargets& targets, int64_t max_rank);

}  // namespace hyserve
