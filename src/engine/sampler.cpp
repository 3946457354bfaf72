#include "engine/sampler.h"

#include <cmath>
#include <cstdio>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/error.h"

namespace hyserve {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed.value_or(0)) {
  CHECK(params.temperature >= 0.0f && std::isfinite(params.temperature),
        "temperature must be a finite number >= 0, got ", params.temperature);
}

int32_t argmax(std::span<const float> values) {
  CHECK(!values.empty(), "argmax of an empty vector");
  int32_t best = -1;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;
    if (best < 0 || values[i] > values[best]) best = static_cast<int32_t>(i);
  }
  CHECK(best >= 0, "all logits are NaN");
  return best;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t top = argmax(logits);
  if (params_.temperature == 0.0f) return top;
  // p_i = exp((l_i - max) / T) / Z, drawn by inverse CDF in double precision.
  std::vector<double> p(logits.size());
  double z = 0.0;
  const double inv_t = 1.0 / params_.temperature;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - logits[top]) * inv_t);
    z += p[i];
  }
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * z;
  double acc = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return top;
}

std::string hash_logits(std::span<const float> logits) {
  const uint64_t h = XXH64(logits.data(), logits.size_bytes(), 0);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace hyserve
