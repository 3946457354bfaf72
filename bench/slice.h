// The benchmarks' model slice: two layers of a full-size config at its true dimensions
// (random weights), layer 0 = KDA + dense MLP, layer 1 = MLA with the DSA indexer + MoE,
// the two kinds of a Kimi K3 layer pair.
#pragma once

#include "model/config.h"

namespace hyserve::bench {

inline ModelConfig layer_slice(ModelConfig c) {
  c.num_hidden_layers = 2;
  c.layer_kinds = {LayerKind::kKda, LayerKind::kMla};
  c.mlp_kinds = {MlpKind::kDense, MlpKind::kMoe};
  return c;
}

}  // namespace hyserve::bench
