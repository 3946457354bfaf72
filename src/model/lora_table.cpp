// The resident adapters' views, and the merged kv_b copies of adapters that adapt kv_b.
#include "model/lora_table.h"

#include <string>

#include "util/error.h"

namespace hyserve {

LoraTable::LoraTable(const LoraTargets& targets, int64_t num_slots)
    : targets_(targets),
      slots_(static_cast<size_t>(num_slots)),
      matrices_(targets.targets().size(),
                std::vector<LoraMatrices>(static_cast<size_t>(num_slots))),
      users_(targets.targets().size(), 0) {
  CHECK(num_slots > 0, "LoRA: --max-loras must be positive, got ", num_slots);
}

bool LoraTable::merges(int64_t target) const {
  const std::string& name = targets_.targets()[target].name;
  const std::string_view kvb = ".kv_b_proj";
  return name.size() > kvb.size() && name.compare(name.size() - kvb.size(), kvb.size(), kvb) == 0;
}

void LoraTable::set(int64_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  CHECK(slot >= 0 && slot < num_slots(), "LoRA slot ", slot, " of ", num_slots());
  for (size_t target = 0; target < matrices_.size(); ++target) {
    LoraMatrices& m = matrices_[target][slot];
    if (!m.empty()) --users_[target];
    m = {};
    merged_.erase({static_cast<int64_t>(target), slot});
  }
  slots_[slot] = std::move(adapter);
  if (slots_[slot] == nullptr) return;
  for (const LoraAdapter::Pair& p : slots_[slot]->pairs) {
    if (merges(p.target)) {
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
    matrices_[p.target][slot] = {p.a.data(), p.b.data(), p.rank, p.scale};
    ++users_[p.target];
  }
}

const std::shared_ptr<const LoraAdapter>& LoraTable::adapter(int64_t slot) const {
  CHECK(slot >= 0 && slot < num_slots(), "LoRA slot ", slot, " of ", num_slots());
  return slots_[slot];
}

LoraModule LoraTable::module(int64_t target) const {
  if (target < 0 || users_[target] == 0) return {};
  return {matrices_[target].data(), num_slots()};
}

const Weight* LoraTable::merged(int64_t target, int64_t slot) const {
  auto it = merged_.find({target, slot});
  return it == merged_.end() ? nullptr : &it->second.weight;
}

}  // namespace hyserve
