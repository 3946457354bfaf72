#include "engine/lora_registry.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

std::string LoraEntry::key() const {
  return str_cat("lora:", generation, ":", name);
}

LoraRegistry::LoraRegistry(const Model& model, int64_t max_rank)
    : model_(model), max_rank_(max_rank) {
  CHECK(model.lora_enabled(), "LoRA registry: the model has no LoRA slots (enable_lora)");
}

void LoraRegistry::load(const std::string& name, const std::filesystem::path& path, bool replace) {
  CHECK(!name.empty(), "lora_name must not be empty");
  const auto taken = [&] {
    return std::any_of(entries_.begin(), entries_.end(),
                       [&](const LoraEntry& e) { return e.name == name; });
  };
  {
    std::lock_guard lock(mu_);
    if (!replace && taken()) {
      throw InvalidArgument(str_cat("The lora adapter '", name, "' has already been loaded."));
    }
  }
  // Read outside the lock: it takes a while and touches only immutable model state.
  std::shared_ptr<const LoraAdapter> adapter = model_.read_lora(path, name, max_rank_);
  std::lock_guard lock(mu_);
  if (!replace && taken()) {
    throw InvalidArgument(str_cat("The lora adapter '", name, "' has already been loaded."));
  }
  LoraEntry entry{name, path, next_generation_++, std::move(adapter)};
  const auto it = std::find_if(entries_.begin(), entries_.end(),
                               [&](const LoraEntry& e) { return e.name == name; });
  if (it != entries_.end()) {
    *it = std::move(entry);
  } else {
    entries_.push_back(std::move(entry));
  }
}

bool LoraRegistry::unload(const std::string& name) {
  std::lock_guard lock(mu_);
  const auto it = std::find_if(entries_.begin(), entries_.end(),
                               [&](const LoraEntry& e) { return e.name == name; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

std::optional<LoraEntry> LoraRegistry::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const LoraEntry& e : entries_) {
    if (e.name == name) return e;
  }
  return std::nullopt;
}

std::vector<LoraEntry> LoraRegistry::list() const {
  std::lock_guard lock(mu_);
  return entries_;
}

bool LoraRegistry::attach(const std::string& name, Request& request) const {
  const std::optional<LoraEntry> e = find(name);
  if (!e) return false;
  request.lora = e->adapter;
  request.lora_key = e->key();
  return true;
}

}  // namespace hyserve
