#include "kv/cache_format.h"

#include "util/error.h"

namespace hyserve {

std::string_view latent_cache_dtype_name(LatentCacheDtype t) {
  switch (t) {
    case LatentCacheDtype::kBf16:
      return "bf16";
    case LatentCacheDtype::kFp8:
      return "fp8";
    case LatentCacheDtype::kFp8WithScales:
      return "fp8_ds_mla";
    case LatentCacheDtype::kNvfp4:
      return "nvfp4";
    case LatentCacheDtype::kFp32:
      return "fp32";
  }
  return "?";
}

std::string_view index_cache_dtype_name(IndexCacheDtype t) {
  switch (t) {
    case IndexCacheDtype::kFp8:
      return "fp8";
    case IndexCacheDtype::kMxfp4:
      return "mxfp4";
    case IndexCacheDtype::kFp32:
      return "fp32";
  }
  return "?";
}

std::optional<LatentCacheDtype> parse_latent_cache_dtype(std::string_view s) {
  for (auto t : {LatentCacheDtype::kBf16, LatentCacheDtype::kFp8, LatentCacheDtype::kFp8WithScales,
                 LatentCacheDtype::kNvfp4, LatentCacheDtype::kFp32}) {
    if (latent_cache_dtype_name(t) == s) return t;
  }
  return std::nullopt;
}

std::optional<IndexCacheDtype> parse_index_cache_dtype(std::string_view s) {
  for (auto t : {IndexCacheDtype::kFp8, IndexCacheDtype::kMxfp4, IndexCacheDtype::kFp32}) {
    if (index_cache_dtype_name(t) == s) return t;
  }
  return std::nullopt;
}

int64_t latent_bytes_per_token(const ModelConfig& c, LatentCacheDtype t) {
  const int64_t kv = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  switch (t) {
    case LatentCacheDtype::kBf16:
      return 2 * (kv + dr);
    case LatentCacheDtype::kFp8:
      return kv + dr;
    case LatentCacheDtype::kFp8WithScales:
      CHECK(kv % 128 == 0, "fp8_ds_mla needs kv_lora_rank % 128 == 0, got ", kv);
      return kv + 4 * (kv / 128) + 2 * dr;
    case LatentCacheDtype::kNvfp4:
      CHECK(kv % 16 == 0, "nvfp4 latent needs kv_lora_rank % 16 == 0, got ", kv);
      return kv / 2 + kv / 16 + dr;
    case LatentCacheDtype::kFp32:
      return 4 * (kv + dr);
  }
  return 0;
}

int64_t index_key_bytes_per_token(const ModelConfig& c, IndexCacheDtype t) {
  if (!c.has_indexer()) return 0;
  const int64_t d = c.index_head_dim;
  switch (t) {
    case IndexCacheDtype::kFp8:
      return d + 4;
    case IndexCacheDtype::kMxfp4:
      CHECK(d % 32 == 0, "mxfp4 index keys need index_head_dim % 32 == 0, got ", d);
      return d / 2 + d / 32;
    case IndexCacheDtype::kFp32:
      return 4 * d;
  }
  return 0;
}

int64_t index_key_scale_bytes_per_token(const ModelConfig& c, IndexCacheDtype t) {
  if (!c.has_indexer()) return 0;
  switch (t) {
    case IndexCacheDtype::kFp8:
      return 4;
    case IndexCacheDtype::kMxfp4:
      return c.index_head_dim / 32;
    case IndexCacheDtype::kFp32:
      return 0;
  }
  return 0;
}

int64_t cache_bytes_per_token(const ModelConfig& c, LatentCacheDtype latent,
                              IndexCacheDtype index) {
  return c.num_mla_layers() *
         (latent_bytes_per_token(c, latent) + index_key_bytes_per_token(c, index));
}

int64_t kda_state_bytes_per_request(const ModelConfig& c, int64_t tp) {
  CHECK(tp >= 1 && c.linear_num_heads % tp == 0, "tp (", tp, ") must divide linear_num_heads (",
        c.linear_num_heads, ")");
  const int64_t heads = c.linear_num_heads / tp, k = c.linear_head_dim;
  const int64_t conv = (c.linear_conv_kernel - 1) * 3 * heads * k * 4;
  const int64_t recurrent = heads * k * k * 4;
  return c.num_kda_layers() * (conv + recurrent);
}

}  // namespace hyserve
