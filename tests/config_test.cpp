// ModelConfig parsing, parameter counts and cache sizes, on the full-size configs
// in ../shared/configs and on hand-written variants.
#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kv/cache_format.h"
#include "model/param_count.h"
#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::json;

std::filesystem::path shared_config(const char* name) {
  for (auto dir : {std::filesystem::path(HYSERVE_SOURCE_DIR) / "../shared/configs",
                   std::filesystem::path(HYSERVE_SOURCE_DIR) / "shared/configs"}) {
    if (std::filesystem::exists(dir / name)) return dir / name;
  }
  return {};
}

json small_kimi_linear() {
  return json::parse(R"({
    "model_type": "kimi_linear", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2,
                           "head_dim": 32, "short_conv_kernel_size": 4},
    "num_attention_heads": 4, "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_token": 2,
    "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_renormalize": true,
    "routed_scaling_factor": 2.5, "num_expert_group": 1, "topk_group": 1,
    "eos_token_id": [7, 9]})");
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, KimiK31ProFullSize) {
  const auto path = shared_config("kimi-k3.1-pro.json");
  if (path.empty()) GTEST_SKIP() << "shared/configs not found";
  const ModelConfig c = ModelConfig::load(path);
  EXPECT_EQ(c.model_type, ModelType::kKimiK3);
  EXPECT_EQ(c.num_hidden_layers, 93);
  EXPECT_EQ(c.num_kda_layers(), 69);
  EXPECT_EQ(c.num_mla_layers(), 24);
  EXPECT_TRUE(c.has_indexer());
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.index_rope_dims, 0);
  EXPECT_FALSE(c.rope.enabled);
  EXPECT_TRUE(c.mla_output_gate);
  EXPECT_EQ(c.expert_format, ExpertFormat::kMxfp4);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_tok, 16);
  EXPECT_FALSE(c.is_moe(0));
  EXPECT_TRUE(c.is_moe(1));
  // MODEL.md §6: 24 layers x (576 + 132) and x (352 + 68).
  EXPECT_EQ(cache_bytes_per_token(c, LatentCacheDtype::kFp8, IndexCacheDtype::kFp8), 16992);
  EXPECT_EQ(cache_bytes_per_token(c, LatentCacheDtype::kNvfp4, IndexCacheDtype::kMxfp4), 10080);
  EXPECT_EQ(latent_bytes_per_token(c, LatentCacheDtype::kFp8WithScales), 656);
  EXPECT_EQ(latent_bytes_per_token(c, LatentCacheDtype::kBf16), 1152);
  // MODEL.md: the configs land near 2.78T total and 105B active.
  const ParamCount p = count_params(c);
  EXPECT_NEAR(static_cast<double>(p.total) / 1e12, 2.78, 0.01);
  EXPECT_NEAR(static_cast<double>(p.active) / 1e9, 105.0, 1.5);
  // Per request: 69 layers x (3 x 3 x 16384 conv + 128 x 128 x 128 state) fp32.
  EXPECT_EQ(kda_state_bytes_per_request(c), 69LL * (3 * 3 * 16384 + 128 * 128 * 128) * 4);
}

TEST(Config, KimiK3WithoutIndexer) {
  const auto path = shared_config("kimi-k3.json");
  if (path.empty()) GTEST_SKIP() << "shared/configs not found";
  const ModelConfig c = ModelConfig::load(path);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_EQ(cache_bytes_per_token(c, LatentCacheDtype::kFp8, IndexCacheDtype::kFp8), 13824);
}

TEST(Config, KimiLinearOneIndexedLayerLists) {
  const ModelConfig c = ModelConfig::from_json(small_kimi_linear());
  ASSERT_EQ(c.layer_kinds.size(), 4u);
  EXPECT_TRUE(c.is_kda(0) && c.is_kda(1) && c.is_kda(2));
  EXPECT_FALSE(c.is_kda(3));
  EXPECT_EQ(c.linear_num_heads, 2);
  EXPECT_EQ(c.linear_head_dim, 32);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{7, 9}));
  EXPECT_FALSE(c.is_moe(0));
  EXPECT_TRUE(c.is_moe(3));
}

TEST(Config, KimiLinearTransformersSpelling) {
  json j = small_kimi_linear();
  j.erase("linear_attn_config");
  j["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
  j["mlp_layer_types"] = {"dense", "sparse", "sparse", "dense"};
  j["linear_num_heads"] = 3;
  j["linear_head_dim"] = 16;
  j["linear_conv_kernel_dim"] = 3;
  j.erase("num_experts");
  j["n_routed_experts"] = 8;
  j.erase("num_experts_per_token");
  j["num_experts_per_tok"] = 2;
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_TRUE(c.is_kda(0));
  EXPECT_FALSE(c.is_kda(1));
  EXPECT_EQ(c.linear_num_heads, 3);
  EXPECT_EQ(c.linear_conv_kernel, 3);
  EXPECT_FALSE(c.is_moe(3));
  EXPECT_EQ(c.num_experts, 8);
}

TEST(Config, ErrorsNameTheField) {
  json j = small_kimi_linear();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type"), std::string::npos);

  j = small_kimi_linear();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("hidden_size"), std::string::npos);

  j = small_kimi_linear();
  j["hidden_size"] = "wide";
  EXPECT_NE(error_of(j).find("hidden_size"), std::string::npos);

  j = small_kimi_linear();
  j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4};  // layer 4 listed twice
  EXPECT_NE(error_of(j).find("layer 4"), std::string::npos);

  j = small_kimi_linear();
  j["linear_attn_config"]["kda_layers"] = {0, 1, 2};  // 0 is not a 1-indexed layer
  EXPECT_NE(error_of(j).find("1-indexed"), std::string::npos);

  j = small_kimi_linear();
  j["num_experts_per_token"] = 9;
  EXPECT_NE(error_of(j).find("num_experts_per_token"), std::string::npos);

  j = small_kimi_linear();
  j["num_expert_group"] = 3;
  EXPECT_NE(error_of(j).find("n_group"), std::string::npos);

  j = small_kimi_linear();
  j["layer_types"] = {"linear_attention"};
  EXPECT_NE(error_of(j).find("layer_types"), std::string::npos);

  j = small_kimi_linear();
  j["model_type"] = "kimi_k3";
  j["index_n_heads"] = 4;
  EXPECT_NE(error_of(j).find("index_topk"), std::string::npos);

  j = small_kimi_linear();
  j["model_type"] = "kimi_k3";
  j["index_n_heads"] = 4;
  j["index_head_dim"] = 48;
  j["index_topk"] = 8;
  EXPECT_NE(error_of(j).find("index_head_dim"), std::string::npos);

  j = small_kimi_linear();
  j["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_NE(error_of(j).find("quant_method"), std::string::npos);

  j = small_kimi_linear();
  j.erase("kv_lora_rank");
  EXPECT_NE(error_of(j).find("kv_lora_rank"), std::string::npos);

  EXPECT_NE(error_of(json::array()).find("object"), std::string::npos);
}

TEST(Config, DeepseekYarnScale) {
  json j = json::parse(R"({
    "model_type": "deepseek_v32", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128, "first_k_dense_replace": 1,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})");
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_TRUE(c.rope.enabled && c.rope.yarn);
  EXPECT_EQ(c.index_rope_dims, 8);
  EXPECT_EQ(c.num_kda_layers(), 0);
  const double m = 0.1 * std::log(4.0) + 1.0;
  EXPECT_DOUBLE_EQ(c.mla_softmax_scale(), m * m / std::sqrt(24.0));
  // transformers' spelling: rope_parameters with rope_type.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 5000.0},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 32},
                          {"mscale_all_dim", 1.0}};
  const ModelConfig c2 = ModelConfig::from_json(j);
  EXPECT_DOUBLE_EQ(c2.rope.theta, 5000.0);
  EXPECT_DOUBLE_EQ(c2.mla_softmax_scale(), c.mla_softmax_scale());
}

TEST(Config, LoadReportsFileAndBadJson) {
  const auto dir = std::filesystem::path(testing::TempDir()) / "hyserve_config_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << "{\"model_type\": ";
  try {
    ModelConfig::load(dir);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos);
  }
  EXPECT_THROW(ModelConfig::load(dir / "missing"), ConfigError);
}

}  // namespace
}  // namespace hyserve
