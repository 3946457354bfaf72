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
// Memory: on a CPU device the ops read the adapters' host memory directly. On a device of
// its own (CUDA) every slot's room is allocated when the table is made, for an adapter of
// max_rank on every target the device adapts (device_slot_bytes; the KV pool is planned
// after it: Model::lora_device_bytes), and a slot's A and B are copied into its room when
// it is set: serving never allocates for an adapter. The [target][slot] table of
// LoraMatrices the ops read lives in device memory too (uploaded whole at each set).
// Merged kv_b copies are host-only: on a device kv_b's A and B sit in the slot's room like
// the others and the MLA op applies them in low-rank form; the MoE kernels read the routed
// experts' from the table's [expert][gate, up, down][slot] block (matrices()). Changing a slot is
// done by the engine thread between steps, with nothing of the step before still running.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"  // LoraMatrices, LoraModule (kernels/lora/params.h)
#include "backend/device.h"
#include "core/weight.h"
#include "model/lora_adapter.h"

namespace hyserve {

class LoraTable {
 public:
  // device: where the ops read the matrices (null: host memory, as a CPU device); max_rank:
  // the largest rank a slot takes there.
  LoraTable(const LoraTargets& targets, int64_t num_slots, Device* device = nullptr,
            int64_t max_rank = kMaxLoraRank);

  // Whether a target (canonical name) is read inside MLA's attention op (kv_b_proj): merged
  // on the host; on a device, applied there in low-rank form (MlaAttentionParams::kv_b_lora).
  static bool merged_target(const std::string& name);
  // Device bytes of one slot's room: A and B of rank max_rank on every target (routed experts
  // included, as vLLM's fused-MoE LoRA allocates them); and of the whole table (num_slots rooms
  // and the matrix table).
  static int64_t device_slot_bytes(const LoraTargets& targets, int64_t max_rank);
  static int64_t device_bytes(const LoraTargets& targets, int64_t num_slots, int64_t max_rank);

  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  // Puts adapter in slot (null: empties it); the previous one is released here (requests
  // still holding it keep it alive until they finish).
  void set(int64_t slot, std::shared_ptr<const LoraAdapter> adapter);
  const std::shared_ptr<const LoraAdapter>& adapter(int64_t slot) const;
  // The target's matrices by slot; empty when no resident adapter adapts it.
  LoraModule module(int64_t target) const;
  // The table from target on ([target][slot], num_slots() a target, empty entries where a slot
  // does not adapt it), in the ops' memory: the MoE kernels read a layer's experts' block.
  const LoraMatrices* matrices(int64_t target) const;
  // Changes whenever a target's module turns empty or non-empty (an op a captured CUDA graph
  // launches, or leaves out); the matrices behind a module's table may change without it.
  int64_t layout_generation() const { return layout_generation_; }
  // Whether slot's adapter adapts a merged target (kv_b_proj: its tokens attend with their own
  // weights, so a batch with it is cut into per-sequence calls).
  bool slot_merges(int64_t slot) const;
  // The merged kv_b of slot's adapter on this kv_b target, or null when it has none there.
  const Weight* merged(int64_t target, int64_t slot) const;
  // Whether a target is applied by merging (the MLA layers' kv_b_proj, on the host).
  bool merges(int64_t target) const;

 private:
  struct Merged {
    std::vector<float> data;  // [rows, cols]
    Weight weight;            // fp32 dense view of data
  };
  bool on_device() const { return device_ != nullptr; }
  // Empties slot's matrices and merged copies (the adapter pointer is kept).
  void clear(int64_t slot);
  // Fills slot's matrices (and merged copies) from slots_[slot]; throws on a bad pair.
  void fill(int64_t slot);
  void upload_matrices();
  const LoraTargets& targets_;
  Device* device_ = nullptr;  // null: host memory
  std::vector<std::shared_ptr<const LoraAdapter>> slots_;
  // [target * num_slots + slot]: host pointers, or device pointers (on_device)
  std::vector<LoraMatrices> matrices_;
  std::vector<int64_t> users_;  // [target] slots with matrices
  int64_t layout_generation_ = 0;
  std::map<std::pair<int64_t, int64_t>, Merged> merged_;
  std::vector<DeviceAllocation> slot_memory_;  // on_device: [slot] its room for A and B
  int64_t slot_floats_ = 0;                    // on_device: the room of a slot
  DeviceAllocation device_matrices_;           // on_device: matrices_ uploaded
};

}  // namespace hyserve
