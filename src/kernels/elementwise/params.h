// Elementwise steps of the decoder that sit between the big ops: the residual add
// (MODEL.md §0), the sigmoid output gate (kimi_k3 attention), silu(gate) * up (the
// gated MLP, §5), a scale and a product (the DSA indexer's head weights times q scales). Flat
// arrays of n floats; n = 0 does nothing.
#pragma once

#include <cstdint>

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

// x[i] *= scale
struct SigmoidParams {
  float* x = nullptr;  // [n], x = sigmoid(x)
  int64_t n = 0;
};

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

// Decode context parallelism (model/tensor_parallel.h ContextParallel): rank `rank` of
// `size` caches position p iff p % size == rank, at the scheduler's slot; its keys are the
// positions rank, rank + size, ... (local key j is position j * size + rank), so a query at
// position p sees its local keys 0 .. (p - rank) / size (none when p < rank):
//   local_pos[i]   = pos[i] >= rank ? (pos[i] - rank) / size : -1
//   local_slot[i]  = pos[i] % size == rank ? slots[i] : -1
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
