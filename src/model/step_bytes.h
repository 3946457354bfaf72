// The bytes a decode step must move, from a ModelConfig alone: the byte bound of a step
// (issue 51: a decode step at batch 1-8 is bound by reading its weights and cache, so its
// floor is these bytes over the copy rate measured in the same run; hyserve_step_bench
// prints it beside each step).
#pragma once

#include <cstdint>

#include "kv/cache_format.h"
#include "model/config.h"

namespace hyserve {

// A decode step of `batch` sequences, one new token each, every sequence with `context`
// tokens already cached, on one GPU of `tp` (TP ranks hold their share of the weights and
// of the KDA states; MLA latents and index keys are read whole: replicated under TP).
struct DecodeStepShape {
  int64_t batch = 1;
  int64_t context = 0;
  int64_t tp = 1;
  LatentCacheDtype latent = LatentCacheDtype::kBf16;
  IndexCacheDtype index = IndexCacheDtype::kFp8;
};

struct DecodeStepBytes {
  // Every weight but the routed experts and the embedding table, read once a step; of the
  // embeddings only the batch's rows (the table itself when tied to lm_head, which reads it).
  int64_t weights = 0;
  // The routed experts the batch touches, expected under uniform routing: per MoE layer
  // E (1 - (1 - k / E)^batch) distinct experts of the E, each read once (this rank's share).
  int64_t routed_experts = 0;
  // Per full-attention layer and sequence: the latent rows attended (context + 1; with the
  // DSA indexer at most index_topk of them) and, with the indexer, every index key scored
  // (context + 1).
  int64_t cache = 0;
  // Per KDA layer and sequence: the recurrent and conv states read and written back.
  int64_t kda_state = 0;
  int64_t total() const { return weights + routed_experts + cache + kda_state; }
};

DecodeStepBytes estimate_decode_step_bytes(const ModelConfig& c, const DecodeStepShape& s);

}  // namespace hyserve
