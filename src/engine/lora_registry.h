// LoraRegistry: the LoRA adapters a server knows by name (serve --lora-modules, and
// /v1/load_lora_adapter at run time; issue 48). Any thread; the engine thread never waits
// on it beyond a lookup.
//
// Each load gets a generation, unique over the registry's life: a request's adapter is the
// (adapter, key) pair current when it was added, and the key ("lora:<generation>:<name>")
// seeds its prefix-cache hashes, so an adapter replaced under the same name never reuses
// the blocks its predecessor computed. Unloading or replacing only drops the registry's
// reference: requests in flight hold theirs (Request::lora) until they finish.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/model.h"

namespace hyserve {

struct LoraEntry {
  std::string name;
  std::filesystem::path path;
  uint64_t generation = 0;
  std::shared_ptr<const LoraAdapter> adapter;
  std::string key() const;  // the prefix-cache identity: "lora:<generation>:<name>"
};

class LoraRegistry {
 public:
  // model must have LoRA enabled; adapters of rank over max_rank are refused.
  LoraRegistry(const Model& model, int64_t max_rank);

  int64_t max_rank() const { return max_rank_; }
  // Reads and checks the PEFT folder and registers it as `name`. Throws InvalidArgument with
  // a message for the client: a bad adapter (naming the file, tensor or module), or the name
  // already loaded unless `replace` (then the new adapter takes the name; requests in
  // flight keep the old one).
  void load(const std::string& name, const std::filesystem::path& path, bool replace);
  // false when no adapter has that name.
  bool unload(const std::string& name);
  std::optional<LoraEntry> find(const std::string& name) const;
  std::vector<LoraEntry> list() const;  // in load order
  // Gives the request the named adapter (Request::lora, lora_key); false when unknown.
  bool attach(const std::string& name, Request& request) const;

 private:
  const Model& model_;
  int64_t max_rank_;
  mutable std::mutex mu_;
  std::vector<LoraEntry> entries_;  // guarded by mu_
  uint64_t next_generation_ = 1;    // guarded by mu_
};

}  // namespace hyserve
