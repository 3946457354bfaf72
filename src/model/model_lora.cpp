// Model's LoRA adapters (issue 48): the slots, and the adapters' terms added in the forward
// (docs/DECISIONS.md "LoRA adapters (issue 48)"). A projection's output gets
// scale * (x A^T) B^T for the tokens whose slot's adapter adapts it (Backend::lora_add;
// inside Backend::mlp / moe for the MLPs and experts); kv_b_proj, read inside MLA's
// attention op, is replaced for a sequence by its adapter's merged copy on the host
// (LoraTable), and applied in low-rank form inside the op on a device
// (MlaAttentionParams::kv_b_lora).
#include <algorithm>
#include <vector>

#include "model/model.h"
#include "util/error.h"

namespace hyserve {

int64_t Model::lora_device_bytes(int64_t num_slots, int64_t max_rank) const {
  if (backend_->kind() == DeviceKind::kCpu || num_slots <= 0) return 0;
  const ParallelLayout& par = options_.parallel;
  const LoraTargets targets(weights_,
                            {par.tp.rank, par.tp.size, kv_b_ranks(), par.expert_parallel});
  return LoraTable::device_bytes(targets, num_slots, max_rank);
}

void Model::enable_lora(int64_t num_slots, int64_t max_rank) {
  // The rank's targets say how shard_weights cut each projection (LoraTargets), so that an
  // adapter of the whole model is cut alike (lora_share).
  const ParallelLayout& par = options_.parallel;
  // kv_b as shard_weights cut it: for the kv_b_ranks() ranks around this one.
  const LoraShard shard{par.tp.rank, par.tp.size, kv_b_ranks(), par.expert_parallel};
  lora_targets_ = std::make_unique<LoraTargets>(weights_, shard);
  const UnfrozenScope allocating(*backend_);
  lora_ = std::make_unique<LoraTable>(*lora_targets_, num_slots, backend_.get(), max_rank);
}

std::shared_ptr<const LoraAdapter> Model::read_lora(const std::filesystem::path& dir,
                                                    const std::string& name,
                                                    int64_t max_rank) const {
  CHECK(lora_ != nullptr, "LoRA adapter ", name, ": LoRA is not enabled (--enable-lora)");
  return share_lora(
      std::make_shared<LoraAdapter>(read_lora_adapter(dir, name, *lora_targets_, max_rank)));
}

std::shared_ptr<const LoraAdapter> Model::share_lora(
    std::shared_ptr<const LoraAdapter> whole) const {
  CHECK(lora_ != nullptr, "LoRA is not enabled (--enable-lora)");
  CHECK(whole != nullptr, "LoRA: no adapter");
  std::shared_ptr<const LoraAdapter> adapter =
      lora_targets_->whole()
          ? std::move(whole)
          : std::make_shared<const LoraAdapter>(lora_share(whole, *lora_targets_));
  const std::string& name = adapter->name;
  for (const LoraAdapter::Pair& p : adapter->pairs) {
    const std::string& module = lora_targets_->targets()[p.target].name;
    // The FP8 latent attends on the DSA kernels, whose kv_b is the model's (one per call).
    CHECK(!LoraTable::merged_target(module) || !attention_.fp8_latent(), "LoRA adapter ", name,
          ": module ", module, " (kv_b_proj) cannot be adapted with the FP8 latent cache");
  }
  return adapter;
}

void Model::set_lora(int64_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  CHECK(lora_ != nullptr, "LoRA is not enabled (--enable-lora)");
  lora_->set(slot, std::move(adapter));
}

bool Model::lora_applies(std::span<const SequenceInput> batch) const {
  if (lora_ == nullptr) return false;
  bool any = false;
  for (const SequenceInput& in : batch) {
    CHECK(in.lora_slot >= -1 && in.lora_slot < lora_->num_slots(), "sequence LoRA slot ",
          in.lora_slot, " of ", lora_->num_slots());
    any = any || (in.lora_slot >= 0 && lora_->adapter(in.lora_slot) != nullptr);
  }
  return any;
}

bool Model::lora_merges(int32_t slot) const {
  return lora_ != nullptr && slot >= 0 && lora_->slot_merges(slot);
}

int64_t Model::lora_generation() const {
  return lora_ != nullptr ? lora_->layout_generation() : 0;
}

const int32_t* Model::lora_token_slots(Workspace& ws, std::span<const SequenceSlice> seqs,
                                       int64_t t) const {
  if (lora_ == nullptr) return nullptr;
  bool any = false;
  for (const SequenceSlice& s : seqs) {
    CHECK(s.lora_slot >= -1 && s.lora_slot < lora_->num_slots(), "sequence LoRA slot ", s.lora_slot,
          " of ", lora_->num_slots());
    any = any || (s.lora_slot >= 0 && lora_->adapter(s.lora_slot) != nullptr);
  }
  if (!any) return nullptr;
  std::vector<int32_t> slots(static_cast<size_t>(t), -1);
  for (const SequenceSlice& s : seqs) {
    std::fill(slots.begin() + s.offset, slots.begin() + s.offset + s.n, s.lora_slot);
  }
  int32_t* dev = ws.ints(t);
  backend_->upload(dev, slots.data(), slots.size() * 4);
  return dev;
}

void Model::add_lora(const Pass& pass, const Weight& w, const float* x, int64_t t, float* y) const {
  if (pass.lora_slots == nullptr) return;
  const LoraModule m = lora_->module(lora_targets_->find(&w));
  if (m.empty()) return;
  backend_->lora_add({x, y, t, w.cols, w.rows, pass.lora_slots, m});
}

bool Model::mlp_lora(const Pass& pass, const MlpWeights& w, MlpLora& out) const {
  if (pass.lora_slots == nullptr) return false;
  out = {pass.lora_slots, lora_->module(lora_targets_->find(&w.gate)),
         lora_->module(lora_targets_->find(&w.up)), lora_->module(lora_targets_->find(&w.down))};
  return !out.gate.empty() || !out.up.empty() || !out.down.empty();
}

const Weight& Model::lora_kv_b(const MlaWeights& w, int32_t slot, const Weight& base) const {
  if (lora_ == nullptr || slot < 0) return base;
  const Weight* merged = lora_->merged(lora_targets_->find(&w.kv_b_proj), slot);
  return merged != nullptr ? *merged : base;
}

LoraModule Model::lora_kv_b_module(const Pass& pass, const MlaWeights& w) const {
  if (pass.lora_slots == nullptr) return {};
  const int64_t target = lora_targets_->find(&w.kv_b_proj);
  if (target < 0 || lora_->merges(target)) return {};
  return lora_->module(target);
}

bool Model::lora_splits_kv_b(const MlaWeights& w, std::span<const SequenceSlice> seqs) const {
  if (lora_ == nullptr) return false;
  for (const SequenceSlice& s : seqs) {
    if (&lora_kv_b(w, s.lora_slot, w.kv_b_proj) != &w.kv_b_proj) return true;
  }
  return false;
}

void Model::linear_into(const Pass& pass, const float* x, int64_t num_tokens, const Weight& w,
                        float* y) const {
  linear_into(x, num_tokens, w, y);
  add_lora(pass, w, x, num_tokens, y);
}

}  // namespace hyserve
