// Kimi K2 Thinking / K2.5 checkpoints with compressed-tensors "pack-quantized" INT4 routed
// experts, built from the kimi_k2_tiny fixture: its experts widened to
// moe_intermediate_size 32 (zero rows of gate / up, zero columns of down: the same
// function, and group-32 widths), then the routed experts quantized to int4 groups of 32
// here. The INT4 checkpoint's logits equal, bit for bit, those of the same checkpoint with
// the routed experts stored as their dequantized fp32 values (q * bf16 scale is exact in
// fp32, and every CPU op reads weights through Weight::dequantize_row).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint_edit.h"
#include "core/dtype.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixture = fs::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/kimi_k2_tiny";
constexpr int64_t kInter = 32;  // the widened moe_intermediate_size

const json kInt4Quantization = json::parse(R"({
  "quant_method": "compressed-tensors", "format": "pack-quantized",
  "quantization_status": "compressed", "kv_cache_scheme": null,
  "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
  "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
    "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null,
      "dynamic": false, "group_size": 32, "num_bits": 4, "observer": "minmax",
      "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}}})");

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool is_routed(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos && ends_with(name, "_proj.weight");
}
bool is_expert(const std::string& name) {
  return is_routed(name) || (name.find(".mlp.shared_experts.") != std::string::npos &&
                             ends_with(name, "_proj.weight"));
}

std::vector<float> to_f32(const TensorToWrite& t) {
  std::vector<float> v(t.bytes.size() / dtype_size(t.dtype));
  convert_to_f32(t.bytes.data(), t.dtype, v.data(), static_cast<int64_t>(v.size()));
  return v;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// An expert matrix widened to kInter along its intermediate side, zeros in the new part.
void widen(TensorToWrite& t) {
  const std::vector<float> v = to_f32(t);
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const bool down = t.name.find("down_proj") != std::string::npos;
  const int64_t new_rows = down ? rows : kInter, new_cols = down ? kInter : cols;
  std::vector<uint16_t> out(new_rows * new_cols, f32_to_bf16(0.0f));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r * new_cols + c] = f32_to_bf16(v[r * cols + c]);
  }
  t = {t.name, DType::kBF16, {new_rows, new_cols}, bytes_of(out)};
}

// Symmetric int4 groups of 32 along the input: scale = bf16(amax / 7) (1 for an all-zero
// group), q = clamp(round(w / scale), -8, 7).
struct Int4Matrix {
  std::vector<int32_t> packed;   // [rows, cols / 8], q + 8 in bits 4j..4j+3 of word k / 8
  std::vector<uint16_t> scales;  // [rows, cols / 32] bf16
  std::vector<float> dequantized;
};

Int4Matrix quantize_int4(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Int4Matrix m{std::vector<int32_t>(rows * cols / 8, 0), {}, std::vector<float>(rows * cols)};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 32; ++g) {
      float amax = 0.0f;
      for (int64_t c = g * 32; c < (g + 1) * 32; ++c)
        amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax > 0.0f ? round_bf16(amax / 7.0f) : 1.0f;
      m.scales.push_back(f32_to_bf16(scale));
      for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
        const int q = std::clamp(static_cast<int>(std::lround(w[r * cols + c] / scale)), -8, 7);
        const auto code = static_cast<uint32_t>(q + 8);
        auto& word = m.packed[(r * cols + c) / 8];
        word = static_cast<int32_t>(static_cast<uint32_t>(word) | code << (4 * (c % 8)));
        m.dequantized[r * cols + c] = static_cast<float>(q) * scale;
      }
    }
  }
  return m;
}

void write_config(const fs::path& dir, bool int4) {
  std::ifstream in(kFixture / "config.json");
  json config = json::parse(in);
  config["moe_intermediate_size"] = kInter;
  if (int4) config["quantization_config"] = kInt4Quantization;
  std::ofstream(dir / "config.json") << config.dump(2);
}

// The fixture, widened, with its routed experts as INT4 tensors (int4 = true) or as the
// same values dequantized to F32 (int4 = false); `edit` then changes the INT4 tensors.
fs::path make_checkpoint(const std::string& name, bool int4,
                         const std::function<void(std::vector<TensorToWrite>&)>& edit = {}) {
  const fs::path dir = test::rewrite_checkpoint(kFixture, "kimi_k2_int4_" + name, [&](auto& ts) {
    std::vector<TensorToWrite> out;
    for (TensorToWrite& t : ts) {
      if (!is_expert(t.name)) {
        out.push_back(std::move(t));
        continue;
      }
      widen(t);
      if (!is_routed(t.name)) {
        out.push_back(std::move(t));
        continue;
      }
      const int64_t rows = t.shape[0], cols = t.shape[1];
      const Int4Matrix m = quantize_int4(to_f32(t), rows, cols);
      const std::string prefix = t.name.substr(0, t.name.size() - std::string(".weight").size());
      if (!int4) {
        out.push_back({t.name, DType::kF32, {rows, cols}, bytes_of(m.dequantized)});
        continue;
      }
      out.push_back({prefix + ".weight_packed", DType::kI32, {rows, cols / 8}, bytes_of(m.packed)});
      out.push_back(
          {prefix + ".weight_scale", DType::kBF16, {rows, cols / 32}, bytes_of(m.scales)});
      out.push_back(
          {prefix + ".weight_shape",
           DType::kI32,
           {2},
           bytes_of(std::vector<int32_t>{static_cast<int32_t>(rows), static_cast<int32_t>(cols)})});
    }
    if (edit) edit(out);
    ts = std::move(out);
  });
  write_config(dir, int4);
  return dir;
}

std::vector<float> prefill_logits(const fs::path& dir) {
  const auto model = Model::load(dir);
  SequenceState s = model->new_sequence();
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 3, 250, 7, 64};
  model->forward(prompt, s, logits, /*all_positions=*/true);
  return logits;
}

TEST(KimiK2Int4Checkpoint, LogitsEqualTheDequantizedF32CheckpointBitwise) {
  const fs::path int4 = make_checkpoint("packed", true);
  const fs::path f32 = make_checkpoint("dequantized", false);
  const std::vector<float> got = prefill_logits(int4);
  const std::vector<float> want = prefill_logits(f32);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
  // The packed tensors were read: the quantization changed the model.
  const fs::path widened_bf16 =
      test::rewrite_checkpoint(kFixture, "kimi_k2_int4_bf16", [](auto& ts) {
        for (TensorToWrite& t : ts) {
          if (is_expert(t.name)) widen(t);
        }
      });
  write_config(widened_bf16, false);
  EXPECT_NE(prefill_logits(widened_bf16), got);
}

TEST(KimiK2Int4Checkpoint, BadTensorsAreNamed) {
  const std::string expert = "model.layers.1.mlp.experts.3.gate_proj";
  auto with = [&](const std::string& name, const std::function<void(TensorToWrite&)>& edit) {
    return test::load_error(make_checkpoint(name, true, [&](auto& ts) {
      for (TensorToWrite& t : ts) {
        if (t.name.rfind(expert + ".", 0) == 0) edit(t);
      }
    }));
  };
  auto drop = [&](const std::string& name, const std::string& tensor) {
    return test::load_error(make_checkpoint(name, true, [&](auto& ts) {
      std::erase_if(ts, [&](const TensorToWrite& t) { return t.name == tensor; });
    }));
  };
  std::string e = with("bad_shape", [](TensorToWrite& t) {
    if (ends_with(t.name, ".weight_shape")) t.bytes = bytes_of(std::vector<int32_t>{32, 32});
  });
  EXPECT_NE(e.find(expert + ".weight_shape"), std::string::npos) << e;
  e = with("shape_dtype", [](TensorToWrite& t) {
    if (ends_with(t.name, ".weight_shape")) {
      t.dtype = DType::kF32;
      t.bytes = bytes_of(std::vector<float>{32, 64});
    }
  });
  EXPECT_NE(e.find(expert + ".weight_shape"), std::string::npos) << e;
  e = drop("no_scale", expert + ".weight_scale");
  EXPECT_NE(e.find(expert + ".weight_scale"), std::string::npos) << e;
  e = drop("no_shape", expert + ".weight_shape");
  EXPECT_NE(e.find(expert + ".weight_shape"), std::string::npos) << e;
  e = with("scale_dtype", [](TensorToWrite& t) {
    if (ends_with(t.name, ".weight_scale")) {
      t.dtype = DType::kU8;
      t.bytes.resize(t.bytes.size() / 2);
    }
  });
  EXPECT_NE(e.find(expert + ".weight_scale"), std::string::npos) << e;
  e = with("scale_shape", [](TensorToWrite& t) {
    if (ends_with(t.name, ".weight_scale")) {
      t.shape = {t.shape[1], t.shape[0]};
    }
  });
  EXPECT_NE(e.find(expert + ".weight_scale"), std::string::npos) << e;
  e = with("packed_shape", [](TensorToWrite& t) {
    if (ends_with(t.name, ".weight_packed")) t.shape = {t.shape[0] / 2, t.shape[1] * 2};
  });
  EXPECT_NE(e.find(expert + ".weight_packed"), std::string::npos) << e;
}

}  // namespace
}  // namespace hyserve
