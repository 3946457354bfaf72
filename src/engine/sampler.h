// Token sampling from one position's logits: greedy (temperature 0, ties to the
// lower id) or temperature sampling from a seeded generator, so a seed reproduces
// its tokens on every run and machine.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>

namespace hyserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Index of the largest value; the lowest index among equals. NaN never wins.
int32_t argmax(std::span<const float> values);

// xxh64 of the values' bytes, as 16 hex digits: compares logits across runs at a glance.
std::string hash_logits(std::span<const float> logits);

}  // namespace hyserve
