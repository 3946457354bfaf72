// Argument checks shared by the CUDA KDA recurrence kernels (kda_recurrence.cu,
// kda_chunked.cu): the CPU checks plus the head_dim limit of the CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/kda/check.h"
#include "kernels/kda/params.h"
#include "util/error.h"

namespace hyserve::cuda {

inline constexpr int64_t kKdaMaxHeadDim = 128;

// The shared checks plus the CUDA kernels' limits (grid y, shared-memory tiles).
inline void check_cuda_kda_params(const KdaParams& p, const char* op) {
  check_kda_params(p, op);
  CHECK(p.num_heads < 65536, op, ": num_heads = ", p.num_heads);
  CHECK(p.head_dim <= kKdaMaxHeadDim, op, ": head_dim = ", p.head_dim,
        " (the CUDA kernels take 1..", kKdaMaxHeadDim, ")");
}

}  // namespace hyserve::cuda
