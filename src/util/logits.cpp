#include "util/logits.h"

#include <cmath>
#include <cstdio>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/error.h"

namespace hyserve {

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

std::string hash_logits(std::span<const float> logits) {
  const uint64_t h = XXH64(logits.data(), logits.size_bytes(), 0);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace hyserve
