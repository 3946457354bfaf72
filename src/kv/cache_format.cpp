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

namespace {

constexpr LatentCacheDtype kLatentCacheDtypes[] = {
    LatentCacheDtype::kBf16, LatentCacheDtype::kFp8, LatentCacheDtype::kFp8WithScales,
    LatentCacheDtype::kNvfp4, LatentCacheDtype::kFp32};
constexpr IndexCacheDtype kIndexCacheDtypes[] = {IndexCacheDtype::kFp8, IndexCacheDtype::kMxfp4,
                                                 IndexCacheDtype::kFp32};

}  // namespace

std::string latent_cache_dtype_choices() {
  std::string s = "auto";
  for (auto t : kLatentCacheDtypes) s += str_cat(", ", latent_cache_dtype_name(t));
  return s;
}

std::string index_cache_dtype_choices() {
  std::string s;
  for (auto t : kIndexCacheDtypes) s += str_cat(s.empty() ? "" : ", ", index_cache_dtype_name(t));
  return s;
}

std::optional<LatentCacheDtype> parse_latent_cache_dtype(std::string_view name) {
  if (name == "auto") return std::nullopt;
  for (auto t : kLatentCacheDtypes) {
    if (latent_cache_dtype_name(t) == name) return t;
  }
  HYSERVE_THROW(InvalidArgument, "--kv-cache-dtype '", name, "': not a cache dtype; choose ",
                latent_cache_dtype_choices(),
                " (auto: fp8 for DSA models with a 576-wide latent, bf16 otherwise)");
}

LatentCacheDtype auto_latent_cache_dtype(const CacheSpec& spec) {
  const bool dsa_latent =
      spec.index_head_dim > 0 && spec.kv_lora_rank == 512 && spec.qk_rope_head_dim == 64;
  return dsa_latent ? LatentCacheDtype::kFp8 : LatentCacheDtype::kBf16;
}

LatentCacheDtype resolve_latent_cache_dtype(std::optional<LatentCacheDtype> parsed,
                                            const CacheSpec& spec) {
  return parsed ? *parsed : auto_latent_cache_dtype(spec);
}

IndexCacheDtype parse_index_cache_dtype(std::string_view name) {
  for (auto t : kIndexCacheDtypes) {
    if (index_cache_dtype_name(t) == name) return t;
  }
  HYSERVE_THROW(InvalidArgument, "--index-cache-dtype '", name, "': not a cache dtype; choose ",
                index_cache_dtype_choices());
}

int64_t latent_bytes_per_token(const CacheSpec& spec, LatentCacheDtype t) {
  const int64_t kv = spec.kv_lora_rank, dr = spec.qk_rope_head_dim;
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

int64_t index_key_bytes_per_token(const CacheSpec& spec, IndexCacheDtype t) {
  if (!spec.has_indexer()) return 0;
  const int64_t d = spec.index_head_dim;
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

int64_t index_key_scale_bytes_per_token(const CacheSpec& spec, IndexCacheDtype t) {
  if (!spec.has_indexer()) return 0;
  switch (t) {
    case IndexCacheDtype::kFp8:
      return 4;
    case IndexCacheDtype::kMxfp4:
      return spec.index_head_dim / 32;
    case IndexCacheDtype::kFp32:
      return 0;
  }
  return 0;
}

int64_t cache_bytes_per_token(const CacheSpec& spec, LatentCacheDtype latent,
                              IndexCacheDtype index) {
  return spec.num_full_attention_layers() *
         (latent_bytes_per_token(spec, latent) + index_key_bytes_per_token(spec, index));
}

int64_t kda_state_bytes_per_request(const CacheSpec& spec, int64_t tp) {
  CHECK(tp >= 1 && spec.kda_num_heads % tp == 0, "tp (", tp, ") must divide linear_num_heads (",
        spec.kda_num_heads, ")");
  const int64_t heads = spec.kda_num_heads / tp, k = spec.kda_head_dim;
  const int64_t conv = (spec.kda_conv_kernel - 1) * 3 * heads * k * 4;
  const int64_t recurrent = heads * k * k * 4;
  return spec.num_kda_layers() * (conv + recurrent);
}

}  // namespace hyserve
