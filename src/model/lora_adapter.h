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
#include <memory>
#include <string>
#include <vector>

#include "core/weight.h"

namespace hyserve {

struct ModelWeights;

// Where a rank's weights were cut from the whole model's (model/tensor_parallel.h
// shard_weights): rank of size tensor-parallel ranks, kv_b_proj cut for the DCP group's
// heads, routed experts whole by index under expert parallelism. The default: one rank.
struct LoraShard {
  int rank = 0;
  int size = 1;
  int dcp = 1;
  bool expert_parallel = false;
};

// A model's adaptable projections: canonical names ("layers.3.self_attn.q_a_proj",
// "layers.5.mlp.experts.7.gate_proj", "layers.5.mlp.shared_experts.up_proj") and the
// weights they add to. Under tensor parallelism a target is the rank's share of the whole
// model's projection, and says how it was cut, so that an adapter written for the whole
// model (PEFT's, shapes of the checkpoint) is cut the same way:
//   kWhole  replicated (MLA q_a / kv_a, KDA f_a / g_a, experts under expert parallelism)
//   kRows   column-parallel: output rows [part * rows, (part + 1) * rows) of full_rows;
//           the adapter's B is cut alike, A whole
//   kCols   row-parallel (o_proj, down): input columns [part * cols, ...) of full_cols; A
//           cut alike, B whole: each rank's (x_part A_part^T) B^T is its partial sum of
//           the adapter's term, added where the projection's partial sums are (before the
//           all-reduce), so the sum over ranks is the whole term with no extra collective
// Routed experts under expert parallelism keep their whole-model index in their names; the
// experts other ranks hold are known (elsewhere) but not targets here.
class LoraTargets {
 public:
  enum class Cut : uint8_t { kWhole, kRows, kCols };
  struct Target {
    std::string name;
    const Weight* weight = nullptr;  // in the model's weights: [out, in], this rank's share
    int64_t layer = 0;
    Cut cut = Cut::kWhole;
    int part = 0;  // this rank's share of `parts`
    int parts = 1;
    int64_t full_rows = 0;  // the whole model's [out, in]
    int64_t full_cols = 0;
  };
  LoraTargets() = default;
  explicit LoraTargets(const ModelWeights& weights, const LoraShard& shard = {});

  const std::vector<Target>& targets() const { return targets_; }
  // The index of a canonical name, or -1.
  int64_t find(const std::string& name) const;
  // The index of the target that adds to w, or -1.
  int64_t find(const Weight* w) const;
  // The whole model's [out, in] of a canonical name, a target here or a routed expert
  // another rank holds; false when the model has no such adaptable module.
  bool full_shape(const std::string& name, int64_t& rows, int64_t& cols) const;
  // The whole model's number of routed experts in a layer (0: none there).
  int64_t num_experts(int64_t layer) const;
  // Whether the targets are the whole model's (one rank, nothing cut or elsewhere).
  bool whole() const { return whole_; }
  // A layer's routed experts as one block of targets, [expert][gate, up, down] (the form the
  // CUDA MoE kernels read, MoeParams::expert_lora_table), found by expert 0's gate weight: the
  // index of that gate's target, or -1 when the weight is not such a layer's first expert.
  int64_t experts_first_target(const Weight* expert0_gate) const;
  // A checkpoint-style module path (prefixes and naming variants of MODEL.md §7 accepted)
  // as its canonical name; empty when it is not a decoder layer's module.
  static std::string canonical_name(const std::string& module_path);

 private:
  struct Experts {
    int64_t first = 0;  // this rank's [first, first + count) of total
    int64_t count = 0;
    int64_t total = 0;
    int64_t first_target = -1;  // targets [first_target, + 3 count): [expert][gate, up, down]
  };
  void add(std::string name, const Weight& w, int64_t layer, Cut cut = Cut::kWhole, int part = 0,
           int parts = 1);
  std::vector<Target> targets_;
  std::vector<Experts> experts_;  // [layer]
  std::map<std::string, int64_t, std::less<>> by_name_;
  std::map<const Weight*, int64_t> by_weight_;
  bool whole_ = true;
};

struct LoraAdapter {
  struct Pair {
    int64_t target = 0;    // LoraTargets index; -1: a module another rank holds
    std::string module;    // its canonical name
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
  // Tensor parallelism: the whole adapter as read (every module uncut, those of other ranks'
  // experts too), which rank 0 relays to the other ranks; pairs are this rank's share of it.
  // Null when pairs are the whole adapter (one rank).
  std::shared_ptr<const LoraAdapter> whole;
};

// Reads and checks the adapter in dir against the whole model's shapes: the whole adapter
// (pairs uncut; target -1 for a module another rank holds). Throws InvalidArgument naming
// the file, tensor or module on: a missing file, an unknown or unadapted module, a tensor
// without its partner, a shape other than [r, in] / [out, r], r over max_rank, a module not
// in target_modules (when that is a list).
LoraAdapter read_lora_adapter(const std::filesystem::path& dir, const std::string& name,
                              const LoraTargets& targets, int64_t max_rank);

// This rank's share of a whole adapter: each pair cut as its target was (LoraTargets), the
// modules of other ranks dropped, in target order; `whole` set to the given adapter. A pair
// whose shape is not its module's whole shape is an InvalidArgument naming it.
LoraAdapter lora_share(const std::shared_ptr<const LoraAdapter>& whole, const LoraTargets& targets);

}  // namespace hyserve
