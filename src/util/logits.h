// The argmax and a hash of a row of logits: greedy checks in tests, and the hash that
// `hyserve generate` prints so backends and commits compare at a glance.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace hyserve {

// Index of the largest value; the lowest index among equals. NaN never wins.
int32_t argmax(std::span<const float> values);

// xxh64 of the values' bytes, as 16 hex digits: compares logits across runs at a glance.
std::string hash_logits(std::span<const float> logits);

}  // namespace hyserve
