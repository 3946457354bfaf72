// CUDA RoPE rotations (params.h, cpu.h for the formulas; x and positions are device
// pointers). The table's inv_freq lives on the device; cos / sin are computed in the
// kernel in fp32 from float(pos) * inv_freq[i] and scaled by attention_factor, as the
// CPU op does, so results differ from it only by cosf / sinf rounding (<= 2 ulp).
#pragma once

#include <cuda_runtime_api.h>

#include "core/cuda/device_buffer.h"
#include "kernels/rope/params.h"

namespace hyserve::cuda {

struct DeviceRopeTable {
  int64_t rotary_dim = 0;
  float attention_factor = 1.0f;
  DeviceBuffer inv_freq;  // [rotary_dim / 2] fp32

  // Copies table.inv_freq to the device; synchronous.
  static DeviceRopeTable upload(const RopeTable& table);
};

void apply_rope_interleaved(const DeviceRopeTable& table, const RopeParams& p, cudaStream_t stream);
void apply_rope_neox(const DeviceRopeTable& table, const RopeParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
