// Elementwise steps of the decoder that sit between the big ops: the residual add
// (MODEL.md §0), the sigmoid output gate (kimi_k3 attention), silu(gate) * up (the
// gated MLP, §5), a scale and a product (the DSA indexer's head weights times q scales). Flat
// arrays of n floats; n = 0 does nothing.
#pragma once

#include <cstdint>

#include "core/dcp_position.h"

namespace hyserve {

// h[i] += x[i]
struct ResidualAddParams {
  float* h = nullptr;        // [n]
  const float* x = nullptr;  // [n]
  int64_t n = 0;
};

// o[i] *= sigmoid(g[i]),  sigmoid(v) = 1 / (1 + exp(-v))
struct SigmoidGateParams {
  float* o = nullptr;        // [n]
  const float* g = nullptr;  // [n]
  int64_t n = 0;
};

// out[i] = silu(gate[i]) * up[i],  silu(v) = v / (1 + exp(-v)); out may equal gate or up.
struct SiluMulParams {
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* out = nullptr;         // [n]
  int64_t n = 0;
};

// x[i] = sigmoid(x[i])
struct SigmoidParams {
  float* x = nullptr;  // [n]
  int64_t n = 0;
};

// x[i] *= scale
struct ScaleParams {
  float* x = nullptr;  // [n]
  int64_t n = 0;
  float scale = 1.0f;
};

// y[i] *= x[i]
struct MulParams {
  float* y = nullptr;        // [n]
  const float* x = nullptr;  // [n]
  int64_t n = 0;
};

// A strided block copy of rows x width floats:
//   dst[r * dst_stride + j] = src[r * src_stride + j]
struct Copy2dParams {
  float* dst = nullptr;        // [rows, dst_stride]
  int64_t dst_stride = 0;      // floats
  const float* src = nullptr;  // [rows, src_stride]
  int64_t src_stride = 0;      // floats
  int64_t rows = 0;
  int64_t width = 0;  // floats per row, <= both strides
};

// Decode context parallelism (core/dcp_position.h's rule): rank `rank` of `size` caches
// position p iff dcp_owner(p, size) == rank, at the scheduler's slot; a query at position p
// sees its local keys 0 .. dcp_causal_bound(p, rank, size):
//   local_pos[i]   = dcp_causal_bound(pos[i], rank, size)      (-1: none)
//   local_slot[i]  = dcp_owner(pos[i], size) == rank ? slots[i] : -1
struct DcpLocalizeParams {
  const int64_t* pos = nullptr;    // [n]
  const int64_t* slots = nullptr;  // [n]
  int64_t n = 0;
  int64_t rank = 0;
  int64_t size = 1;
  int64_t* local_pos = nullptr;   // [n]
  int64_t* local_slot = nullptr;  // [n]
};

}  // namespace hyserve
