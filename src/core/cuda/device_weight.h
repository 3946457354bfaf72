// DeviceWeight: a Weight's matrix and scales copied to GPU memory, owned. view()
// is the same Weight with device pointers, which is what the CUDA ops take: the
// Weight struct itself stays in host memory, its data lives on the device.
#pragma once

#include "core/cuda/device_buffer.h"
#include "core/weight.h"

namespace hyserve::cuda {

class DeviceWeight {
 public:
  DeviceWeight() = default;

  // Copies host.data (and host.scales for FP8 / MXFP4 / INT4) to the device; synchronous.
  static DeviceWeight upload(const Weight& host);

  // Same format, dtype and shape as the uploaded weight; data / scales are device pointers.
  const Weight& view() const { return view_; }

 private:
  DeviceBuffer data_;
  DeviceBuffer scales_;
  Weight view_;
};

}  // namespace hyserve::cuda
