// Cache dtypes: the one parser of `--kv-cache-dtype` / `--index-cache-dtype` (every name it
// takes, what auto means, how it refuses), the per-token byte counts from a CacheSpec alone,
// and the CacheSpec a model config gives.
#include "kv/cache_format.h"

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "util/error.h"

namespace hyserve {
namespace {

// auto: fp8 for the DSA models whose 576-wide latent the DSA kernels read (K3.1 Pro,
// DeepSeek-V3.2), bf16 (the checkpoint dtype) for the rest; a dtype given is kept.
TEST(CacheFormat, AutoIsFp8ForDsaLatentsAndBf16Otherwise) {
  CacheSpec dsa;  // K3.1 Pro's and DeepSeek-V3.2's full-attention layers
  dsa.kv_lora_rank = 512;
  dsa.qk_rope_head_dim = 64;
  dsa.index_head_dim = 128;
  EXPECT_EQ(auto_latent_cache_dtype(dsa), LatentCacheDtype::kFp8);
  CacheSpec dense = dsa;  // Kimi Linear, DeepSeek-V3: the same latent, no indexer
  dense.index_head_dim = 0;
  EXPECT_EQ(auto_latent_cache_dtype(dense), LatentCacheDtype::kBf16);
  // The tiny DSA fixture's latent is narrower than the DSA kernels'.
  const CacheSpec tiny =
      ModelConfig::load(std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/deepseek_v32_tiny")
          .cache_spec();
  ASSERT_GT(tiny.index_head_dim, 0);
  EXPECT_EQ(auto_latent_cache_dtype(tiny), LatentCacheDtype::kBf16);
  EXPECT_EQ(resolve_latent_cache_dtype(std::nullopt, dsa), LatentCacheDtype::kFp8);
  EXPECT_EQ(resolve_latent_cache_dtype(LatentCacheDtype::kFp32, dsa), LatentCacheDtype::kFp32);
}

TEST(CacheFormat, ParsesEveryLatentName) {
  EXPECT_EQ(parse_latent_cache_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_latent_cache_dtype("bf16"), LatentCacheDtype::kBf16);
  EXPECT_EQ(parse_latent_cache_dtype("fp8"), LatentCacheDtype::kFp8);
  EXPECT_EQ(parse_latent_cache_dtype("fp8_ds_mla"), LatentCacheDtype::kFp8WithScales);
  EXPECT_EQ(parse_latent_cache_dtype("nvfp4"), LatentCacheDtype::kNvfp4);
  EXPECT_EQ(parse_latent_cache_dtype("fp32"), LatentCacheDtype::kFp32);
  for (auto t : {LatentCacheDtype::kBf16, LatentCacheDtype::kFp8, LatentCacheDtype::kFp8WithScales,
                 LatentCacheDtype::kNvfp4, LatentCacheDtype::kFp32}) {
    EXPECT_EQ(parse_latent_cache_dtype(latent_cache_dtype_name(t)), t);
  }
  EXPECT_EQ(latent_cache_dtype_choices(), "auto, bf16, fp8, fp8_ds_mla, nvfp4, fp32");
}

TEST(CacheFormat, ParsesEveryIndexName) {
  EXPECT_EQ(parse_index_cache_dtype("fp8"), IndexCacheDtype::kFp8);
  EXPECT_EQ(parse_index_cache_dtype("mxfp4"), IndexCacheDtype::kMxfp4);
  EXPECT_EQ(parse_index_cache_dtype("fp32"), IndexCacheDtype::kFp32);
  EXPECT_EQ(index_cache_dtype_choices(), "fp8, mxfp4, fp32");
}

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CacheFormat, RefusesOtherNamesListingTheChoices) {
  const std::string latent = error_of([] { parse_latent_cache_dtype("fp16"); });
  EXPECT_NE(latent.find("--kv-cache-dtype 'fp16'"), std::string::npos) << latent;
  EXPECT_NE(latent.find("auto, bf16, fp8, fp8_ds_mla, nvfp4, fp32"), std::string::npos) << latent;
  EXPECT_NE(latent.find("auto: fp8 for DSA models"), std::string::npos) << latent;
  const std::string index = error_of([] { parse_index_cache_dtype("auto"); });
  EXPECT_NE(index.find("--index-cache-dtype 'auto'"), std::string::npos) << index;
  EXPECT_NE(index.find("fp8, mxfp4, fp32"), std::string::npos) << index;
  // Names are exact: no case folding, no empty value.
  EXPECT_THROW(parse_latent_cache_dtype("FP8"), InvalidArgument);
  EXPECT_THROW(parse_latent_cache_dtype(""), InvalidArgument);
}

// MODEL.md §6 at a 512 + 64 latent and 128-d index keys, from a CacheSpec alone.
TEST(CacheFormat, BytesPerTokenFromTheSpec) {
  CacheSpec spec;
  spec.layers = {CacheLayerKind::kKda, CacheLayerKind::kFullAttention,
                 CacheLayerKind::kFullAttention};
  spec.kv_lora_rank = 512;
  spec.qk_rope_head_dim = 64;
  spec.index_head_dim = 128;
  EXPECT_EQ(latent_bytes_per_token(spec, LatentCacheDtype::kBf16), 1152);
  EXPECT_EQ(latent_bytes_per_token(spec, LatentCacheDtype::kFp8), 576);
  EXPECT_EQ(latent_bytes_per_token(spec, LatentCacheDtype::kFp8WithScales), 656);
  EXPECT_EQ(latent_bytes_per_token(spec, LatentCacheDtype::kNvfp4), 352);
  EXPECT_EQ(latent_bytes_per_token(spec, LatentCacheDtype::kFp32), 2304);
  EXPECT_EQ(index_key_bytes_per_token(spec, IndexCacheDtype::kFp8), 132);
  EXPECT_EQ(index_key_bytes_per_token(spec, IndexCacheDtype::kMxfp4), 68);
  EXPECT_EQ(index_key_bytes_per_token(spec, IndexCacheDtype::kFp32), 512);
  EXPECT_EQ(index_key_scale_bytes_per_token(spec, IndexCacheDtype::kMxfp4), 4);
  EXPECT_EQ(cache_bytes_per_token(spec, LatentCacheDtype::kFp8, IndexCacheDtype::kFp8),
            2 * (576 + 132));
  spec.index_head_dim = 0;  // no indexer: no keys
  EXPECT_EQ(index_key_bytes_per_token(spec, IndexCacheDtype::kFp8), 0);
  EXPECT_EQ(cache_bytes_per_token(spec, LatentCacheDtype::kFp8, IndexCacheDtype::kFp8), 2 * 576);
}

TEST(CacheFormat, ModelConfigGivesItsCacheSpec) {
  std::filesystem::path path;
  for (auto dir : {std::filesystem::path(HYSERVE_SOURCE_DIR) / "../shared/configs",
                   std::filesystem::path(HYSERVE_SOURCE_DIR) / "shared/configs"}) {
    if (std::filesystem::exists(dir / "kimi-k3.1-pro-published.json"))
      path = dir / "kimi-k3.1-pro-published.json";
  }
  if (path.empty()) GTEST_SKIP() << "kimi-k3.1-pro-published.json not found";
  const ModelConfig c = ModelConfig::load(path);
  const CacheSpec s = c.cache_spec();
  ASSERT_EQ(s.num_layers(), 93);
  EXPECT_EQ(s.num_kda_layers(), 69);
  EXPECT_EQ(s.num_full_attention_layers(), 24);
  for (int64_t i = 0; i < 93; ++i) EXPECT_EQ(s.is_kda(i), c.is_kda(i)) << i;
  EXPECT_EQ(s.kv_lora_rank, 512);
  EXPECT_EQ(s.qk_rope_head_dim, 64);
  EXPECT_EQ(s.index_head_dim, 128);
  EXPECT_EQ(s.kda_num_heads, 96);
  EXPECT_EQ(s.kda_head_dim, 128);
  EXPECT_EQ(s.kda_conv_kernel, 4);
  // A dense-MLA config has no indexer in its spec.
  ModelConfig dense = c;
  dense.index_n_heads = 0;
  EXPECT_FALSE(dense.cache_spec().has_indexer());
}

}  // namespace
}  // namespace hyserve
