// Argument checks of the KDA ops (and of their batched-decode state-rows mode), shared by
// the CPU and CUDA ops.
#pragma once

#include "kernels/kda/params.h"
#include "util/error.h"

namespace hyserve {

inline void check_conv_state_rows(const ShortConvParams& p) {
  if (p.state_rows == nullptr) return;
  CHECK(p.num_tokens == 1, "short_conv_silu: state rows take one token per sequence, got ",
        p.num_tokens);
  CHECK(p.channels_per_row > 0 && p.channels % p.channels_per_row == 0,
        "short_conv_silu: ", p.channels, " channels are not sequences of ", p.channels_per_row);
  CHECK(p.state_row_bytes > 0, "short_conv_silu: state_row_bytes = ", p.state_row_bytes);
}

inline void check_kda_state_rows(const KdaParams& p, const char* op) {
  if (p.state_rows == nullptr) return;
  CHECK(p.num_tokens <= 1, op, ": state rows take one token per sequence, got ", p.num_tokens);
  CHECK(p.heads_per_row > 0 && p.num_heads % p.heads_per_row == 0, op, ": ", p.num_heads,
        " heads are not sequences of ", p.heads_per_row);
  CHECK(p.state_row_bytes > 0, op, ": state_row_bytes = ", p.state_row_bytes);
}

// The delta-rule recurrence, token by token or chunked.
inline void check_kda_params(const KdaParams& p, const char* op) {
  CHECK(p.num_tokens >= 0, op, ": num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, op, ": num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, op, ": head_dim = ", p.head_dim);
  CHECK(p.state != nullptr, op, ": null state");
  check_kda_state_rows(p, op);
  if (p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.g != nullptr && p.beta != nullptr &&
            p.o != nullptr,
        op, ": null q, k, v, g, beta or o");
}

}  // namespace hyserve
