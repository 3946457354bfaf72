// The LoRA tests' adapter (a PEFT folder written here) and a sequence run with an adapter slot.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/safetensors.h"
#include "model/workspace.h"

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

// One sequence run step by step (each step's tokens one forward, all positions' logits) with
// LoRA slot `slot` (-1: none): each step's logits.
inline std::vector<std::vector<float>> run_steps(const Model& model,
                                                 const std::vector<std::vector<int32_t>>& steps,
                                                 int32_t slot) {
  Workspace ws(&model.backend());
  SequenceState st = model.new_sequence();
  std::vector<std::vector<float>> out;
  for (const std::vector<int32_t>& tokens : steps) {
    SequenceInput in = model.prepare(st, tokens, true);
    in.lora_slot = slot;
    std::vector<float>& l = out.emplace_back();
    model.forward(std::span<const SequenceInput>(&in, 1), l, ws);
    st.num_tokens += static_cast<int64_t>(tokens.size());
  }
  return out;
}

// run_steps' logits end to end.
inline std::vector<float> run_steps_flat(const Model& model,
                                         const std::vector<std::vector<int32_t>>& steps,
                                         int32_t slot) {
  std::vector<float> all;
  for (const std::vector<float>& l : run_steps(model, steps, slot)) {
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

}  // namespace hyserve::test
