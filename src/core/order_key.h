// The one tie rule of the codebase: every top-k, radix select and rank orders floats by
// float_order_key, larger first, and breaks ties by the lower index. The key's unsigned
// order is the float order of non-NaN values, with -0 == +0 (they tie). NaN keys sit above
// +inf (positive NaN) or below -inf (negative NaN); callers that must rank NaN last test
// for it themselves.
#pragma once

#include <bit>
#include <cstdint>

#include "core/host_device.h"

namespace hyserve {

HYSERVE_HOST_DEVICE inline uint32_t float_order_key(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t raw = __float_as_uint(x);
#else
  const uint32_t raw = std::bit_cast<uint32_t>(x);
#endif
  const uint32_t bits = x == 0.0f ? 0u : raw;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// (value desc, index asc) as one unique 64-bit key: larger means earlier. index < 2^32.
HYSERVE_HOST_DEVICE inline uint64_t float_rank_key(float x, int64_t index) {
  return (static_cast<uint64_t>(float_order_key(x)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(index));
}

}  // namespace hyserve
