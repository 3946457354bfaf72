// The attention-backend choice made at load (model/attention_backend.h): auto follows the
// cache formats and the config, a requested backend is taken where it can run and refused,
// saying why, where it cannot; the model's forward follows the choice.
#include "model/attention_backend.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "dsa_model_util.h"
#include "model/model.h"
#include "util/error.h"

namespace hyserve {
namespace {

ModelConfig fixture_config(const char* dir) {
  return ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / dir);
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionBackend, NamesRoundTrip) {
  for (const AttentionBackend b :
       {AttentionBackend::kAuto, AttentionBackend::kMla, AttentionBackend::kMlaSparse,
        AttentionBackend::kDsaFp8, AttentionBackend::kDsaFp8Fused}) {
    EXPECT_EQ(parse_attention_backend(attention_backend_name(b)), b);
  }
  EXPECT_EQ(refusal([] { parse_attention_backend("flashmla"); }),
            "unknown attention backend 'flashmla' (one of auto, mla, mla_sparse, dsa_fp8, "
            "dsa_fp8_fused)");
}

TEST(AttentionBackend, AutoFollowsTheConfigAndTheCacheFormats) {
  const ModelConfig dense = fixture_config("tests/fixtures/kimi_k2_tiny");
  ASSERT_FALSE(dense.has_indexer());
  EXPECT_EQ(choose_attention_backend(dense, {}).backend, AttentionBackend::kMla);
  EXPECT_FALSE(choose_attention_backend(dense, {}).sparse());

  const ModelConfig dsa = test::dsa_config("models/tiny-kimi-k3");
  ASSERT_TRUE(dsa.has_indexer());
  EXPECT_EQ(choose_attention_backend(dsa, {}).backend, AttentionBackend::kMlaSparse);
  EXPECT_EQ(choose_attention_backend(dsa, {LatentCacheDtype::kBf16, true, 1}).backend,
            AttentionBackend::kMlaSparse);
  const AttentionChoice fused = choose_attention_backend(dsa, {LatentCacheDtype::kFp8, true, 1});
  EXPECT_EQ(fused.backend, AttentionBackend::kDsaFp8Fused);
  EXPECT_TRUE(fused.fused_decode());
  EXPECT_TRUE(fused.fp8_latent());
  EXPECT_EQ(fused.why_not_fused, "");

  // The fused step's limits: FP8 index keys, no DCP, its index shapes.
  const AttentionChoice fp32_keys =
      choose_attention_backend(dsa, {LatentCacheDtype::kFp8, false, 1});
  EXPECT_EQ(fp32_keys.backend, AttentionBackend::kDsaFp8);
  EXPECT_NE(fp32_keys.why_not_fused.find("FP8 index keys"), std::string::npos);
  const AttentionChoice dcp = choose_attention_backend(dsa, {LatentCacheDtype::kFp8, true, 2});
  EXPECT_EQ(dcp.backend, AttentionBackend::kDsaFp8);
  EXPECT_NE(dcp.why_not_fused.find("not under DCP"), std::string::npos);
  ModelConfig wide = dsa;
  wide.index_n_heads = 128;
  const AttentionChoice w = choose_attention_backend(wide, {LatentCacheDtype::kFp8, true, 1});
  EXPECT_EQ(w.backend, AttentionBackend::kDsaFp8);
  EXPECT_NE(w.describe().find("index heads 128 x 128, top-8 outside its shapes"), std::string::npos)
      << w.describe();
}

TEST(AttentionBackend, RequestsAreTakenOrRefusedWithTheReason) {
  const ModelConfig dense = fixture_config("tests/fixtures/kimi_k2_tiny");
  const ModelConfig dsa = test::dsa_config("models/tiny-kimi-k3");
  const auto choose = [](const ModelConfig& c, LatentCacheDtype latent, bool fp8_keys, int dcp,
                         AttentionBackend want) {
    return choose_attention_backend(c, {latent, fp8_keys, dcp, want}).backend;
  };
  // The one free choice: the unfused DSA path where the fused one would run.
  EXPECT_EQ(choose(dsa, LatentCacheDtype::kFp8, true, 1, AttentionBackend::kDsaFp8),
            AttentionBackend::kDsaFp8);
  EXPECT_EQ(choose(dsa, LatentCacheDtype::kFp8, true, 1, AttentionBackend::kDsaFp8Fused),
            AttentionBackend::kDsaFp8Fused);
  EXPECT_EQ(choose(dsa, LatentCacheDtype::kFp32, false, 1, AttentionBackend::kMlaSparse),
            AttentionBackend::kMlaSparse);
  EXPECT_EQ(choose(dense, LatentCacheDtype::kFp32, false, 1, AttentionBackend::kMla),
            AttentionBackend::kMla);

  EXPECT_EQ(refusal([&] {
              choose(dsa, LatentCacheDtype::kFp8, true, 2, AttentionBackend::kDsaFp8Fused);
            }),
            "attention backend dsa_fp8_fused cannot run: not under DCP (its top-k would be the "
            "rank's own)");
  EXPECT_EQ(
      refusal([&] { choose(dsa, LatentCacheDtype::kFp32, true, 1, AttentionBackend::kDsaFp8); }),
      "attention backend dsa_fp8 cannot run: it reads the FP8 latent, and the latent "
      "cache is fp32 (--kv-cache-dtype fp8)");
  EXPECT_NE(refusal([&] {
              choose(dsa, LatentCacheDtype::kFp32, false, 1, AttentionBackend::kMla);
            }).find("has the DSA indexer"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              choose(dense, LatentCacheDtype::kFp32, false, 1, AttentionBackend::kMlaSparse);
            }).find("has no DSA indexer"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              choose(dsa, LatentCacheDtype::kFp8, true, 1, AttentionBackend::kMlaSparse);
            }).find("read by the DSA kernels only"),
            std::string::npos);
}

TEST(AttentionBackend, TheModelLoadsWithItsChoiceOrRefusesToLoad) {
  const ModelConfig dsa = test::dsa_config("models/tiny-kimi-k3");
  EXPECT_EQ(test::make_dsa_model(dsa, LatentCacheDtype::kFp8)->attention().backend,
            AttentionBackend::kDsaFp8Fused);
  EXPECT_EQ(test::make_dsa_model(dsa, LatentCacheDtype::kFp32)->attention().backend,
            AttentionBackend::kMlaSparse);
  EXPECT_NE(refusal([&] {
              test::make_dsa_model(dsa, LatentCacheDtype::kFp32, nullptr,
                                   AttentionBackend::kDsaFp8Fused);
            }).find("attention backend dsa_fp8_fused cannot run"),
            std::string::npos);
}

}  // namespace
}  // namespace hyserve
