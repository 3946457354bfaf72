// Argument checks shared by the CUDA KDA recurrence kernels (kda_recurrence.cu,
// kda_chunked.cu): the CPU checks plus the head_dim limit of the CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/kda/check.h"
#include "kernels/kda/params.h"
#include "util/error.h"

namespace hyserve::cuda {

inline constexpr int64_t kKdaMaxHeadDim = 128;

inline void check_kda_params(const KdaParams& p, const char* op) {
  CHECK(p.num_tokens >= 0, op, ": num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0 && p.num_heads < 65536, op, ": num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0 && p.head_dim <= kKdaMaxHeadDim, op, ": head_dim = ", p.head_dim,
        " (the CUDA kernels take 1..", kKdaMaxHeadDim, ")");
  CHECK(p.state != nullptr, op, ": null state");
  check_kda_state_rows(p, op);
  if (p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.g != nullptr && p.beta != nullptr &&
            p.o != nullptr,
        op, ": null q, k, v, g, beta or o");
}

}  // namespace hyserve::cuda
