// Parameters of the KDA (Kimi Delta Attention) ops, MODEL.md §4: the short causal
// conv, the log-decay gate, the q/k l2norm, the delta-rule recurrence (token by token
// and chunked) and the gated output RMSNorm. Plain pointers and sizes, shared by the
// CPU reference (cpu.h) and the CUDA kernels. All tensors are fp32, row-major,
// contiguous. T = num_tokens, H = num_heads, K = V = head_dim, C = channels,
// W = kernel_size.
#pragma once

#include <cstdint>

#include "core/host_device.h"

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
};

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

// Each row of x becomes x / sqrt(sum x^2 + 1e-6) * scale, in place (q and k before the
// delta rule).
struct L2NormRowsParams {
  float* x = nullptr;  // [rows, dim]
  int64_t rows = 0;    // >= 0
  int64_t dim = 0;
  float scale = 1.0f;  // K^-0.5 for q, 1 for k
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
};

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

// Most taps of the short conv kda_decode takes (Kimi Linear and K3 use 4).
inline constexpr int64_t kKdaMaxDecodeConv = 8;

// The whole KDA layer between its input projections and o_proj for a batch of requests
// decoding a few tokens each, over their states in the packed cache: per request and
// head, the short convs of q, k and v (their conv states carried), the gate, beta, the
// q/k l2norm, the delta-rule recurrence token by token (the state updated in place) and
// the gated output RMSNorm. Equal to running those ops one after the other on each
// request (cpu.h), token by token.
//
// Tokens are token-major [T, ...]; request r's tokens are [token_offsets[r],
// token_offsets[r + 1]) (any number, 0 included: a few, e.g. a sampled token and its
// speculative drafts, is what it is for), or token r alone when token_offsets is null. Request r's
// states live in cache row state_rows[r]: its conv states ([W-1, H*K] each, oldest first) at
// conv_state[i] + state_rows[r] * state_row_bytes bytes, its recurrent states [H, K, V] at state +
// state_rows[r] * state_row_bytes bytes. For CUDA, token_offsets, state_rows and every tensor are
// device memory.
//
// Speculative verification runs a request's sampled token and its drafts without writing
// any state (write_state false: the states are read, the outputs computed); once the
// accepted tokens are known, the same inputs run again with write_state, token_counts
// naming how many of each request's tokens to take and y null (no outputs): the states then
// hold exactly the accepted tokens.
struct KdaDecodeParams {
  const float* q = nullptr;     // [T, H*K] q_proj(x), before the conv
  const float* k = nullptr;     // [T, H*K] k_proj(x), before the conv
  const float* v = nullptr;     // [T, H*K] v_proj(x), before the conv
  const float* f = nullptr;     // [T, H*K] f_b(f_a(x)), before dt_bias
  const float* b = nullptr;     // [T, H] b_proj(x), before the sigmoid
  const float* gate = nullptr;  // [T, H*K] the output gate, before the sigmoid
  const float* conv_weight[3] = {nullptr, nullptr, nullptr};  // q, k, v: [H*K, W] each
  const float* dt_bias = nullptr;                             // [H*K]
  const float* a_log = nullptr;                               // [H]
  const float* o_norm = nullptr;                              // [K]
  float lower_bound = 0.0f;  // the gate's form (KdaGateParams::lower_bound)
  float eps = 0.0f;          // the output RMSNorm's epsilon
  float* conv_state[3] = {nullptr, nullptr, nullptr};  // q, k, v conv states of row 0
  float* state = nullptr;                              // recurrent states of row 0
  const int32_t* state_rows = nullptr;                 // [num_rows]
  int64_t state_row_bytes = 0;
  const int32_t* token_offsets = nullptr;  // [num_rows + 1], or null: one token per row
  int64_t num_rows = 0;                    // B
  int64_t num_tokens = 0;                  // T
  int64_t num_heads = 0;                   // H
  int64_t head_dim = 0;                    // K = V
  int64_t kernel_size = 0;                 // W
  // [T, H*K] out: rmsnorm(o) * o_norm * sigmoid(gate); null: no outputs (gate unused).
  float* y = nullptr;
  // [num_rows] or null: request r takes the first min(token_counts[r], its tokens) tokens.
  const int32_t* token_counts = nullptr;
  bool write_state = true;  // false: the conv and recurrent states are left as they were
};

// Where request r's states and tokens are.
HYSERVE_HOST_DEVICE inline char* kda_decode_row(const KdaDecodeParams& p, float* base, int64_t r) {
  return reinterpret_cast<char*>(base) + p.state_rows[r] * p.state_row_bytes;
}
HYSERVE_HOST_DEVICE inline int64_t kda_decode_first_token(const KdaDecodeParams& p, int64_t r) {
  return p.token_offsets == nullptr ? r : p.token_offsets[r];
}
HYSERVE_HOST_DEVICE inline int64_t kda_decode_row_tokens(const KdaDecodeParams& p, int64_t r) {
  const int64_t n = p.token_offsets == nullptr ? 1 : p.token_offsets[r + 1] - p.token_offsets[r];
  if (p.token_counts == nullptr) return n;
  const int64_t take = p.token_counts[r];
  return take < n ? (take > 0 ? take : 0) : n;
}

}  // namespace hyserve
