// Parameter counts derived from a ModelConfig alone (no checkpoint needed), so
// `hyserve info` can size a full-scale model from its config.json.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace hyserve {

struct ParamCount {
  int64_t total = 0;          // every parameter
  int64_t active = 0;         // used per token: all but the routed experts not chosen
  int64_t embedding = 0;      // embed_tokens + lm_head (+ final norm)
  int64_t attention_mla = 0;  // MLA + indexer, all full-attention layers
  int64_t attention_kda = 0;  // all KDA layers
  int64_t dense_mlp = 0;
  int64_t routed_experts = 0;  // all routed experts of all MoE layers
  int64_t moe_other = 0;       // router, shared experts, latent projections and norm
  int64_t norms = 0;           // per-layer input / post-attention norms, AttnRes pairs
};

int64_t mla_layer_params(const ModelConfig& c);      // incl. indexer and output gate
int64_t indexer_layer_params(const ModelConfig& c);  // 0 without indexer
int64_t kda_layer_params(const ModelConfig& c);
ParamCount count_params(const ModelConfig& c);

}  // namespace hyserve
