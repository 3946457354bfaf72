// Argument checks of the KDA ops, shared by the CPU and CUDA ops.
#pragma once

#include <cmath>

#include "kernels/kda/params.h"
#include "util/error.h"

namespace hyserve {

// The delta-rule recurrence, token by token or chunked.
inline void check_kda_params(const KdaParams& p, const char* op) {
  CHECK(p.num_tokens >= 0, op, ": num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, op, ": num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, op, ": head_dim = ", p.head_dim);
  CHECK(p.state != nullptr, op, ": null state");
  if (p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.g != nullptr && p.beta != nullptr &&
            p.o != nullptr,
        op, ": null q, k, v, g, beta or o");
}

// kda_decode's arguments (row lengths are not read: CUDA's token_offsets is device memory).
inline void check_kda_decode_params(const KdaDecodeParams& p) {
  CHECK(p.num_rows >= 0 && p.num_tokens >= 0, "kda_decode: num_rows = ", p.num_rows,
        ", num_tokens = ", p.num_tokens);
  CHECK(p.token_offsets != nullptr || p.num_tokens == p.num_rows, "kda_decode: ", p.num_tokens,
        " tokens for ", p.num_rows, " rows of one token each");
  CHECK(p.num_heads > 0 && p.head_dim > 0, "kda_decode: num_heads = ", p.num_heads,
        ", head_dim = ", p.head_dim);
  CHECK(p.kernel_size >= 1 && p.kernel_size <= kKdaMaxDecodeConv,
        "kda_decode: kernel_size = ", p.kernel_size, " (1..", kKdaMaxDecodeConv, ")");
  CHECK(p.lower_bound <= 0.0f && std::isfinite(p.lower_bound),
        "kda_decode: lower_bound = ", p.lower_bound);
  CHECK(p.eps >= 0.0f, "kda_decode: eps = ", p.eps);
  if (p.num_rows == 0 || p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.f != nullptr && p.b != nullptr,
        "kda_decode: null q, k, v, f or b");
  CHECK(p.y == nullptr || p.gate != nullptr, "kda_decode: outputs asked without the gate");
  CHECK(p.y != nullptr || p.write_state, "kda_decode: neither outputs nor states to write");
  CHECK(p.conv_weight[0] != nullptr && p.conv_weight[1] != nullptr && p.conv_weight[2] != nullptr &&
            p.dt_bias != nullptr && p.a_log != nullptr && p.o_norm != nullptr,
        "kda_decode: null conv weights, dt_bias, a_log or o_norm");
  CHECK(p.kernel_size == 1 || (p.conv_state[0] != nullptr && p.conv_state[1] != nullptr &&
                               p.conv_state[2] != nullptr),
        "kda_decode: null conv state");
  CHECK(p.state != nullptr && p.state_rows != nullptr && p.state_row_bytes > 0,
        "kda_decode: null state or state rows, or state_row_bytes = ", p.state_row_bytes);
}

}  // namespace hyserve
