// Random prompts for the engine and model tests (CPU and GPU).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace hyserve::test {

// n token ids in [3, vocab) (ids below 3 are the bundled tokenizer's specials), from `seed`.
inline std::vector<int32_t> random_prompt(int64_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = tok(rng);
  return p;
}

}  // namespace hyserve::test
