// Tiny models with the DSA kernels' dimensions, for the FP8-latent tests on the CPU
// (fp8_latent_test.cpp) and the GPU (gpu/fp8_latent_gpu_test.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kernels/attention/dsa/params.h"
#include "kv/cache_format.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "random_prompt.h"

namespace hyserve::test {

// A tiny config from `dir` (relative to the source tree) with the DSA kernels' dimensions:
// the 576-wide latent (kv_lora 512 + k_pe 64) and 16 index heads of 128; top-8, so
// contexts above 8 select.
inline ModelConfig dsa_config(const char* dir) {
  ModelConfig c = ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / dir);
  c.kv_lora_rank = kDsaLoraDim;
  c.qk_rope_head_dim = kDsaRopeDim;
  c.index_head_dim = kDsaIndexDim;
  c.index_n_heads = 16;
  c.index_topk = 8;
  if (c.index_rope_dims > 0) c.index_rope_dims = kDsaRopeDim;
  return c;
}

// Random weights (seed 11), FP8 index keys, the given latent format; backend null: CPU.
inline std::unique_ptr<Model> make_dsa_model(const ModelConfig& c, LatentCacheDtype latent,
                                             std::unique_ptr<Backend> backend = nullptr,
                                             AttentionBackend attention = AttentionBackend::kAuto) {
  ModelOptions o;
  o.indexer_fp8 = true;
  o.latent_cache = latent;
  o.attention_backend = attention;
  return Model::create(c, std::make_unique<RandomWeights>(c, 11), o, std::move(backend));
}

}  // namespace hyserve::test
