// Argument checks of the batched-decode (state rows) mode, shared by the CPU and CUDA ops.
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

}  // namespace hyserve
