// Model::kernel_plan: every layer named once, grouped, with the path its ops take.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "dsa_model_util.h"
#include "model/model.h"

namespace hyserve {
namespace {

const std::filesystem::path kTiny =
    std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";

// The layer numbers a line names ("layers 0-2, 4: ...").
std::set<int64_t> layers_of(const std::string& line) {
  std::set<int64_t> out;
  const std::string list = line.substr(line.find(' ') + 1, line.find(':') - line.find(' ') - 1);
  const std::regex item(R"((\d+)(?:-(\d+))?)");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), item); it != std::sregex_iterator();
       ++it) {
    const int64_t first = std::stoll((*it)[1]);
    const int64_t last = (*it)[2].matched ? std::stoll((*it)[2]) : first;
    for (int64_t l = first; l <= last; ++l) EXPECT_TRUE(out.insert(l).second) << line;
  }
  return out;
}

TEST(KernelPlan, NamesEveryLayerOnceWithItsPath) {
  const auto model = Model::load(kTiny);
  const ModelConfig& c = model->config();
  const std::vector<std::string> plan = model->kernel_plan();
  std::set<int64_t> seen;
  for (const std::string& line : plan) {
    for (int64_t l : layers_of(line)) {
      EXPECT_TRUE(seen.insert(l).second) << "layer " << l << " named twice";
      EXPECT_NE(line.find(c.is_kda(l) ? "KDA" : "MLA"), std::string::npos) << line;
      EXPECT_NE(line.find(c.is_moe(l) ? "MoE" : "dense"), std::string::npos) << line;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), c.num_hidden_layers);
  // The tiny K3.1 Pro: KDA at 0-2 and 4, MLA with DSA at 3, 5 and 6; the fp32 latent of the
  // reference takes the generic indexer path, and says so.
  bool mla_line = false;
  for (const std::string& line : plan) {
    if (line.find("MLA") == std::string::npos) continue;
    mla_line = true;
    EXPECT_NE(line.find("fp32 latent"), std::string::npos) << line;
    EXPECT_NE(line.find("generic indexer"), std::string::npos) << line;
  }
  EXPECT_TRUE(mla_line);
}

TEST(KernelPlan, TheFp8PathNamesTheFusedDecodeStepOrWhyNot) {
  const ModelConfig c = test::dsa_config("models/tiny-kimi-k3");
  const auto mla_lines = [](const Model& m) {
    std::vector<std::string> out;
    for (const std::string& line : m.kernel_plan()) {
      if (line.find("MLA") != std::string::npos) out.push_back(line);
    }
    return out;
  };
  const auto fused = mla_lines(*test::make_dsa_model(c, LatentCacheDtype::kFp8));
  ASSERT_FALSE(fused.empty());
  for (const std::string& line : fused) {
    EXPECT_NE(line.find("fp8 latent"), std::string::npos) << line;
    EXPECT_NE(line.find("decode: fused DSA decode step"), std::string::npos) << line;
  }
  const auto off = mla_lines(
      *test::make_dsa_model(c, LatentCacheDtype::kFp8, nullptr, AttentionBackend::kDsaFp8));
  ASSERT_FALSE(off.empty());
  for (const std::string& line : off) {
    EXPECT_NE(line.find("generic indexer path, the fused DSA decode step turned off"),
              std::string::npos)
        << line;
  }
  ModelConfig wide = c;
  wide.index_n_heads = 128;  // more heads than the fused step takes
  for (const std::string& line : mla_lines(*test::make_dsa_model(wide, LatentCacheDtype::kFp8))) {
    EXPECT_NE(line.find("index heads 128 x 128, top-8 outside its shapes"), std::string::npos)
        << line;
  }
}

}  // namespace
}  // namespace hyserve
