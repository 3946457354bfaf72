#include "engine/lora_slots.h"

#include "util/error.h"

namespace hyserve {

LoraSlots::LoraSlots(int64_t num_slots) : slots_(static_cast<size_t>(num_slots)) {
  CHECK(num_slots >= 0, "max_loras must be >= 0, got ", num_slots);
}

int32_t LoraSlots::find(const LoraAdapter* adapter) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].adapter.get() == adapter) return static_cast<int32_t>(s);
  }
  return -1;
}

int32_t LoraSlots::free_slot() const {
  int32_t best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.num_users > 0) continue;
    if (slot.adapter == nullptr) return static_cast<int32_t>(s);
    if (best < 0 || slot.idle_since < slots_[static_cast<size_t>(best)].idle_since) {
      best = static_cast<int32_t>(s);
    }
  }
  return best;
}

bool LoraSlots::can_acquire(const LoraAdapter* adapter) const {
  return find(adapter) >= 0 || free_slot() >= 0;
}

int32_t LoraSlots::acquire(const std::shared_ptr<const LoraAdapter>& adapter) {
  CHECK(adapter != nullptr, "LoRA slots: acquire without an adapter");
  int32_t s = find(adapter.get());
  if (s < 0) {
    s = free_slot();
    CHECK(s >= 0, "LoRA slots: every one of the ", slots_.size(), " slots is in use");
    slots_[static_cast<size_t>(s)].adapter = adapter;
    loads_.push_back({s, adapter});
  }
  ++slots_[static_cast<size_t>(s)].num_users;
  return s;
}

void LoraSlots::release(int32_t slot) {
  CHECK(slot >= 0 && slot < std::ssize(slots_) && slots_[static_cast<size_t>(slot)].num_users > 0,
        "LoRA slots: release of slot ", slot, " that has no user");
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (--s.num_users == 0) s.idle_since = ++clock_;
}

int64_t LoraSlots::num_users(int32_t slot) const {
  return slots_.at(static_cast<size_t>(slot)).num_users;
}

std::vector<LoraLoad> LoraSlots::take_loads() {
  std::vector<LoraLoad> out;
  out.swap(loads_);
  return out;
}

}  // namespace hyserve
