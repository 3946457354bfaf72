// LoraSlots: which LoRA adapter sits in each of the model's --max-loras slots (issue 48),
// and how many running requests use each one. The scheduler asks for a slot when it admits
// a request with an adapter and gives it back when the request finishes or is preempted:
//
//   acquire(X)  X resident in a slot        -> that slot, one more user
//               else a slot without users   -> X put there (an empty slot first, else the
//                                              one idle longest), one user; a load for the
//                                              step to apply (Model::set_lora)
//               else                        -> not now (can_acquire false): the request
//                                              waits, as vLLM's scheduler makes it wait
//
// A slot is compared by adapter identity (the pointer): an adapter replaced under the same
// name is another adapter, in another slot, and the requests on the old one keep theirs
// (both shared_ptrs keep it alive) until they finish.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/lora_adapter.h"

namespace hyserve {

// A slot whose adapter changes before the next forward (null: emptied).
struct LoraLoad {
  int32_t slot = 0;
  std::shared_ptr<const LoraAdapter> adapter;
};

class LoraSlots {
 public:
  explicit LoraSlots(int64_t num_slots);

  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  // Whether acquire(adapter) gives a slot now.
  bool can_acquire(const LoraAdapter* adapter) const;
  // The adapter's slot with one more user; throws when can_acquire is false.
  int32_t acquire(const std::shared_ptr<const LoraAdapter>& adapter);
  void release(int32_t slot);
  int64_t num_users(int32_t slot) const;
  // The slots changed since the last call, in order (the engine applies them before the
  // step's forward).
  std::vector<LoraLoad> take_loads();

 private:
  struct Slot {
    std::shared_ptr<const LoraAdapter> adapter;
    int64_t num_users = 0;
    uint64_t idle_since = 0;  // clock_ when its last user left
  };
  int32_t find(const LoraAdapter* adapter) const;  // -1: not resident
  int32_t free_slot() const;                       // -1: every slot has users

  std::vector<Slot> slots_;
  std::vector<LoraLoad> loads_;
  uint64_t clock_ = 0;
};

}  // namespace hyserve
