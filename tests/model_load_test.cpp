// Loading a whole model: every tensor the config implies is checked, and a bad
// checkpoint is refused with a message naming the file and the tensor. Also the
// model-level DSA invariant on the FP8 indexer path.
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint_edit.h"
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
  return test::rewrite_checkpoint(kTiny, "tiny_" + name, edit);
}

using test::load_error;

TEST(ModelLoad, MissingTensorIsNamed) {
  const auto dir = rewrite_tiny("missing", [](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const TensorToWrite& w) {
      return w.name == "language_model.model.layers.3.self_attn.indexer.wk.weight";
    });
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("language_model.model.layers.3.self_attn.indexer.wk.weight"),
            std::string::npos)
      << err;
}

TEST(ModelLoad, WrongShapeIsNamedWithFile) {
  const auto dir = rewrite_tiny("shape", [](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (w.name == "language_model.model.layers.0.self_attn.b_proj.weight") {
        w.shape = {w.shape[1], w.shape[0]};
      }
    }
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("language_model.model.layers.0.self_attn.b_proj.weight"), std::string::npos)
      << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST(ModelLoad, WrongDtypeIsNamed) {
  const auto dir = rewrite_tiny("dtype", [](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (w.name == "language_model.model.norm.weight") {
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
      return w.name == "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale";
    });
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("experts.3.w2.weight_scale"), std::string::npos) << err;
}

// The published layout (K3.md §4): the vision tower and projector are never read (a
// broken or missing one changes nothing), the K3 tensors are all required, and A_log's
// padding past the heads is not read.
TEST(ModelLoad, PublishedK3SkipsTheVisionTowerAndNamesK3Tensors) {
  const auto reference = Model::load(kTiny);
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 77, 21, 8, 8, 40, 2, 11};
  SequenceState s = reference->new_sequence();
  std::vector<float> expected;
  reference->forward(prompt, s, expected, true);

  const auto is_vision = [](const std::string& name) {
    return name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
  };
  const auto no_vision = rewrite_tiny("no_vision", [&](std::vector<TensorToWrite>& t) {
    const size_t before = t.size();
    std::erase_if(t, [&](const TensorToWrite& w) { return is_vision(w.name); });
    ASSERT_LT(t.size(), before) << "the bundled model has a vision tower stub";
  });
  const auto bad_vision = rewrite_tiny("bad_vision", [&](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (!is_vision(w.name)) continue;
      w.dtype = DType::kI32;
      w.shape = {1};
      w.bytes.resize(4);
    }
  });
  // A_log's padding entries hold garbage: not read.
  const auto a_log = rewrite_tiny("a_log_pad", [&](std::vector<TensorToWrite>& t) {
    for (auto& w : t) {
      if (w.name.ends_with("self_attn.A_log")) {
        ASSERT_EQ(w.dtype, DType::kF32);
        ASSERT_GT(w.shape[0], reference->config().linear_num_heads);
        float* v = reinterpret_cast<float*>(w.bytes.data());
        for (int64_t i = reference->config().linear_num_heads; i < w.shape[0]; ++i) v[i] = 1e6f;
      }
    }
  });
  for (const fs::path& dir : {no_vision, bad_vision, a_log}) {
    const auto model = Model::load(dir);
    SequenceState st = model->new_sequence();
    std::vector<float> logits;
    model->forward(prompt, st, logits, true);
    EXPECT_EQ(logits, expected) << dir;
  }

  for (const char* name :
       {"language_model.model.output_attn_res_proj.weight",
        "language_model.model.layers.4.mlp_res_norm.weight",
        "language_model.model.layers.2.self_attn.g_proj.weight",
        "language_model.model.layers.1.block_sparse_moe.routed_expert_norm.weight",
        "language_model.model.layers.6.block_sparse_moe.routed_expert_up_proj.weight"}) {
    const auto dir = rewrite_tiny("missing_k3", [&](std::vector<TensorToWrite>& t) {
      std::erase_if(t, [&](const TensorToWrite& w) { return w.name == name; });
    });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find(name), std::string::npos) << name << ": " << err;
  }
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
