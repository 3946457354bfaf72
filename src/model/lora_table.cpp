// The resident adapters' views, and the merged kv_b copies of adapters that adapt kv_b.
#include "model/lora_table.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace hyserve {

bool LoraTable::merged_target(const std::string& name) {
  return name.ends_with(".kv_b_proj");
}

int64_t LoraTable::device_slot_bytes(const LoraTargets& targets, int64_t max_rank) {
  int64_t floats = 0;
  for (const LoraTargets::Target& t : targets.targets()) {
    floats += max_rank * (t.weight->rows + t.weight->cols);
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t LoraTable::device_bytes(const LoraTargets& targets, int64_t num_slots, int64_t max_rank) {
  const auto table = static_cast<int64_t>(targets.targets().size() * sizeof(LoraMatrices));
  return num_slots * (device_slot_bytes(targets, max_rank) + table);
}

LoraTable::LoraTable(const LoraTargets& targets, int64_t num_slots, Device* device,
                     int64_t max_rank)
    : targets_(targets),
      device_(device != nullptr && device->kind() != DeviceKind::kCpu ? device : nullptr),
      slots_(static_cast<size_t>(num_slots)),
      matrices_(targets.targets().size() * static_cast<size_t>(std::max<int64_t>(num_slots, 0))),
      users_(targets.targets().size(), 0) {
  CHECK(num_slots > 0, "LoRA: --max-loras must be positive, got ", num_slots);
  CHECK(max_rank > 0 && max_rank <= kMaxLoraRank, "LoRA: --max-lora-rank ", max_rank,
        " not in [1, ", kMaxLoraRank, "]");
  if (on_device()) {
    // Every slot's room now, before the KV pool takes the rest of the device.
    slot_floats_ = device_slot_bytes(targets, max_rank) / static_cast<int64_t>(sizeof(float));
    for (int64_t s = 0; s < num_slots; ++s) {
      slot_memory_.emplace_back(device_,
                                static_cast<size_t>(std::max<int64_t>(slot_floats_, 1)) * 4);
    }
    if (!matrices_.empty()) {
      device_matrices_ = DeviceAllocation(device_, matrices_.size() * sizeof(LoraMatrices));
    }
  }
}

bool LoraTable::merges(int64_t target) const {
  return !on_device() && merged_target(targets_.targets()[target].name);
}

void LoraTable::set(int64_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  CHECK(slot >= 0 && slot < num_slots(), "LoRA slot ", slot, " of ", num_slots());
  const std::vector<int64_t> users_before = users_;
  clear(slot);
  slots_[slot] = std::move(adapter);
  try {
    fill(slot);
  } catch (...) {
    // Nothing of a refused adapter stays: the slot is left empty.
    clear(slot);
    slots_[slot] = nullptr;
    ++layout_generation_;
    upload_matrices();
    throw;
  }
  for (size_t target = 0; target < users_.size(); ++target) {
    if ((users_[target] == 0) != (users_before[target] == 0)) {
      ++layout_generation_;
      break;
    }
  }
  upload_matrices();
}

void LoraTable::clear(int64_t slot) {
  const int64_t num = num_slots();
  for (size_t target = 0; target < users_.size(); ++target) {
    LoraMatrices& m = matrices_[target * num + slot];
    if (!m.empty()) --users_[target];
    m = {};
    merged_.erase({static_cast<int64_t>(target), slot});
  }
}

void LoraTable::fill(int64_t slot) {
  if (slots_[slot] == nullptr) return;
  const int64_t num = num_slots();
  // On a device: the slot's A and B, pair after pair, in its room.
  float* device_floats = nullptr;
  if (on_device()) {
    int64_t floats = 0;
    for (const LoraAdapter::Pair& p : slots_[slot]->pairs) {
      floats += std::ssize(p.a) + std::ssize(p.b);
    }
    CHECK(floats <= slot_floats_, "LoRA adapter ", slots_[slot]->name, ": ", floats,
          " values, over the slot's room of ", slot_floats_, " (rank over --max-lora-rank?)");
    device_floats = slot_memory_[slot].as<float>();
  }
  for (const LoraAdapter::Pair& p : slots_[slot]->pairs) {
    CHECK(p.target >= 0 && p.target < std::ssize(users_), "LoRA adapter ", slots_[slot]->name,
          ": pair of target ", p.target, " of ", users_.size());
    CHECK(p.rank > 0 && p.rank <= kMaxLoraRank, "LoRA adapter ", slots_[slot]->name, ": rank ",
          p.rank, " over ", kMaxLoraRank);
    if (merges(p.target)) {
      CHECK(!on_device(), "LoRA adapter ", slots_[slot]->name, ": ",
            targets_.targets()[p.target].name, " (kv_b_proj) is merged on the host only");
      // W' = W + scale * B A, row by row in fp32.
      const Weight& w = *targets_.targets()[p.target].weight;
      Merged& mg = merged_[{p.target, slot}];
      mg.data.resize(static_cast<size_t>(w.rows * w.cols));
      for (int64_t r = 0; r < w.rows; ++r) {
        float* row = mg.data.data() + r * w.cols;
        w.dequantize_row(r, row);
        for (int64_t c = 0; c < w.cols; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < p.rank; ++j) acc += p.b[r * p.rank + j] * p.a[j * w.cols + c];
          row[c] += p.scale * acc;
        }
      }
      mg.weight.format = WeightFormat::kDense;
      mg.weight.dtype = DType::kF32;
      mg.weight.rows = w.rows;
      mg.weight.cols = w.cols;
      mg.weight.data = mg.data.data();
      continue;
    }
    const float* a = p.a.data();
    const float* b = p.b.data();
    if (on_device()) {
      device_->upload(device_floats, p.a.data(), p.a.size() * sizeof(float));
      a = device_floats;
      device_floats += p.a.size();
      device_->upload(device_floats, p.b.data(), p.b.size() * sizeof(float));
      b = device_floats;
      device_floats += p.b.size();
    }
    matrices_[p.target * num + slot] = {a, b, p.rank, p.scale};
    ++users_[p.target];
  }
}

void LoraTable::upload_matrices() {
  if (!on_device() || matrices_.empty()) return;
  device_->upload(device_matrices_.data(), matrices_.data(),
                  matrices_.size() * sizeof(LoraMatrices));
}

const std::shared_ptr<const LoraAdapter>& LoraTable::adapter(int64_t slot) const {
  CHECK(slot >= 0 && slot < num_slots(), "LoRA slot ", slot, " of ", num_slots());
  return slots_[slot];
}

LoraModule LoraTable::module(int64_t target) const {
  if (target < 0 || users_[target] == 0) return {};
  const LoraMatrices* base =
      on_device() ? device_matrices_.as<const LoraMatrices>() : matrices_.data();
  return {base + target * num_slots(), num_slots()};
}

const LoraMatrices* LoraTable::matrices(int64_t target) const {
  CHECK(target >= 0 && target < std::ssize(users_), "LoRA target ", target, " of ", users_.size());
  const LoraMatrices* base =
      on_device() ? device_matrices_.as<const LoraMatrices>() : matrices_.data();
  return base + target * num_slots();
}

bool LoraTable::slot_merges(int64_t slot) const {
  for (const auto& [key, m] : merged_) {
    if (key.second == slot) return true;
  }
  return false;
}

const Weight* LoraTable::merged(int64_t target, int64_t slot) const {
  auto it = merged_.find({target, slot});
  return it == merged_.end() ? nullptr : &it->second.weight;
}

}  // namespace hyserve
