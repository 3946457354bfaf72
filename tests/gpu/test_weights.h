// Device copies of the quantized test weights (tests/quantized_weights.h) for the GPU
// op tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cuda/device_weight.h"
#include "quantized_weights.h"

namespace hyserve::test {

// The same MLP on the device; w holds the device views.
struct DeviceMlp {
  cuda::DeviceWeight gate, up, down;
  MlpWeights w;
};

inline DeviceMlp upload(const HostMlp& m) {
  DeviceMlp d{cuda::DeviceWeight::upload(m.gate.w),
              cuda::DeviceWeight::upload(m.up.w),
              cuda::DeviceWeight::upload(m.down.w),
              {}};
  d.w = MlpWeights{d.gate.view(), d.up.view(), d.down.view()};
  return d;
}

inline float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace hyserve::test
