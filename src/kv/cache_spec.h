// CacheSpec: the facts of a model that the packed hybrid block cache's layout needs, and
// nothing else (DESIGN.md: kv/ takes a cache spec, it does not read the model config).
// The model produces it (ModelConfig::cache_spec()); the planner (cache_plan.h) and the
// byte counts (cache_format.h) read only this.
#pragma once

#include <cstdint>
#include <vector>

namespace hyserve {

// What one decoder layer keeps in the cache.
enum class CacheLayerKind {
  kKda,            // per-request KDA state (conv state + recurrent matrix), in a state row
  kFullAttention,  // per-token MLA latent (+ index keys with the indexer), in token rows
};

struct CacheSpec {
  std::vector<CacheLayerKind> layers;  // [num_layers], in model layer order

  // Full-attention layers. The MLA latent per token: [c (kv_lora_rank) | k_pe
  // (qk_rope_head_dim)], 512 + 64 = 576 values for K3.1 Pro and DeepSeek V3.2.
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  // The DSA index key per token: [index_head_dim] values (+ its scales); 0: no indexer.
  int64_t index_head_dim = 0;

  // KDA layers. One request's state per layer, fp32:
  //   conv      [3 (q, k, v), kda_conv_kernel - 1, kda_num_heads * kda_head_dim]
  //   recurrent [kda_num_heads, kda_head_dim (K), kda_head_dim (V)]
  // kda_num_heads is the whole model's; the planner splits it over TP.
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t kda_conv_kernel = 0;

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  bool is_kda(int64_t layer) const { return layers.at(layer) == CacheLayerKind::kKda; }
  int64_t num_kda_layers() const;
  int64_t num_full_attention_layers() const { return num_layers() - num_kda_layers(); }
  bool has_indexer() const { return index_head_dim > 0; }
};

inline int64_t CacheSpec::num_kda_layers() const {
  int64_t n = 0;
  for (CacheLayerKind k : layers) n += k == CacheLayerKind::kKda;
  return n;
}

}  // namespace hyserve
