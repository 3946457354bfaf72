// LoraTable: the adapters resident at once (serve --max-loras), one per slot, and the
// views the forward reads (issue 48). A request names its adapter's slot (SequenceInput::
// lora_slot); each projection's LoRA op reads matrices_[target][slot] for its tokens.
//
//   slots_     [num_slots] the adapter in each slot (shared with the requests using it)
//   matrices_  [target][slot] LoraMatrices views into the adapters' fp32 A, B (empty: the
//              slot's adapter does not adapt that projection)
//   merged_    (target, slot) -> kv_b_proj + scale B A, fp32 [H*(dn+dv), kv_lora]: MLA's
//              absorbed attention reads kv_b's W_UK / W_UV slices inside the attention op,
//              so an adapter on kv_b is applied exactly by attending with its own merged
//              copy (docs/DECISIONS.md "LoRA adapters (issue 48)").
//
// Host memory: the CPU backend reads the views directly. Changing a slot is done by the
// engine thread between steps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"  // LoraMatrices, LoraModule (kernels/lora/params.h)
#include "core/weight.h"
#include "model/lora_adapter.h"

namespace hyserve {

class LoraTable {
 public:
  LoraTable(const LoraTargets& targets, int64_t num_slots);

  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  // Puts adapter in slot (null: empties it); the previous one is released here (requests
  // still holding it keep it alive until they finish).
  void set(int64_t slot, std::shared_ptr<const LoraAdapter> adapter);
  const std::shared_ptr<const LoraAdapter>& adapter(int64_t slot) const;
  // The target's matrices by slot; empty when no resident adapter adapts it.
  LoraModule module(int64_t target) const;
  // The merged kv_b of slot's adapter on this kv_b target, or null when it has none there.
  const Weight* merged(int64_t target, int64_t slot) const;
  // Whether a target is applied by merging (the MLA layers' kv_b_proj).
  bool merges(int64_t target) const;

 private:
  struct Merged {
    std::vector<float> data;  // [rows, cols]
    Weight weight;            // fp32 dense view of data
  };
  const LoraTargets& targets_;
  std::vector<std::shared_ptr<const LoraAdapter>> slots_;
  std::vector<std::vector<LoraMatrices>> matrices_;  // [target][slot]
  std::vector<int64_t> users_;                       // [target] slots with matrices
  std::map<std::pair<int64_t, int64_t>, Merged> merged_;
};

}  // namespace hyserve
