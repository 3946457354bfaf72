// The cache dtypes, their one parser (every command and benchmark reads `--kv-cache-dtype`
// and `--index-cache-dtype` through it), and the per-token and per-request cache footprints
// of each (MODEL.md §6). The block-cache planner and `hyserve info` size everything from
// these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kv/cache_spec.h"

namespace hyserve {

// How one full-attention layer stores its MLA latent [c (kv_lora) | k_pe (dr)].
enum class LatentCacheDtype {
  kBf16,           // 576 bf16
  kFp8,            // 576 e4m3 with a per-layer scale (K3.1 Pro's format)
  kFp8WithScales,  // 512 e4m3 + fp32 scale per 128 + bf16 k_pe (FlashMLA's layout)
  kNvfp4,          // 512 e2m1 + e4m3 scale per 16 + e4m3 k_pe
  kFp32,           // 576 fp32: the reference path (CPU, golden tests)
};

// How one full-attention layer stores its index key (index_head_dim values).
enum class IndexCacheDtype {
  kFp8,    // e4m3 + one fp32 scale
  kMxfp4,  // e2m1 + one e8m0 scale per 32
  kFp32,   // fp32: the reference path (exact scores, golden tests)
};

// What `--kv-cache-dtype auto` means for a model (docs/DECISIONS.md), on every device: a
// DSA model with the DSA kernels' 576-wide latent (kv_lora_rank 512 + rope 64, an indexer)
// caches fp8, the format DeepSeek-V3.2's and Kimi K3.1 Pro's own inference uses and the one
// the fused DSA decode step reads; every other model the checkpoint's dtype, bf16, as
// vLLM's auto.
LatentCacheDtype auto_latent_cache_dtype(const CacheSpec& spec);

std::string_view latent_cache_dtype_name(LatentCacheDtype t);
std::string_view index_cache_dtype_name(IndexCacheDtype t);
// The names the parsers accept, comma-separated: "auto, bf16, fp8, fp8_ds_mla, nvfp4, fp32"
// and "fp8, mxfp4, fp32".
std::string latent_cache_dtype_choices();
std::string index_cache_dtype_choices();
// `--kv-cache-dtype NAME`: "auto" (nullopt: auto_latent_cache_dtype of the model) or a
// latent_cache_dtype_name. `--index-cache-dtype NAME`: an index_cache_dtype_name. Anything
// else throws InvalidArgument naming the flag, the value and the choices. Whether the model
// runs a format is the model's to check (it refuses the ones it does not build).
std::optional<LatentCacheDtype> parse_latent_cache_dtype(std::string_view name);
// The parsed flag for this model: the dtype given, or auto's.
LatentCacheDtype resolve_latent_cache_dtype(std::optional<LatentCacheDtype> parsed,
                                            const CacheSpec& spec);
IndexCacheDtype parse_index_cache_dtype(std::string_view name);

// Bytes per token per full-attention layer.
int64_t latent_bytes_per_token(const CacheSpec& spec, LatentCacheDtype t);
int64_t index_key_bytes_per_token(const CacheSpec& spec, IndexCacheDtype t);  // 0: no indexer
// Of those, the bytes of the key's scales (fp8 4, mxfp4 index_head_dim / 32, fp32 0). An
// index-key page stores every token's codes first, then every token's scales.
int64_t index_key_scale_bytes_per_token(const CacheSpec& spec, IndexCacheDtype t);

// Bytes per token over all full-attention layers (one GPU holds every layer's latent
// and keys under TP: MLA latents are replicated).
int64_t cache_bytes_per_token(const CacheSpec& spec, LatentCacheDtype latent,
                              IndexCacheDtype index);

// Per-request KDA state over all KDA layers: conv states ((W-1) x 3 x H*K values, in
// fp32) plus the recurrent matrices (H x K x K fp32), on one GPU with `tp` KDA head shards.
int64_t kda_state_bytes_per_request(const CacheSpec& spec, int64_t tp = 1);

}  // namespace hyserve
