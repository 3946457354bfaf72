// Token sampling from one position's logits for `hyserve generate`: greedy
// (temperature 0, ties to the lower id) or temperature sampling from a generator
// seeded with SamplingParams::seed (0 when unset), so a seed reproduces its tokens
// on every run and machine. Only temperature and seed are read here.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>

#include "engine/sampling_params.h"

namespace hyserve {

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
