// The gated MLP, MODEL.md §5: y = down(silu(gate(x)) * up(x)). Dense layers use
// it directly; MoE experts and the shared experts are one MlpWeights each.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace hyserve {

struct MlpWeights {
  Weight gate;  // [I, D]
  Weight up;    // [I, D]
  Weight down;  // [D, I]
};

struct MlpParams {
  const float* x = nullptr;  // [num_tokens, D]
  const MlpWeights* w = nullptr;
  float* y = nullptr;  // [num_tokens, D]; may equal x
  int64_t num_tokens = 0;
};

// silu(v) = v / (1 + exp(-v)).
// Throws unless gate/up are [I, D] and down is [D, I] for one I.
namespace cpu {

void mlp(const MlpParams& p);
void check_mlp_weights(const MlpWeights& w, int64_t hidden);

}  // namespace cpu
}  // namespace hyserve
