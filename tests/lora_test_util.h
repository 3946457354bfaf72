// The LoRA tests' adapter: a PEFT folder written here.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/safetensors.h"

namespace hyserve::test {

// A PEFT folder with random A, B (fixed seed) of rank 4 on every target of the model (those
// `keep` accepts, by canonical name, when given).
inline std::filesystem::path write_adapter(
    const Model& model, const std::filesystem::path& dir, uint32_t seed,
    const std::function<bool(const std::string&)>& keep = {}) {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorToWrite> tensors;
  const int64_t rank = 4;
  const auto tensor = [](std::string name, std::vector<int64_t> shape, std::vector<float> v) {
    TensorToWrite t{std::move(name), DType::kF32, std::move(shape), {}};
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  };
  for (const LoraTargets::Target& t : model.lora_targets()->targets()) {
    if (keep && !keep(t.name)) continue;
    const Weight& w = *t.weight;
    std::vector<float> a(static_cast<size_t>(rank * w.cols)), b(static_cast<size_t>(w.rows * rank));
    for (float& v : a) v = normal(rng) / std::sqrt(static_cast<float>(w.cols));
    for (float& v : b) v = 0.05f * normal(rng);
    const std::string module = "base_model.model.model." + t.name;
    tensors.push_back(tensor(module + ".lora_A.weight", {rank, w.cols}, std::move(a)));
    tensors.push_back(tensor(module + ".lora_B.weight", {w.rows, rank}, std::move(b)));
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  const nlohmann::json config = {
      {"r", rank}, {"lora_alpha", 8}, {"target_modules", "all-linear"}, {"peft_type", "LORA"}};
  std::ofstream(dir / "adapter_config.json") << config.dump();
  return dir;
}

}  // namespace hyserve::test
