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

namespace cpu {

void rms_norm(const RmsNormParams& p);
void layer_norm(const LayerNormParams& p);

}  // namespace cpu
}  // namespace hyserve
