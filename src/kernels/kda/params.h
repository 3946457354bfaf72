// Parameters of the KDA (Kimi Delta Attention) ops, MODEL.md §4: the short causal
// conv, the log-decay gate, the q/k l2norm, the delta-rule recurrence (token by token
// and chunked) and the gated output RMSNorm. Plain pointers and sizes, shared by the
// CPU reference (cpu.h) and the CUDA kernels. All tensors are fp32, row-major,
// contiguous. T = num_tokens, H = num_heads, K = V = head_dim, C = channels,
// W = kernel_size.
#pragma once

#include <cstdint>

#include "core/paged.h"

namespace hyserve {

// Tokens per chunk of the chunked KDA prefill. Its result depends on where the chunks
// fall, so the scheduler starts prefill chunks on multiples of it (exact prefix hits).
inline constexpr int64_t kKdaChunkSize = 64;

// Depthwise causal conv + SiLU over one request's tokens, carrying the conv state:
//   y_t[c] = silu(sum_{i<W} weight[c, i] * x_{t-(W-1)+i}[c]),
// where inputs before x[0] come from conv_state (zeros for a fresh request).
//
//   conv_state rows:  [ x_{-(W-1)} | ... | x_{-1} ]            before the call
//                     [ x_{T-(W-1)} | ... | x_{T-1} ]          after the call
struct ShortConvParams {
  const float* x = nullptr;       // [T, C]
  const float* weight = nullptr;  // [C, W] (checkpoint [C, 1, W] flattened)
  float* conv_state = nullptr;    // [W-1, C] oldest first; in/out; may be null when W == 1
  float* y = nullptr;             // [T, C], must not alias x
  int64_t num_tokens = 0;         // T >= 0; T == 0 leaves conv_state unchanged
  int64_t channels = 0;           // C
  int64_t kernel_size = 0;        // W
  // Batched decode (T == 1): C = B * channels_per_row channels of B sequences, sequence
  // b's conv state [W-1, channels_per_row] at conv_state + state_rows[b] * state_row_bytes
  // bytes (rows of the packed cache; device memory for CUDA). Unset: one sequence.
  const int32_t* state_rows = nullptr;  // [B]
  int64_t state_row_bytes = 0;
  int64_t channels_per_row = 0;
};

// Conv state of channel c (batched decode: its sequence's row), [W-1] strided by the
// sequence's channel count; and the weight row of c.
struct ShortConvChannel {
  float* state;
  int64_t state_stride;
  const float* weight;
};
HYSERVE_HOST_DEVICE inline ShortConvChannel short_conv_channel(const ShortConvParams& p,
                                                               int64_t c) {
  if (p.state_rows == nullptr) return {p.conv_state + c, p.channels, p.weight + c * p.kernel_size};
  const int64_t b = c / p.channels_per_row, ch = c % p.channels_per_row;
  float* base = p.conv_state == nullptr
                    ? nullptr
                    : reinterpret_cast<float*>(reinterpret_cast<char*>(p.conv_state) +
                                               p.state_rows[b] * p.state_row_bytes);
  return {base == nullptr ? nullptr : base + ch, p.channels_per_row, p.weight + ch * p.kernel_size};
}

// Per-channel log-decay, in one of two forms:
//   lower_bound == 0 (Kimi Linear): g = -exp(a_log[h]) * softplus(f + dt_bias), softplus
//     with threshold 20 (x > 20 -> x); g <= 0.
//   lower_bound < 0 (Kimi K3's gate_lower_bound, K3.md §3.3):
//     g = lower_bound * sigmoid(exp(a_log[h]) * (f + dt_bias)); lower_bound < g < 0.
struct KdaGateParams {
  const float* f = nullptr;        // [T, H*K] f_b(f_a(x)), before the bias
  const float* dt_bias = nullptr;  // [H*K]
  const float* a_log = nullptr;    // [H]
  float* g = nullptr;              // [T, H*K] out; may alias f
  int64_t num_tokens = 0;          // T >= 0
  int64_t num_heads = 0;           // H
  int64_t head_dim = 0;            // K
  float lower_bound = 0.0f;        // 0: the softplus form; < 0: the bounded form
};

// The gated delta rule, per head, state S [K, V]:
//   S = diag(exp(g_t)) S;  S += beta_t * k_t (v_t - S^T k_t)^T;  o_t = S^T q_t.
struct KdaParams {
  const float* q = nullptr;     // [T, H, K] l2-normed and scaled by K^-0.5
  const float* k = nullptr;     // [T, H, K] l2-normed
  const float* v = nullptr;     // [T, H, V]
  const float* g = nullptr;     // [T, H, K] log-decay, <= 0
  const float* beta = nullptr;  // [T, H]
  float* state = nullptr;       // [H, K, V] in/out
  float* o = nullptr;           // [T, H, V] out
  int64_t num_tokens = 0;       // T >= 0; T == 0 leaves state unchanged
  int64_t num_heads = 0;        // H
  int64_t head_dim = 0;         // K = V
  // Batched decode: H = B * heads_per_row heads of B sequences, sequence b's states
  // [heads_per_row, K, V] at state + state_rows[b] * state_row_bytes bytes (rows of the
  // packed cache; device memory for CUDA). Unset: one sequence, state [H, K, V].
  const int32_t* state_rows = nullptr;  // [B]
  int64_t state_row_bytes = 0;
  int64_t heads_per_row = 0;
};

// The [K, V] state of head h.
HYSERVE_HOST_DEVICE inline float* kda_head_state(const KdaParams& p, int64_t h) {
  const int64_t size = p.head_dim * p.head_dim;
  if (p.state_rows == nullptr) return p.state + h * size;
  return reinterpret_cast<float*>(reinterpret_cast<char*>(p.state) +
                                  p.state_rows[h / p.heads_per_row] * p.state_row_bytes) +
         (h % p.heads_per_row) * size;
}

// y = o / sqrt(mean_v(o^2) + eps) * weight * sigmoid(gate), normalized per head.
struct GatedRmsNormParams {
  const float* o = nullptr;       // [T, H, V]
  const float* weight = nullptr;  // [V] o_norm
  const float* gate = nullptr;    // [T, H*V] g_b(g_a(x)), before the sigmoid
  float* y = nullptr;             // [T, H*V]; may alias o
  float eps = 0.0f;               // the model's rms_norm_eps
  int64_t num_tokens = 0;         // T >= 0
  int64_t num_heads = 0;          // H
  int64_t head_dim = 0;           // V
};

}  // namespace hyserve
