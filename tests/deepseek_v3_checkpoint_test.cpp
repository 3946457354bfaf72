// Checkpoints of DeepSeek-V3's architecture as their publishers ship them (issue 25,
// item 14): DeepSeek-V3 / R1 (deepseek_v3, FP8 128x128 blocks, an MTP layer beside the
// decoder), Kimi K2 (kimi_k2) and Kimi K2.5 (kimi_k25: text_config, language_model.
// names, a vision tower). The fixtures come from tools/make_fixtures.py; their logits are
// checked against transformers in golden_test.cpp. Here: `hyserve info` and `generate`
// as a user runs them, and what the K2.5 wrapper reads and skips.
#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint_edit.h"
#include "golden_util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "run_binary.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(HYSERVE_SOURCE_DIR) / "tests/fixtures";

using test::run;
using test::RunResult;

std::string join(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

struct Fixture {
  const char* dir;         // under tests/fixtures
  const char* model_type;  // as config.json names it
  const char* golden_dir;  // holds golden.safetensors
};

const Fixture kFixturesOfV3[] = {
    {"deepseek_v3_tiny", "deepseek_v3", "deepseek_v3_tiny"},
    {"kimi_k2_tiny", "kimi_k2", "kimi_k2_tiny"},
    {"kimi_k25_tiny", "kimi_k25", "kimi_k2_tiny"},
};

// info describes dense MLA with YaRN RoPE and no index-key cache, with no unknown-field
// warning; generate's greedy tokens are transformers' greedy tokens.
TEST(DeepseekV3Checkpoints, InfoAndGenerateAsAUserRunsThem) {
  for (const Fixture& fx : kFixturesOfV3) {
    const std::string dir = (kFixtures / fx.dir).string();
    RunResult r = run("info " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("(" + std::string(fx.model_type) + ")"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("3 MLA (dense)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("YaRN RoPE"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("does not know"), std::string::npos) << r.output;

    r = run("info --json " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("\"indexer\": false"), std::string::npos) << r.output;

    const SafetensorsFile golden =
        SafetensorsFile::open(kFixtures / fx.golden_dir / "golden.safetensors");
    const std::vector<int32_t> prompt = test::golden_ids(golden, "prompt_1_ids");
    std::vector<int32_t> greedy = test::golden_ids(golden, "prompt_1_greedy_ids");
    greedy.resize(12);
    r = run("generate " + dir + " --max-tokens 12 --ignore-eos --prompt-ids " + join(prompt, ","));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("ids: " + join(greedy, " ") + "\n"), std::string::npos)
        << fx.dir << ": expected ids " << join(greedy, " ") << " in\n"
        << r.output;
  }
}

// Copies a fixture into a temp folder, letting `edit` change its tensors.
fs::path rewrite_fixture(const char* fixture, const std::string& name,
                         const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  return test::rewrite_checkpoint(kFixtures / fixture, "v3_" + name, edit);
}

std::vector<float> prefill_logits(const fs::path& dir, const std::vector<int32_t>& prompt) {
  const auto model = Model::load(dir);
  SequenceState s = model->new_sequence();
  std::vector<float> logits;
  model->forward(prompt, s, logits, /*all_positions=*/true);
  return logits;
}

using test::load_error;

// Kimi K2.5 is Kimi K2's text model under language_model.: the same weights give the
// same logits bit for bit; the vision tower is never read (gone or broken, nothing
// changes); a missing text tensor is named with its prefix.
TEST(DeepseekV3Checkpoints, KimiK25ReadsTheTextModelUnderLanguageModel) {
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 77, 21, 8, 8, 40, 2, 11, 250};
  const std::vector<float> k2 = prefill_logits(kFixtures / "kimi_k2_tiny", prompt);
  EXPECT_EQ(prefill_logits(kFixtures / "kimi_k25_tiny", prompt), k2);

  const auto is_vision = [](const std::string& name) {
    return name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
  };
  const auto no_vision = rewrite_fixture("kimi_k25_tiny", "no_vision", [&](auto& t) {
    const size_t before = t.size();
    std::erase_if(t, [&](const TensorToWrite& w) { return is_vision(w.name); });
    ASSERT_EQ(t.size(), before - 2) << "kimi_k25_tiny has two vision stubs";
  });
  const auto bad_vision = rewrite_fixture("kimi_k25_tiny", "bad_vision", [&](auto& t) {
    for (auto& w : t) {
      if (!is_vision(w.name)) continue;
      w.dtype = DType::kI32;
      w.shape = {1};
      w.bytes.resize(4);
    }
  });
  for (const fs::path& dir : {no_vision, bad_vision})
    EXPECT_EQ(prefill_logits(dir, prompt), k2) << dir;

  const std::string name = "language_model.model.layers.2.mlp.experts.5.up_proj.weight";
  const auto missing = rewrite_fixture("kimi_k25_tiny", "missing", [&](auto& t) {
    std::erase_if(t, [&](const TensorToWrite& w) { return w.name == name; });
  });
  const std::string err = load_error(missing);
  EXPECT_NE(err.find(name), std::string::npos) << err;
}

// DeepSeek ships its linears as FP8 e4m3 with 128x128-block scales: a missing scale is
// named; the multi-token-prediction layer after the decoder is not read.
TEST(DeepseekV3Checkpoints, DeepseekV3Fp8AndItsMtpLayer) {
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 77, 21, 8, 8, 40, 2, 11, 250};
  const std::vector<float> reference = prefill_logits(kFixtures / "deepseek_v3_tiny", prompt);
  const auto no_mtp = rewrite_fixture("deepseek_v3_tiny", "no_mtp", [](auto& t) {
    const size_t before = t.size();
    std::erase_if(t, [](const TensorToWrite& w) { return w.name.starts_with("model.layers.3."); });
    ASSERT_LT(t.size(), before) << "deepseek_v3_tiny ships an MTP layer's tensors";
  });
  EXPECT_EQ(prefill_logits(no_mtp, prompt), reference);

  const std::string name = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv";
  const auto missing = rewrite_fixture("deepseek_v3_tiny", "no_scale", [&](auto& t) {
    std::erase_if(t, [&](const TensorToWrite& w) { return w.name == name; });
  });
  const std::string err = load_error(missing);
  EXPECT_NE(err.find("model.layers.1.self_attn.kv_b_proj"), std::string::npos) << err;
}

}  // namespace
}  // namespace hyserve
