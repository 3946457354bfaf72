// RandomWeights: a TensorSource that makes every tensor a model asks for, with the
// right shape and storage format and values of a trained model's scale: bf16
// matrices ~ N(0, 1/cols), MXFP4 or INT4 routed experts (random e2m1 / int4 codes,
// scales of the same magnitude) when the config says so, norms at 1, KDA constants in
// their usual ranges. Used by benchmarks at the full size of a config, where no
// checkpoint exists.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <vector>

#include "model/config.h"
#include "model/tensor_source.h"

namespace hyserve {

class RandomWeights final : public TensorSource {
 public:
  RandomWeights(const ModelConfig& config, uint64_t seed);

  const TensorInfo* find(std::string_view) const override { return nullptr; }
  bool contains(std::string_view) const override { return true; }
  std::vector<float> load_f32(std::string_view name, std::vector<int64_t> shape) const override;
  Weight load_weight(const std::string& prefix, int64_t rows, int64_t cols) const override;
  const std::filesystem::path& dir() const override { return name_; }

  // Bytes of tensor data made so far.
  int64_t bytes() const { return bytes_; }

 private:
  uint64_t next_seed() const { return seed_ + 0x9e3779b97f4a7c15ULL * ++counter_; }
  // num_bytes bytes of splitmix64(seed + i), kept in storage_.
  const std::vector<uint8_t>& random_bytes(int64_t num_bytes, uint64_t seed) const;

  ModelConfig config_;
  uint64_t seed_;
  std::filesystem::path name_ = "<random weights>";
  mutable uint64_t counter_ = 0;
  mutable int64_t bytes_ = 0;
  mutable std::deque<std::vector<uint8_t>> storage_;  // elements never move
};

}  // namespace hyserve
