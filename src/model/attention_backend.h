// How the MLA layers attend, chosen once when the model loads (as vLLM picks an attention
// backend) from the config, the cache formats and the parallel layout, and printed by
// `hyserve info` and at serve start. The model's attention code switches on this choice;
// the kernels below it take no variant flags of their own.
//
//   backend         latent cache   indexer   path (ops of kernels/attention/)
//   mla             fp32 / bf16    none      mla_attention over every causal key
//   mla_sparse      fp32 / bf16    DSA       indexer -> causal_topk -> mla_attention on top-k
//   dsa_fp8         FP8            DSA       mla_absorb_q -> indexer -> causal_topk ->
//                                            dsa_query_slots -> dsa_mla_decode -> mla_project_uv
//   dsa_fp8_fused   FP8            DSA, FP8  as dsa_fp8, decode batches in one dsa_decode
//                                  keys      step (indexer, top-k and sparse MLA fused)
//
// The latent cache and the indexer fix the family; the one free choice is dsa_fp8 vs
// dsa_fp8_fused (the same selection and attention; the fused step is the faster decode).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kv/cache_format.h"
#include "model/config.h"

namespace hyserve {

enum class AttentionBackend { kAuto, kMla, kMlaSparse, kDsaFp8, kDsaFp8Fused };

// "auto", "mla", "mla_sparse", "dsa_fp8", "dsa_fp8_fused".
std::string_view attention_backend_name(AttentionBackend b);
// The backend a name names; throws InvalidArgument listing the names otherwise.
AttentionBackend parse_attention_backend(std::string_view name);

// What the choice depends on besides the config.
struct AttentionInputs {
  LatentCacheDtype latent_cache = LatentCacheDtype::kFp32;
  bool indexer_fp8 = false;  // FP8 index keys
  int dcp_size = 1;          // decode context parallelism
  AttentionBackend requested = AttentionBackend::kAuto;
};

struct AttentionChoice {
  AttentionBackend backend = AttentionBackend::kMla;
  // Why dsa_fp8 runs rather than dsa_fp8_fused (empty otherwise).
  std::string why_not_fused;

  bool sparse() const { return backend != AttentionBackend::kMla; }
  bool fp8_latent() const {
    return backend == AttentionBackend::kDsaFp8 || backend == AttentionBackend::kDsaFp8Fused;
  }
  bool fused_decode() const { return backend == AttentionBackend::kDsaFp8Fused; }
  // One line: the backend and the path it runs.
  std::string describe() const;
};

// The backend of a model of config `c` (this rank's) under `in`. The FP8 latent needs the
// DSA indexer and the DSA kernels' 576-wide latent (kv_lora_rank 512 + 64 RoPE dims). Auto takes
// the fused DSA decode where its shapes allow; a requested backend the config or the cache formats
// rule out throws InvalidArgument saying why (a DSA model cannot attend densely, the FP8
// latent needs the DSA kernels, the fused step needs FP8 index keys, no DCP, 16-64 index
// heads of 128 dims and a top-k within its limit).
AttentionChoice choose_attention_backend(const ModelConfig& c, const AttentionInputs& in);

}  // namespace hyserve
