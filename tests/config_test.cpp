// ModelConfig parsing, parameter counts and cache sizes, on the full-size configs
// in ../shared/configs and on hand-written variants.
#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kv/cache_format.h"
#include "model/param_count.h"
#include "shared_config.h"
#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::json;

using test::shared_config;

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

// The published Kimi K3.1 Pro config (K3.md §1, §6): the wrapper, every math field under
// its published name, the indexer from dsa_config.
TEST(Config, KimiK31ProPublished) {
  const auto path = shared_config("kimi-k3.1-pro-published.json");
  if (path.empty()) GTEST_SKIP() << "shared/configs not found";
  const ModelConfig c = ModelConfig::load(path);
  EXPECT_EQ(c.model_type, ModelType::kKimiK3);
  EXPECT_EQ(c.tensor_prefix, "language_model.");
  EXPECT_TRUE(c.has_vision);
  EXPECT_TRUE(c.unknown_fields.empty()) << c.unknown_fields_warning();
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 93);
  EXPECT_EQ(c.num_kda_layers(), 69);
  EXPECT_EQ(c.num_mla_layers(), 24);
  // The last two layers are both MLA (a % 4 rule gets layer 92 wrong).
  EXPECT_TRUE(c.is_kda(90));
  EXPECT_FALSE(c.is_kda(91));
  EXPECT_FALSE(c.is_kda(92));
  EXPECT_FALSE(c.is_kda(3));
  EXPECT_TRUE(c.has_indexer());
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.index_rope_dims, 0);
  EXPECT_DOUBLE_EQ(c.index_k_norm_eps, 1e-5);
  EXPECT_FALSE(c.rope.enabled);
  EXPECT_TRUE(c.mla_output_gate);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_DOUBLE_EQ(c.kv_norm_eps, 1e-6);
  EXPECT_EQ(c.linear_num_heads, 96);
  EXPECT_EQ(c.linear_head_dim, 128);
  EXPECT_DOUBLE_EQ(c.kda_gate_lower_bound, -5.0);
  EXPECT_TRUE(c.kda_full_rank_gate);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.num_attn_res_snapshots(), 8);
  EXPECT_TRUE(c.situ);
  EXPECT_DOUBLE_EQ(c.situ_beta, 4.0);
  EXPECT_DOUBLE_EQ(c.situ_linear_beta, 25.0);
  EXPECT_EQ(c.expert_format, ExpertFormat::kMxfp4);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_tok, 16);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.moe_latent_size, 3584);
  EXPECT_EQ(c.expert_hidden_size(), 3584);
  EXPECT_TRUE(c.moe_latent_norm);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_FALSE(c.is_moe(0));
  EXPECT_TRUE(c.is_moe(1));
  EXPECT_TRUE(c.is_moe(92));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{163586}));
  // MODEL.md §6: 24 layers x (576 + 132) and x (352 + 68).
  EXPECT_EQ(cache_bytes_per_token(c.cache_spec(), LatentCacheDtype::kFp8, IndexCacheDtype::kFp8),
            16992);
  EXPECT_EQ(
      cache_bytes_per_token(c.cache_spec(), LatentCacheDtype::kNvfp4, IndexCacheDtype::kMxfp4),
      10080);
  EXPECT_EQ(c.num_mla_layers() * latent_bytes_per_token(c.cache_spec(), LatentCacheDtype::kFp8),
            13824);
  // Per request: 69 layers x (3 x 3 x 12288 conv + 96 x 128 x 128 state) fp32.
  EXPECT_EQ(kda_state_bytes_per_request(c.cache_spec()),
            69LL * (3 * 3 * 12288 + 96 * 128 * 128) * 4);
}

// Parameter totals against the published tensor list (K3.md §4.4): 2,779,484,478,208
// logical text-model parameters (MXFP4 bytes count two, scales none), counted from
// configs/kimi-k3-published.tensors.txt; hyserve counts A_log as its 96 heads, not the
// stored [128] (69 layers x 32 padding entries).
TEST(Config, KimiK3PublishedParamsMatchTensorList) {
  const auto path = shared_config("kimi-k3-published.json");
  if (path.empty()) GTEST_SKIP() << "shared/configs not found";
  const ModelConfig c = ModelConfig::load(path);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_TRUE(c.unknown_fields.empty()) << c.unknown_fields_warning();
  EXPECT_EQ(c.num_mla_layers() * latent_bytes_per_token(c.cache_spec(), LatentCacheDtype::kFp8),
            13824);
  const ParamCount p = count_params(c);
  EXPECT_EQ(p.total, 2779484478208LL - 69 * 32);
  const int64_t expert = 3LL * 3584 * 3072;
  EXPECT_EQ(p.routed_experts, 92LL * 896 * expert);
  EXPECT_EQ(p.active, p.total - 92LL * (896 - 16) * expert);
  // K3.1 Pro adds the indexer: 24 x (32*128*1536 + 128*7168 + 2*128 + 32*7168).
  const auto pro = shared_config("kimi-k3.1-pro-published.json");
  if (!pro.empty()) {
    EXPECT_EQ(count_params(ModelConfig::load(pro)).total,
              p.total + 24LL * (32 * 128 * 1536 + 128 * 7168 + 2 * 128 + 32 * 7168));
  }
}

json published_k3_text() {
  const auto path = shared_config("kimi-k3-published.json");
  std::ifstream in(path);
  return json::parse(in);
}

TEST(Config, PublishedK3UnknownFieldsAreReported) {
  if (shared_config("kimi-k3-published.json").empty()) GTEST_SKIP() << "shared/configs not found";
  json j = published_k3_text();
  j["text_config"]["some_new_knob"] = 3;
  j["text_config"]["linear_attn_config"]["other_knob"] = true;
  j["top_level_thing"] = "x";
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.unknown_fields,
            (std::vector<std::string>{"text_config.some_new_knob", "top_level_thing",
                                      "text_config.linear_attn_config.other_knob"}));
  EXPECT_NE(c.unknown_fields_warning().find("text_config.some_new_knob"), std::string::npos);
}

// Every checkpoint config the tests load is fully known: no field reported.
TEST(Config, FixtureConfigsHaveNoUnknownFields) {
  for (const char* dir : {"models/tiny-kimi-k3", "tests/fixtures/kimi_k3_published_tiny",
                          "tests/fixtures/scripted-kimi-k3", "tests/fixtures/kimi_linear_tiny",
                          "tests/fixtures/deepseek_v32_tiny",
                          "tests/fixtures/deepseek_v32_fp8_tiny", "tests/fixtures/deepseek_v3_tiny",
                          "tests/fixtures/kimi_k2_tiny", "tests/fixtures/kimi_k25_tiny"}) {
    const ModelConfig c = ModelConfig::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / dir);
    EXPECT_TRUE(c.unknown_fields.empty()) << dir << ": " << c.unknown_fields_warning();
  }
  // A flat config reports its own unknown fields too.
  json j = small_kimi_linear();
  j["mystery"] = 1;
  EXPECT_EQ(ModelConfig::from_json(j).unknown_fields, std::vector<std::string>{"mystery"});
}

TEST(Config, PublishedK3MathFieldsRefusedOrApplied) {
  if (shared_config("kimi-k3-published.json").empty()) GTEST_SKIP() << "shared/configs not found";
  auto with = [](const std::function<void(json&)>& edit) {
    json j = published_k3_text();
    edit(j["text_config"]);
    return error_of(j);
  };
  EXPECT_NE(with([](json& t) { t["hidden_act"] = "gelu"; }).find("hidden_act"), std::string::npos);
  EXPECT_NE(with([](json& t) { t.erase("activation_situ_beta"); }).find("activation_situ_beta"),
            std::string::npos);
  EXPECT_NE(with([](json& t) { t["mla_output_gate"] = true; }).find("mla_use_output_gate"),
            std::string::npos);
  EXPECT_NE(with([](json& t) { t["mla_use_nope"] = false; }).find("mla_use_nope"),
            std::string::npos);
  EXPECT_NE(with([](json& t) { t["topk_method"] = "greedy"; }).find("topk_method"),
            std::string::npos);
  EXPECT_NE(with([](json& t) {
              t["linear_attn_config"]["gate_lower_bound"] = 1.0;
            }).find("gate_lower_bound"),
            std::string::npos);
  EXPECT_NE(with([](json& t) { t["attention_bias"] = true; }).find("attention_bias"),
            std::string::npos);
  EXPECT_NE(with([](json& t) {
              t["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
            }).find("groups of 32"),
            std::string::npos);
  EXPECT_NE(with([](json& t) {
              t["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
                  json{{"num_bits", 8}};
            }).find("activation quantization"),
            std::string::npos);
  EXPECT_NE(with([](json& t) {
              t["dsa_config"] = json{{"index_n_heads", 32},
                                     {"index_head_dim", 128},
                                     {"index_topk", 2048},
                                     {"layers", {4, 8}}};
            }).find("dsa_config.layers"),
            std::string::npos);
  // Errors inside the wrapper name where they are.
  EXPECT_NE(with([](json& t) { t["hidden_act"] = "gelu"; }).find("text_config"), std::string::npos);

  // Fields that select other (implemented) math.
  json j = published_k3_text();
  j["text_config"]["linear_attn_config"].erase("gate_lower_bound");
  j["text_config"]["linear_attn_config"]["use_full_rank_gate"] = false;
  j["text_config"]["latent_moe_use_norm"] = false;
  j["text_config"]["activation_situ_linear_beta"] = nullptr;
  j["text_config"]["moe_layer_freq"] = 2;
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.kda_gate_lower_bound, 0.0);
  EXPECT_FALSE(c.kda_full_rank_gate);
  EXPECT_FALSE(c.moe_latent_norm);
  EXPECT_EQ(c.situ_linear_beta, 0.0);
  EXPECT_FALSE(c.is_moe(1));
  EXPECT_TRUE(c.is_moe(2));
  EXPECT_FALSE(c.is_moe(3));
  // DeepSeek-style top-level index_* fields are read too.
  j = published_k3_text();
  j["text_config"]["index_n_heads"] = 32;
  j["text_config"]["index_head_dim"] = 128;
  j["text_config"]["index_topk"] = 2048;
  c = ModelConfig::from_json(j);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_rope_dims, 0);
  EXPECT_TRUE(c.unknown_fields.empty());
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

// A small deepseek_v32 config as transformers' save_pretrained writes it.
json small_deepseek_v32() {
  return json::parse(R"({
    "model_type": "deepseek_v32", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128, "first_k_dense_replace": 1,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8,
    "layer_types": ["indexed_attention", "indexed_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})");
}

// A small deepseek_v3 config as transformers 5's save_pretrained writes it
// (DeepseekV3Config: rope_parameters, rope_interleave, derived head_dim / qk_head_dim).
json small_deepseek_v3() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 1,
    "head_dim": 8, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 128, "kv_lora_rank": 32, "max_position_embeddings": 4096,
    "model_type": "deepseek_v3", "moe_intermediate_size": 32, "n_group": 4,
    "n_routed_experts": 16, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 4, "num_experts_per_tok": 4, "num_hidden_layers": 3,
    "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "output_router_logits": false,
    "pad_token_id": null, "pretraining_tp": 1, "q_lora_rank": 32, "qk_head_dim": 24,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
    "rope_interleave": true, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 2,
    "transformers_version": "5.24.0", "use_cache": true, "v_head_dim": 16, "vocab_size": 100})");
}

// transformers 5.12-5.16 name DeepSeek-V3.2's layers "deepseek_sparse_attention", 5.17 on
// "indexed_attention": both are MLA layers with the indexer. An unknown name is refused with
// every accepted value listed.
TEST(Config, DeepseekV32LayerTypesOfEveryTransformersVersion) {
  json j = small_deepseek_v32();
  for (const char* name : {"indexed_attention", "deepseek_sparse_attention", "full_attention"}) {
    j["layer_types"] = {name, name};
    const ModelConfig c = ModelConfig::from_json(j);
    EXPECT_EQ(c.num_mla_layers(), 2) << name;
    EXPECT_TRUE(c.has_indexer()) << name;
    EXPECT_TRUE(c.unknown_fields.empty()) << name << ": " << c.unknown_fields_warning();
  }
  j["layer_types"] = {"indexed_attention", "sliding_attention"};
  const std::string e = error_of(j);
  EXPECT_NE(e.find("layer_types[1]"), std::string::npos) << e;
  EXPECT_NE(e.find("\"sliding_attention\""), std::string::npos) << e;
  for (const char* accepted : {"\"linear_attention\"", "\"full_attention\"",
                               "\"indexed_attention\"", "\"deepseek_sparse_attention\""})
    EXPECT_NE(e.find(accepted), std::string::npos) << accepted << " missing from: " << e;
  // A deepseek layer cannot be KDA.
  j["layer_types"] = {"indexed_attention", "linear_attention"};
  EXPECT_NE(error_of(j).find("no linear-attention layers"), std::string::npos);
}

TEST(Config, DeepseekV3AsTransformersWritesIt) {
  const ModelConfig c = ModelConfig::from_json(small_deepseek_v3());
  EXPECT_EQ(c.model_type, ModelType::kDeepseekV3);
  EXPECT_EQ(c.model_type_name, "deepseek_v3");
  EXPECT_STREQ(model_type_name(c.model_type), "deepseek_v3");
  EXPECT_TRUE(c.unknown_fields.empty()) << c.unknown_fields_warning();
  EXPECT_EQ(c.num_mla_layers(), 3);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_TRUE(c.rope.enabled);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.tensor_prefix, "");
  EXPECT_FALSE(c.is_moe(0));
  EXPECT_TRUE(c.is_moe(1) && c.is_moe(2));
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.mla_softmax_scale(), 1.0 / std::sqrt(24.0));
  EXPECT_EQ(c.cache_spec().index_head_dim, 0);  // dense MLA: no index-key cache
}

TEST(Config, DeepseekV3RefusesWhatItDoesNotImplement) {
  json j = small_deepseek_v3();
  j["rope_interleave"] = false;
  EXPECT_NE(error_of(j).find("'rope_interleave'"), std::string::npos) << error_of(j);

  j = small_deepseek_v3();
  j["index_n_heads"] = 4;
  j["index_head_dim"] = 32;
  j["index_topk"] = 8;
  EXPECT_NE(error_of(j).find("deepseek_v32"), std::string::npos) << error_of(j);

  j = small_deepseek_v3();
  j["topk_method"] = "group_limited_greedy";  // DeepSeek-V2's router
  EXPECT_NE(error_of(j).find("'topk_method'"), std::string::npos);

  j = small_deepseek_v3();
  j["scoring_func"] = "softmax";
  EXPECT_NE(error_of(j).find("softmax"), std::string::npos);

  j = small_deepseek_v3();
  j["mla_use_output_gate"] = true;
  EXPECT_NE(error_of(j).find("'mla_use_output_gate'"), std::string::npos);

  j = small_deepseek_v3();
  j["text_config"] = json::object();
  EXPECT_NE(error_of(j).find("'text_config'"), std::string::npos);
}

// Kimi K2 Thinking / K2.5's routed experts: compressed-tensors "pack-quantized" symmetric
// int4 in groups of 32, as Moonshot's config declares it, in text_config or beside it.
const json kInt4Quantization = json::parse(R"({
  "quant_method": "compressed-tensors", "format": "pack-quantized",
  "quantization_status": "compressed", "kv_cache_scheme": null,
  "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
  "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
    "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null,
      "dynamic": false, "group_size": 32, "num_bits": 4, "observer": "minmax",
      "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}}})");

// small_deepseek_v3 as Kimi K2 ships it (flat kimi_k2, YaRN, sigmoid noaux_tc routing).
json small_kimi_k2() {
  json k2 = small_deepseek_v3();
  k2["model_type"] = "kimi_k2";
  k2["n_group"] = 1;
  k2["topk_group"] = 1;
  k2["rope_theta"] = 50000.0;
  k2.erase("rope_parameters");
  k2.erase("rope_interleave");
  k2["rope_scaling"] = {{"type", "yarn"},
                        {"factor", 32.0},
                        {"beta_fast", 1.0},
                        {"beta_slow", 1.0},
                        {"mscale", 1.0},
                        {"mscale_all_dim", 1.0},
                        {"original_max_position_embeddings", 4096}};
  k2["scoring_func"] = "sigmoid";
  k2["topk_method"] = "noaux_tc";
  return k2;
}

json int4_k2() {
  json j = small_kimi_k2();
  j["quantization_config"] = kInt4Quantization;
  return j;
}

// Kimi K2 is DeepSeek-V3's architecture under its own model_type, flat; Kimi K2.5 wraps
// the same text model (text_config, language_model. names, a vision tower).
TEST(Config, KimiK2AndK25) {
  const json k2 = small_kimi_k2();
  const ModelConfig c = ModelConfig::from_json(k2);
  EXPECT_EQ(c.model_type, ModelType::kDeepseekV3);
  EXPECT_EQ(c.model_type_name, "kimi_k2");
  EXPECT_TRUE(c.rope.enabled && c.rope.yarn);
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 1.0);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_FALSE(c.has_indexer());
  const double m = 0.1 * std::log(32.0) + 1.0;
  EXPECT_DOUBLE_EQ(c.mla_softmax_scale(), m * m / std::sqrt(24.0));

  json k25 = {{"model_type", "kimi_k25"},
              {"architectures", {"KimiK25ForConditionalGeneration"}},
              {"media_placeholder_token_id", 99},
              {"use_unified_vision_chunk", true},
              {"video_placeholder", "<|kimi_k25_video_placeholder|>"},
              {"vision_config", {{"patch_size", 14}}},
              {"text_config", k2}};
  const ModelConfig w = ModelConfig::from_json(k25);
  EXPECT_EQ(w.model_type, ModelType::kDeepseekV3);
  EXPECT_EQ(w.model_type_name, "kimi_k25");
  EXPECT_EQ(w.tensor_prefix, "language_model.");
  EXPECT_TRUE(w.has_vision);
  EXPECT_TRUE(w.unknown_fields.empty()) << w.unknown_fields_warning();
  EXPECT_DOUBLE_EQ(w.rope.theta, 50000.0);
  EXPECT_DOUBLE_EQ(w.mla_softmax_scale(), c.mla_softmax_scale());

  // Refusals name the field.
  json flat = k2;
  flat["model_type"] = "kimi_k25";
  EXPECT_NE(error_of(flat).find("'text_config'"), std::string::npos) << error_of(flat);
  json bad = k25;
  bad["text_config"]["model_type"] = "kimi_linear";
  EXPECT_NE(error_of(bad).find("text_config.model_type"), std::string::npos);
  // Kimi K2 Thinking / K2.5's INT4 experts, declared in text_config or beside it.
  json int4 = k25;
  int4["text_config"]["quantization_config"] = kInt4Quantization;
  EXPECT_EQ(ModelConfig::from_json(int4).expert_format, ExpertFormat::kInt4);
  int4 = k25;
  int4["quantization_config"] = kInt4Quantization;
  EXPECT_EQ(ModelConfig::from_json(int4).expert_format, ExpertFormat::kInt4);
  EXPECT_NE(ModelConfig::from_json(k25).expert_format, ExpertFormat::kInt4);
}

TEST(Config, KimiK2PackQuantizedInt4ExpertsAccepted) {
  const ModelConfig c = ModelConfig::from_json(int4_k2());
  EXPECT_EQ(c.expert_format, ExpertFormat::kInt4);
  EXPECT_FALSE(c.fp8_block_weights);
  EXPECT_TRUE(c.unknown_fields.empty()) << c.unknown_fields_warning();
  // The group format may sit in the group rather than at the top.
  json j = int4_k2();
  j["quantization_config"].erase("format");
  j["quantization_config"]["config_groups"]["group_0"]["format"] = "pack-quantized";
  EXPECT_EQ(ModelConfig::from_json(j).expert_format, ExpertFormat::kInt4);
}

TEST(Config, KimiK2PackQuantizedOtherMathRefusedNamingTheField) {
  auto weights_error = [](const char* key, const json& value) {
    json j = int4_k2();
    j["quantization_config"]["config_groups"]["group_0"]["weights"][key] = value;
    return error_of(j);
  };
  const std::string at = "quantization_config.config_groups.group_0.weights.";
  std::string e = weights_error("num_bits", 8);
  EXPECT_NE(e.find(at + "num_bits"), std::string::npos) << e;
  e = weights_error("type", "float");
  EXPECT_NE(e.find(at + "type"), std::string::npos) << e;
  e = weights_error("group_size", 128);
  EXPECT_NE(e.find(at + "group_size"), std::string::npos) << e;
  e = weights_error("strategy", "channel");
  EXPECT_NE(e.find(at + "strategy"), std::string::npos) << e;
  e = weights_error("symmetric", false);
  EXPECT_NE(e.find(at + "symmetric"), std::string::npos) << e;
  e = weights_error("dynamic", true);
  EXPECT_NE(e.find(at + "dynamic"), std::string::npos) << e;
  e = weights_error("actorder", "group");
  EXPECT_NE(e.find(at + "actorder"), std::string::npos) << e;

  json j = int4_k2();
  j["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
      json{{"num_bits", 8}, {"type", "int"}, {"dynamic", true}};
  e = error_of(j);
  EXPECT_NE(e.find("group_0.input_activations"), std::string::npos) << e;
  j = int4_k2();
  j["quantization_config"]["kv_cache_scheme"] = json{{"num_bits", 8}};
  e = error_of(j);
  EXPECT_NE(e.find("quantization_config.kv_cache_scheme"), std::string::npos) << e;
  j = int4_k2();
  j["quantization_config"]["format"] = "int-quantized";
  e = error_of(j);
  EXPECT_NE(e.find("group_0.format"), std::string::npos) << e;
  // Two groups, two formats.
  j = int4_k2();
  j["quantization_config"]["config_groups"]["group_1"] =
      j["quantization_config"]["config_groups"]["group_0"];
  j["quantization_config"]["config_groups"]["group_1"]["format"] = "mxfp4-pack-quantized";
  j["quantization_config"]["config_groups"]["group_1"]["weights"]["type"] = "float";
  e = error_of(j);
  EXPECT_NE(e.find("group_1.format"), std::string::npos) << e;
  // Group-32 widths.
  j = int4_k2();
  j["moe_intermediate_size"] = 48;
  e = error_of(j);
  EXPECT_NE(e.find("INT4 experts need"), std::string::npos) << e;
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
