#include "model/step_bytes.h"

#include <algorithm>
#include <cmath>

#include "model/weight_bytes.h"
#include "util/error.h"

namespace hyserve {

DecodeStepBytes estimate_decode_step_bytes(const ModelConfig& c, const DecodeStepShape& s) {
  CHECK(s.batch >= 1 && s.context >= 0 && s.tp >= 1, "decode step shape: batch ", s.batch,
        ", context ", s.context, ", tp ", s.tp);
  DecodeStepBytes b;
  const WeightBytes w = estimate_weight_bytes_per_gpu(c, s.tp);
  // The embedding table (bf16, this rank's vocabulary share): only the batch's rows are read,
  // unless lm_head is the same table.
  const int64_t vocab_shard = (c.vocab_size + s.tp - 1) / s.tp;
  const int64_t table = 2 * vocab_shard * c.hidden_size;
  b.weights = w.replicated + w.sharded;
  if (!c.tie_word_embeddings) b.weights += std::min(table, s.batch * 2 * c.hidden_size) - table;
  // Routed experts: the per-expert share of this rank, times the expected distinct experts.
  int64_t moe_layers = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) moe_layers += c.is_moe(layer);
  if (moe_layers > 0 && c.num_experts > 0) {
    const double per_expert =
        static_cast<double>(w.routed_experts) / static_cast<double>(moe_layers * c.num_experts);
    const double e = static_cast<double>(c.num_experts);
    const double k = static_cast<double>(std::min(c.num_experts_per_tok, c.num_experts));
    const double distinct = e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(s.batch)));
    b.routed_experts = static_cast<int64_t>(std::llround(per_expert * distinct)) * moe_layers;
  }
  const CacheSpec spec = c.cache_spec();
  const int64_t keys = s.context + 1;
  const int64_t attended = c.has_indexer() ? std::min(keys, c.index_topk) : keys;
  const int64_t per_layer = attended * latent_bytes_per_token(spec, s.latent) +
                            (c.has_indexer() ? keys * index_key_bytes_per_token(spec, s.index) : 0);
  b.cache = s.batch * spec.num_full_attention_layers() * per_layer;
  b.kda_state = s.batch * 2 * kda_state_bytes_per_request(spec, s.tp);
  return b;
}

}  // namespace hyserve
