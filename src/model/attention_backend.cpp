#include "model/attention_backend.h"

#include <array>
#include <utility>

#include "backend/backend.h"  // the DSA kernels' shape limits (kernels/attention/dsa/params.h)
#include "util/error.h"

namespace hyserve {
namespace {

constexpr std::array<std::pair<AttentionBackend, std::string_view>, 5> kNames = {{
    {AttentionBackend::kAuto, "auto"},
    {AttentionBackend::kMla, "mla"},
    {AttentionBackend::kMlaSparse, "mla_sparse"},
    {AttentionBackend::kDsaFp8, "dsa_fp8"},
    {AttentionBackend::kDsaFp8Fused, "dsa_fp8_fused"},
}};

// Why the fused DSA decode step cannot run (empty: it can).
std::string fused_blocker(const ModelConfig& c, const AttentionInputs& in) {
  if (!in.indexer_fp8) return "it needs FP8 index keys (--index-cache-dtype fp8)";
  if (in.dcp_size > 1) return "not under DCP (its top-k would be the rank's own)";
  if (c.index_head_dim != kDsaIndexDim || c.index_n_heads % 16 != 0 || c.index_n_heads > 64 ||
      c.index_topk > kDsaMaxTopk) {
    return str_cat("index heads ", c.index_n_heads, " x ", c.index_head_dim, ", top-", c.index_topk,
                   " outside its shapes (16-64 heads of ", kDsaIndexDim, ", top-k <= ", kDsaMaxTopk,
                   ")");
  }
  return "";
}

[[noreturn]] void refuse(AttentionBackend b, std::string_view why) {
  throw InvalidArgument(
      str_cat("attention backend ", attention_backend_name(b), " cannot run: ", why));
}

}  // namespace

std::string_view attention_backend_name(AttentionBackend b) {
  for (const auto& [backend, name] : kNames)
    if (backend == b) return name;
  return "?";
}

AttentionBackend parse_attention_backend(std::string_view name) {
  std::string all;
  for (const auto& [backend, n] : kNames) {
    if (n == name) return backend;
    all += all.empty() ? std::string(n) : str_cat(", ", n);
  }
  throw InvalidArgument(str_cat("unknown attention backend '", name, "' (one of ", all, ")"));
}

AttentionChoice choose_attention_backend(const ModelConfig& c, const AttentionInputs& in) {
  const bool fp8 = in.latent_cache == LatentCacheDtype::kFp8;
  if (fp8 && !c.has_indexer()) {
    throw InvalidArgument(str_cat(
        "--kv-cache-dtype fp8 needs a model with the DSA indexer (index_topk > 0): the FP8 ",
        "latent is read by the sparse DSA kernels; this ", c.model_type_name,
        " model has none (use --kv-cache-dtype fp32)"));
  }
  if (fp8 && (c.kv_lora_rank != kDsaLoraDim || c.qk_rope_head_dim != kDsaRopeDim)) {
    throw InvalidArgument(str_cat("--kv-cache-dtype fp8 needs kv_lora_rank ", kDsaLoraDim,
                                  " and qk_rope_head_dim ", kDsaRopeDim,
                                  " (the DSA kernels' 576-byte latent), got ", c.kv_lora_rank,
                                  " and ", c.qk_rope_head_dim));
  }
  AttentionChoice choice;
  if (!fp8) {
    choice.backend = c.has_indexer() ? AttentionBackend::kMlaSparse : AttentionBackend::kMla;
  } else {
    const std::string blocker = fused_blocker(c, in);
    choice.backend = blocker.empty() ? AttentionBackend::kDsaFp8Fused : AttentionBackend::kDsaFp8;
    choice.why_not_fused = blocker;
  }
  const AttentionBackend want = in.requested;
  if (want == AttentionBackend::kAuto || want == choice.backend) return choice;
  // The one free choice: the unfused DSA path where the fused one would run.
  if (want == AttentionBackend::kDsaFp8 && choice.backend == AttentionBackend::kDsaFp8Fused) {
    choice.backend = AttentionBackend::kDsaFp8;
    choice.why_not_fused = "turned off (--attention-backend dsa_fp8)";
    return choice;
  }
  if (want == AttentionBackend::kDsaFp8Fused && choice.backend == AttentionBackend::kDsaFp8)
    refuse(want, choice.why_not_fused);
  if (want == AttentionBackend::kDsaFp8 || want == AttentionBackend::kDsaFp8Fused) {
    refuse(want, str_cat("it reads the FP8 latent, and the latent cache is ",
                         latent_cache_dtype_name(in.latent_cache), " (--kv-cache-dtype fp8)"));
  }
  if (want == AttentionBackend::kMla) {
    refuse(want, fp8 ? "the FP8 latent is read by the DSA kernels only"
                     : str_cat("this ", c.model_type_name,
                               " model has the DSA indexer: its layers attend over the top-",
                               c.index_topk, " keys"));
  }
  // kMlaSparse
  refuse(want, fp8 ? "the FP8 latent is read by the DSA kernels only"
                   : str_cat("this ", c.model_type_name, " model has no DSA indexer"));
}

std::string AttentionChoice::describe() const {
  switch (backend) {
    case AttentionBackend::kMla:
      return "mla (dense MLA over every causal key)";
    case AttentionBackend::kMlaSparse:
      return "mla_sparse (generic indexer -> causal top-k -> MLA over the top-k)";
    case AttentionBackend::kDsaFp8:
      return str_cat("dsa_fp8 (sparse MLA over the FP8 latent; decode: generic indexer path, ",
                     "the fused DSA decode step ", why_not_fused, ")");
    case AttentionBackend::kDsaFp8Fused:
      return "dsa_fp8_fused (sparse MLA over the FP8 latent; decode: fused DSA decode step; "
             "prefill: DSA kernels)";
    case AttentionBackend::kAuto:
      break;
  }
  return "auto";
}

}  // namespace hyserve
