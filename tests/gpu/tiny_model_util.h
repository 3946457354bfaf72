// The bundled model on the GPU and random prompts for it, shared by the GPU engine tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "model/model.h"

namespace hyserve::test {

inline std::unique_ptr<Model> load_tiny_on_gpu() {
  return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", {},
                     make_cuda_backend(0));
}

// n token ids in [3, vocab), from `seed`.
inline std::vector<int32_t> random_prompt(int64_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = tok(rng);
  return p;
}

}  // namespace hyserve::test
