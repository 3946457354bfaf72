// Loading a whole model: every tensor the config implies is checked, and a bad
// checkpoint is refused with a message naming the file and the tensor. Also the
// model-level DSA invariant on the FP8 indexer path.
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/safetensors.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

const fs::path kTiny = fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";

// Copies the bundled model into a temp folder, letting `edit` change its tensors.
fs::path rewrite_tiny(const std::string& name,
                      const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  const fs::path dir = fs::path(testing::TempDir()) / ("hyserve_model_" + name);
  fs::create_directories(dir);
  fs::copy_file(kTiny / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::open(kTiny / "model.safetensors");
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : src.tensors()) {
    tensors.push_back(
        {t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)});
  }
  edit(tensors);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

std::string load_error(const fs::path& dir) {
  try {
    Model::load(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelLoad, MissingTensorIsNamed) {
  const auto dir = rewrite_tiny("missing", [](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const TensorToWrite& w) {
      return w.name == "model.layers.2.self_attn.indexer.wk.weight";
    });
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("model.layers.2.self_attn.indexer.wk.weight"), std::string::npos) << err;
}

TEST(ModelLoad, WrongShapeIsNamedWithFile) {
  const auto dir = rewrite_tiny("shape", [](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (w.name == "model.layers.0.self_attn.b_proj.weight") {
        w.shape = {w.shape[1], w.shape[0]};
      }
    }
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("model.layers.0.self_attn.b_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST(ModelLoad, WrongDtypeIsNamed) {
  const auto dir = rewrite_tiny("dtype", [](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (w.name == "model.norm.weight") {
        w.dtype = DType::kI32;  // same bytes, an integer type
        w.shape = {w.shape[0] / 2};
      }
    }
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("I32"), std::string::npos) << err;
}

TEST(ModelLoad, MissingMxfp4ScalesAreNamed) {
  const auto dir = rewrite_tiny("scales", [](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const TensorToWrite& w) {
      return w.name == "model.layers.1.block_sparse_moe.experts.3.w2.weight_scales";
    });
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("experts.3.w2.weight_scales"), std::string::npos) << err;
}

TEST(ModelLoad, TokenOutsideVocabularyIsRefused) {
  const auto model = Model::load(kTiny);
  SequenceState s = model->new_sequence();
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(model->config().vocab_size)};
  EXPECT_THROW(model->forward(bad, s, logits), InvalidArgument);
}

// With context <= index_topk the indexer keeps every key, so the FP8 indexer path
// gives bitwise the same logits as the exact path (DSA == dense MLA).
TEST(ModelLoad, Fp8IndexerPathEqualsExactPathWithinTopk) {
  const auto exact = Model::load(kTiny);
  ModelOptions fp8_options;
  fp8_options.indexer_fp8 = true;
  const auto fp8 = Model::load(kTiny, fp8_options);
  const int64_t topk = exact->config().index_topk;
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < topk; ++i) prompt.push_back(static_cast<int32_t>(17 * i + 3));
  SequenceState a = exact->new_sequence(), b = fp8->new_sequence();
  std::vector<float> la, lb;
  exact->forward(prompt, a, la, true);
  fp8->forward(prompt, b, lb, true);
  EXPECT_EQ(la, lb);
  // One more token: the contexts now exceed top-k and the paths may select differently,
  // but both run and give finite logits.
  const int32_t next = 5;
  exact->forward(std::span<const int32_t>(&next, 1), a, la);
  fp8->forward(std::span<const int32_t>(&next, 1), b, lb);
  for (float v : lb) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace hyserve
