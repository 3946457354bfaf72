// The arguments the MLA decode kernels share (dsa_mla.cu: the mma.sync kernel, the split
// plan and the combine; dsa_mla_wgmma.cu: the warpgroup-MMA kernel for 64-head groups).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dsa/params.h"

namespace hyserve::cuda::dsa {

constexpr int kMlaTileKeys = 64;  // keys per tile of every MLA kernel (splits are whole tiles)

struct MlaArgs {
  DsaMlaParams p;
  int64_t num_splits;
  int64_t keys_per_split;  // multiple of kMlaTileKeys
  int64_t num_groups;      // head groups of the kernel's rows
  float* part_o;           // [B*n_q, H, splits, 512]
  float2* part_ml;         // [B*n_q, H, splits] (max, sum), base 2
};

// Heads per block of the warpgroup-MMA kernel (the wgmma's M); a last group of fewer heads
// is padded with zero rows.
constexpr int kMlaWgmmaHeads = 64;
// Shared memory of one block of it (one block per SM).
size_t mla_wgmma_shared_bytes();
// Launches it over grid (head groups, splits, B * n_q), the partials in a.part_o/part_ml.
void launch_mla_wgmma(const MlaArgs& a, dim3 grid, cudaStream_t stream);

}  // namespace hyserve::cuda::dsa
