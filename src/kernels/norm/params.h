// Row normalizations of the decoder: RMSNorm (input/post-attention norms, the
// MLA latent norms, KDA's output norm) and LayerNorm with bias (the DSA
// indexer's k_norm). MODEL.md §0, §3.
#pragma once

#include <cstdint>

namespace hyserve {

// y = x / sqrt(mean(x^2) + eps) * weight, per row. y may equal x (in place).
struct RmsNormParams {
  const float* x = nullptr;       // [num_rows, dim]
  const float* weight = nullptr;  // [dim]
  float* y = nullptr;             // [num_rows, dim]
  int64_t num_rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
};

// y = (x - mean) / sqrt(var + eps) * weight + bias, per row (biased variance).
// y may equal x (in place).
struct LayerNormParams {
  const float* x = nullptr;       // [num_rows, dim]
  const float* weight = nullptr;  // [dim]
  const float* bias = nullptr;    // [dim]
  float* y = nullptr;             // [num_rows, dim]
  int64_t num_rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
};

// Block attention residuals (Kimi K3, K3.md §3.2) fused with the RMSNorm that reads
// their output. Per token, over the candidates v_0..v_{n-1} = the snapshots and
// v_n = current (in that order):
//   s_i = sum_d v_i[d] / sqrt(mean(v_i^2) + res_eps) * query[d]
//   m   = sum_i softmax(s)_i * v_i           (the raw candidates, fp32)
//   y   = m / sqrt(mean(m^2) + norm_eps) * norm_weight
// query is the AttnRes pair folded into one vector: res_norm.weight * res_proj.weight.
struct AttnResNormParams {
  const float* snapshots = nullptr;  // snapshot j: [num_tokens, dim] at snapshots + j * stride
  int64_t snapshot_stride = 0;       // floats between snapshots (>= num_tokens * dim)
  int64_t num_snapshots = 0;         // n >= 0 (0: m = current)
  const float* current = nullptr;    // [num_tokens, dim]
  const float* query = nullptr;      // [dim]
  float res_eps = 1e-5f;
  const float* norm_weight = nullptr;  // [dim]
  float norm_eps = 1e-5f;
  float* y = nullptr;  // [num_tokens, dim]; must not alias the candidates
  int64_t num_tokens = 0;
  int64_t dim = 0;
};

namespace cpu {

void rms_norm(const RmsNormParams& p);
void layer_norm(const LayerNormParams& p);
void attn_res_norm(const AttnResNormParams& p);

}  // namespace cpu
}  // namespace hyserve
