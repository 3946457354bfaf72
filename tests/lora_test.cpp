// LoRA adapters (issue 48) on the CPU: a model with an adapter equals the model whose
// weights are merged (W + scale B A) within fp32 tolerance, on every target kind of the
// three model types (MLA q_a / q_b / kv_a / kv_b / o / g, KDA's projections and gates, the
// dense MLP, the shared and every routed expert); sequences without an adapter are bitwise
// the model without LoRA; a batch of mixed adapters equals each sequence alone; a bad
// adapter is refused naming the tensor.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "lora_test_util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

TensorToWrite f32_tensor(std::string name, std::vector<int64_t> shape,
                         const std::vector<float>& v) {
  TensorToWrite t{std::move(name), DType::kF32, std::move(shape), {}};
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

struct TestAdapter {
  fs::path dir;
  int64_t rank = 4;
  double alpha = 8.0;
  bool rslora = false;
  // target name -> (A [r, in], B [out, r])
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> pairs;
  float scale() const {
    return static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank);
  }
};

// Random A, B (fixed seed) on every target of the model, written as PEFT files. Module
// paths: "base_model.model." + prefix + "model." + the canonical name (prefix: the published
// K3's "language_model." where the checkpoint has it).
TestAdapter write_adapter(const Model& model, const fs::path& dir, uint32_t seed, bool rslora,
                          const std::string& prefix) {
  TestAdapter ad;
  ad.dir = dir;
  ad.rslora = rslora;
  fs::create_directories(dir);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorToWrite> tensors;
  for (const LoraTargets::Target& t : model.lora_targets()->targets()) {
    const Weight& w = *t.weight;
    std::vector<float> a(static_cast<size_t>(ad.rank * w.cols)),
        b(static_cast<size_t>(w.rows * ad.rank));
    const float sa = 1.0f / std::sqrt(static_cast<float>(w.cols)), sb = 0.05f;
    for (float& v : a) v = sa * normal(rng);
    for (float& v : b) v = sb * normal(rng);
    const std::string module = "base_model.model." + prefix + "model." + t.name;
    tensors.push_back(f32_tensor(module + ".lora_A.weight", {ad.rank, w.cols}, a));
    tensors.push_back(f32_tensor(module + ".lora_B.weight", {w.rows, ad.rank}, b));
    ad.pairs[t.name] = {std::move(a), std::move(b)};
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  nlohmann::json config = {{"r", ad.rank},
                           {"lora_alpha", ad.alpha},
                           {"use_rslora", rslora},
                           {"target_modules", "all-linear"},
                           {"base_model_name_or_path", "ignored"},
                           {"peft_type", "LORA"}};
  std::ofstream(dir / "adapter_config.json") << config.dump();
  return ad;
}

// A copy of the checkpoint with every adapted matrix replaced by W + scale B A in fp32
// (quantized ones decoded first).
fs::path write_merged(const Model& model, const fs::path& src, const TestAdapter& ad,
                      const fs::path& dir) {
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().extension() != ".safetensors") fs::copy(e.path(), dir / e.path().filename());
  }
  const SafetensorsFile file = SafetensorsFile::open(src / "model.safetensors");
  std::map<std::string, const LoraTargets::Target*> merged;  // checkpoint prefix -> target
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : file.tensors()) {
    std::string prefix;
    for (std::string_view suffix :
         {".weight", ".weight_packed", ".weight_scale", ".weight_shape"}) {
      if (t.name.size() > suffix.size() &&
          t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        prefix = t.name.substr(0, t.name.size() - suffix.size());
        break;
      }
    }
    const int64_t target =
        prefix.empty() ? -1 : model.lora_targets()->find(LoraTargets::canonical_name(prefix));
    if (target < 0) {
      out.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)});
      continue;
    }
    if (merged.count(prefix) != 0) continue;
    const LoraTargets::Target& tg = model.lora_targets()->targets()[target];
    merged[prefix] = &tg;
    const Weight& w = *tg.weight;
    const auto& [a, b] = ad.pairs.at(tg.name);
    std::vector<float> m(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      w.dequantize_row(r, m.data() + r * w.cols);
      for (int64_t c = 0; c < w.cols; ++c) {
        double acc = 0.0;
        for (int64_t j = 0; j < ad.rank; ++j) acc += double{b[r * ad.rank + j]} * a[j * w.cols + c];
        m[r * w.cols + c] = static_cast<float>(m[r * w.cols + c] + ad.scale() * acc);
      }
    }
    out.push_back(f32_tensor(prefix + ".weight", {w.rows, w.cols}, m));
  }
  write_safetensors(dir / "model.safetensors", out);
  // Merged matrices are dense fp32 now: no quantization config for them.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config.erase("quantization_config");
  if (config.contains("text_config")) config["text_config"].erase("quantization_config");
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

struct LoraRun {
  std::vector<std::vector<float>> logits;  // per step: all positions
};

// A prompt then three decode tokens, as one sequence (slot: its adapter slot).
LoraRun run_alone(const Model& model, const std::vector<int32_t>& prompt, int32_t slot) {
  return {test::run_steps(model, {prompt, {5}, {9}, {2}}, slot)};
}

double max_abs_diff(const LoraRun& x, const LoraRun& y) {
  double m = 0.0;
  for (size_t s = 0; s < x.logits.size(); ++s) {
    EXPECT_EQ(x.logits[s].size(), y.logits[s].size());
    for (size_t i = 0; i < x.logits[s].size(); ++i) {
      m = std::max(m, std::abs(double{x.logits[s][i]} - y.logits[s][i]));
    }
  }
  return m;
}

double max_abs(const LoraRun& x) {
  double m = 0.0;
  for (const auto& l : x.logits) {
    for (float v : l) m = std::max(m, std::abs(double{v}));
  }
  return m;
}

struct Case {
  const char* dir;
  const char* prefix;  // module paths' prefix before model.layers
};

class Lora : public testing::TestWithParam<Case> {};

std::string sanitize(std::string s) {
  for (char& c : s) {
    if (c == '/') c = '_';
  }
  return s;
}

const std::vector<int32_t> kPrompt = {3, 17, 42, 8, 99, 1, 64, 23, 7, 11, 250, 4};

TEST_P(Lora, AdapterEqualsMergedWeightsAndNoAdapterIsBitwiseBase) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_merge_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  auto model = Model::load(src);
  const LoraRun base = run_alone(*model, kPrompt, -1);
  model->enable_lora(2);
  const int64_t num_targets = static_cast<int64_t>(model->lora_targets()->targets().size());
  const TestAdapter ad =
      write_adapter(*model, dir / "adapter", 11, /*rslora=*/false, GetParam().prefix);
  model->set_lora(0, model->read_lora(ad.dir, "x", 16));
  const LoraRun with = run_alone(*model, kPrompt, 0);
  const LoraRun without = run_alone(*model, kPrompt, -1);
  EXPECT_EQ(without.logits, base.logits) << "a sequence without an adapter changed";
  EXPECT_GT(max_abs_diff(with, base), 1e-3) << "the adapter changed nothing";

  const fs::path merged_dir = write_merged(*model, src, ad, dir / "merged");
  const auto merged = Model::load(merged_dir);
  const LoraRun want = run_alone(*merged, kPrompt, -1);
  const double diff = max_abs_diff(with, want), scale = max_abs(want);
  std::printf("%s: %lld targets, max |lora - merged| = %.3g (max |logit| %.3g)\n", GetParam().dir,
              static_cast<long long>(num_targets), diff, scale);
  EXPECT_LE(diff, 1e-4 * std::max(1.0, scale));
  fs::remove_all(dir);
}

TEST_P(Lora, RsLoraScaleAndMixedBatchEqualsEachAlone) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_mixed_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  auto model = Model::load(src);
  model->enable_lora(3);
  const TestAdapter x = write_adapter(*model, dir / "x", 21, false, GetParam().prefix);
  const TestAdapter y = write_adapter(*model, dir / "y", 22, /*rslora=*/true, "");
  model->set_lora(0, model->read_lora(x.dir, "x", 16));
  model->set_lora(2, model->read_lora(y.dir, "y", 16));
  const std::vector<int32_t> slots = {0, -1, 2, 0};
  std::vector<LoraRun> alone;
  for (int32_t s : slots) alone.push_back(run_alone(*model, kPrompt, s));
  EXPECT_NE(alone[0].logits, alone[2].logits);
  EXPECT_EQ(alone[0].logits, alone[3].logits);
  // Together: each step all four sequences in one batch (prompts of different lengths).
  Workspace ws(&model->backend());
  std::vector<SequenceState> states;
  for (size_t i = 0; i < slots.size(); ++i) states.push_back(model->new_sequence());
  std::vector<std::vector<int32_t>> steps = {kPrompt, {5}, {9}, {2}};
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<SequenceInput> batch;
    for (size_t i = 0; i < slots.size(); ++i) {
      batch.push_back(model->prepare(states[i], steps[s], true));
      batch.back().lora_slot = slots[i];
    }
    std::vector<float> logits;
    model->forward(batch, logits, ws);
    size_t row = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      states[i].num_tokens += static_cast<int64_t>(steps[s].size());
      const std::vector<float>& want = alone[i].logits[s];
      EXPECT_EQ(std::vector<float>(logits.begin() + row, logits.begin() + row + want.size()), want)
          << "sequence " << i << " (slot " << slots[i] << ") step " << s;
      row += want.size();
    }
  }
  fs::remove_all(dir);
}

// The CUDA MoE kernels read a layer's routed experts' adapters as one block of the table,
// [expert][gate, up, down][slot] (MoeParams::expert_lora_table): the targets are laid out so,
// and LoraTable::matrices(first) is the per-target modules' entries, slot by slot.
TEST_P(Lora, RoutedExpertsAreOneBlockOfTargets) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  auto model = Model::load(src);
  model->enable_lora(3);
  const LoraTargets& targets = *model->lora_targets();
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_block_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  test::write_adapter(*model, dir, 11);
  LoraTable table(targets, 3);
  table.set(2, model->read_lora(dir, "block", 4));
  int64_t layers = 0;
  for (int64_t first = 0; first < std::ssize(targets.targets()); ++first) {
    const LoraTargets::Target& head = targets.targets()[first];
    if (targets.experts_first_target(head.weight) != first) continue;
    ++layers;
    const int64_t count = targets.num_experts(head.layer);
    ASSERT_GT(count, 0);
    const std::string prefix = "layers." + std::to_string(head.layer) + ".mlp.experts.";
    for (int64_t e = 0; e < count; ++e) {
      const char* projs[3] = {"gate_proj", "up_proj", "down_proj"};
      for (int j = 0; j < 3; ++j) {
        const int64_t t = first + 3 * e + j;
        EXPECT_EQ(targets.targets()[t].name, prefix + std::to_string(e) + "." + projs[j]);
        if (j > 0) {
          EXPECT_EQ(targets.experts_first_target(targets.targets()[t].weight), -1);
        }
        const LoraMatrices* block = table.matrices(first) + (3 * e + j) * table.num_slots();
        const LoraModule m = table.module(t);
        ASSERT_FALSE(m.empty());
        for (int64_t slot = 0; slot < table.num_slots(); ++slot) {
          EXPECT_EQ(block[slot].a, m.slots[slot].a);
          EXPECT_EQ(block[slot].b, m.slots[slot].b);
        }
        EXPECT_TRUE(block[0].empty());
        EXPECT_FALSE(block[2].empty());
      }
    }
  }
  EXPECT_GT(layers, 0);
  fs::remove_all(dir);
}

// A GPU slot's room (LoraTable::device_slot_bytes, allocated before the KV pool is planned)
// holds exactly an adapter of the rank limit on every target, routed experts included; the CPU
// reserves nothing (the adapters stay in host memory).
TEST_P(Lora, DeviceSlotRoomFitsTheLargestAdapterExactly) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  auto model = Model::load(src);
  model->enable_lora(1);
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_room_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  // write_adapter's rank is 4.
  test::write_adapter(*model, dir, 5);
  const auto adapter = model->read_lora(dir, "room", 4);
  int64_t floats = 0, experts = 0;
  for (const LoraAdapter::Pair& p : adapter->pairs) {
    floats += std::ssize(p.a) + std::ssize(p.b);
    experts += p.module.find(".mlp.experts.") != std::string::npos ? 1 : 0;
  }
  EXPECT_GT(experts, 0);  // every fixture has routed experts
  EXPECT_EQ(std::ssize(adapter->pairs), std::ssize(model->lora_targets()->targets()));
  EXPECT_EQ(LoraTable::device_slot_bytes(*model->lora_targets(), 4), floats * 4);
  EXPECT_EQ(LoraTable::device_slot_bytes(*model->lora_targets(), 8), floats * 8);
  EXPECT_EQ(model->lora_device_bytes(4, 64), 0);
  fs::remove_all(dir);
}

TEST_P(Lora, BadAdaptersAreRefusedNamingTheTensor) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_bad_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  auto model = Model::load(src);
  model->enable_lora(1);
  const LoraTargets::Target& t = model->lora_targets()->targets()[0];
  auto write = [&](const std::string& name, int64_t r, std::vector<int64_t> a_shape,
                   std::vector<int64_t> b_shape, const std::string& module) {
    const fs::path d = dir / name;
    fs::create_directories(d);
    std::vector<float> a(static_cast<size_t>(a_shape[0] * a_shape[1]), 0.1f);
    std::vector<float> b(static_cast<size_t>(b_shape[0] * b_shape[1]), 0.1f);
    write_safetensors(
        d / "adapter_model.safetensors",
        {f32_tensor("base_model.model.model." + module + ".lora_A.weight", a_shape, a),
         f32_tensor("base_model.model.model." + module + ".lora_B.weight", b_shape, b)});
    std::ofstream(d / "adapter_config.json")
        << nlohmann::json{{"r", r}, {"lora_alpha", 16}, {"target_modules", "all-linear"}}.dump();
    return d;
  };
  const Weight& w = *t.weight;
  auto refused = [&](const fs::path& d, const std::string& needle) {
    try {
      model->read_lora(d, "bad", 16);
      ADD_FAILURE() << d << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Wrong shape of lora_B.
  refused(write("shape", 4, {4, w.cols}, {w.rows + 1, 4}, t.name), t.name + ".lora_B.weight");
  // Unknown module.
  refused(write("unknown", 4, {4, w.cols}, {w.rows, 4}, "layers.0.self_attn.nonesuch_proj"),
          "nonesuch_proj.lora_A.weight");
  // Rank over the limit.
  refused(write("rank", 32, {32, w.cols}, {w.rows, 32}, t.name), "rank 32 is over");
  // PEFT options that change the math, and fields of the wrong type; nulls read as absent.
  const fs::path good = write("options", 4, {4, w.cols}, {w.rows, 4}, t.name);
  const auto with = [&](const nlohmann::json& extra) {
    nlohmann::json c = {{"r", 4}, {"lora_alpha", 16}, {"target_modules", "all-linear"}};
    c.update(extra);
    std::ofstream(good / "adapter_config.json") << c.dump();
    return good;
  };
  refused(with({{"fan_in_fan_out", true}}), "fan_in_fan_out");
  refused(with({{"bias", "lora_only"}}), "bias \"lora_only\"");
  refused(with({{"lora_bias", true}}), "lora_bias");
  refused(with({{"use_dora", true}}), "DoRA");
  refused(with({{"use_rslora", "yes"}}), "use_rslora must be true or false");
  refused(with({{"lora_alpha", "16"}}), "lora_alpha must be a number");
  refused(with({{"rank_pattern", {{"q_proj", 8}}}}), "rank_pattern");
  const auto ok = model->read_lora(with({{"use_rslora", nullptr},
                                         {"use_dora", nullptr},
                                         {"lora_alpha", nullptr},
                                         {"bias", "none"},
                                         {"rank_pattern", nlohmann::json::object()},
                                         {"modules_to_save", nullptr},
                                         {"fan_in_fan_out", false}}),
                                   "ok", 16);
  ASSERT_EQ(ok->pairs.size(), 1u);
  EXPECT_EQ(ok->pairs[0].scale, 1.0f);  // lora_alpha absent: alpha = r
  fs::remove_all(dir);
}

// vLLM's fused 3-D expert form (PEFT target_parameters): per MoE layer experts.base_layer
// (gate and up: lora_A [E r, in], lora_B [2 inter, E r]) and experts (down), the expert index
// slowest in lora_A and fastest in lora_B. Written from the per-expert adapter's own matrices,
// it reads back as exactly the same pairs; a wrong shape is refused naming the tensor.
TEST_P(Lora, FusedExpertFormReadsAsThePerExpertPairs) {
  const fs::path src = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_fused_" + std::to_string(::getpid()) + sanitize(GetParam().dir));
  fs::remove_all(dir);
  auto model = Model::load(src);
  model->enable_lora(1);
  const TestAdapter per = write_adapter(*model, dir / "per", 11, false, GetParam().prefix);
  // Layers with routed experts, and their expert counts.
  std::map<std::string, int64_t> layers;  // "layers.N.mlp" -> E
  for (const LoraTargets::Target& t : model->lora_targets()->targets()) {
    const size_t at = t.name.find(".mlp.experts.");
    if (at != std::string::npos && t.name.ends_with(".gate_proj"))
      ++layers[t.name.substr(0, at + 4)];
  }
  if (layers.empty()) GTEST_SKIP() << "no routed experts";
  std::vector<TensorToWrite> tensors;
  const int64_t r = per.rank;
  for (const LoraTargets::Target& t : model->lora_targets()->targets()) {
    if (t.name.find(".mlp.experts.") != std::string::npos) continue;
    const auto& [a, b] = per.pairs.at(t.name);
    const std::string module =
        std::string("base_model.model.") + GetParam().prefix + "model." + t.name;
    tensors.push_back(f32_tensor(module + ".lora_A.weight", {r, t.weight->cols}, a));
    tensors.push_back(f32_tensor(module + ".lora_B.weight", {t.weight->rows, r}, b));
  }
  for (const auto& [layer, num_experts] : layers) {
    for (const bool gate_up : {true, false}) {
      const std::vector<std::string> projs = gate_up
                                                 ? std::vector<std::string>{"gate_proj", "up_proj"}
                                                 : std::vector<std::string>{"down_proj"};
      const Weight& w0 =
          *model->lora_targets()
               ->targets()[model->lora_targets()->find(layer + ".experts.0." + projs[0])]
               .weight;
      const int64_t in = w0.cols, out_each = w0.rows, er = num_experts * r;
      const int64_t out = out_each * static_cast<int64_t>(projs.size());
      std::vector<float> fa(static_cast<size_t>(er * in)), fb(static_cast<size_t>(out * er));
      for (int64_t e = 0; e < num_experts; ++e) {
        for (size_t part = 0; part < projs.size(); ++part) {
          const auto& [a, b] =
              per.pairs.at(layer + ".experts." + std::to_string(e) + "." + projs[part]);
          // gate and up share A in this form: write gate's (up's A is checked below).
          if (part == 0) std::copy(a.begin(), a.end(), fa.begin() + e * r * in);
          for (int64_t o = 0; o < out_each; ++o) {
            for (int64_t k = 0; k < r; ++k) {
              fb[static_cast<size_t>((static_cast<int64_t>(part) * out_each + o) * er +
                                     k * num_experts + e)] = b[static_cast<size_t>(o * r + k)];
            }
          }
        }
      }
      const std::string module = std::string("base_model.model.") + GetParam().prefix + "model." +
                                 layer + (gate_up ? ".experts.base_layer" : ".experts");
      tensors.push_back(f32_tensor(module + ".lora_A.weight", {er, in}, fa));
      tensors.push_back(f32_tensor(module + ".lora_B.weight", {out, er}, fb));
    }
  }
  fs::create_directories(dir / "fused");
  write_safetensors(dir / "fused" / "adapter_model.safetensors", tensors);
  const nlohmann::json config = {
      {"r", r},
      {"lora_alpha", per.alpha},
      {"target_modules", "all-linear"},
      {"target_parameters", {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}},
      {"peft_type", "LORA"}};
  std::ofstream(dir / "fused" / "adapter_config.json") << config.dump();
  const auto fused = model->read_lora(dir / "fused", "fused", 16);
  const auto plain = model->read_lora(dir / "per", "per", 16);
  ASSERT_EQ(fused->pairs.size(), plain->pairs.size());
  for (size_t i = 0; i < plain->pairs.size(); ++i) {
    const LoraAdapter::Pair& x = fused->pairs[i];
    const LoraAdapter::Pair& y = plain->pairs[i];
    const std::string& name = model->lora_targets()->targets()[y.target].name;
    ASSERT_EQ(x.target, y.target) << name;
    EXPECT_EQ(x.b, y.b) << name;
    EXPECT_EQ(x.scale, y.scale) << name;
    // up_proj's A is gate's in the fused form.
    const std::string a_of =
        name.ends_with(".up_proj") && name.find(".experts.") != std::string::npos
            ? name.substr(0, name.size() - 7) + "gate_proj"
            : name;
    EXPECT_EQ(x.a, per.pairs.at(a_of).first) << name;
  }
  // A fused lora_B of the wrong width is refused naming it.
  for (TensorToWrite& t : tensors) {
    if (t.name.ends_with(".experts.lora_B.weight")) {
      t.shape[1] -= 1;
      t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1] * 4));
      break;
    }
  }
  write_safetensors(dir / "fused" / "adapter_model.safetensors", tensors);
  try {
    model->read_lora(dir / "fused", "bad", 16);
    ADD_FAILURE() << "a misshapen fused lora_B was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".experts.lora_B.weight"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, Lora,
                         testing::Values(Case{"models/tiny-kimi-k3", "language_model."},
                                         Case{"tests/fixtures/deepseek_v32_tiny", ""},
                                         Case{"tests/fixtures/kimi_linear_tiny", ""}),
                         [](const auto& param_info) {
                           return std::string(param_info.index == 0   ? "tiny_kimi_k3"
                                              : param_info.index == 1 ? "deepseek_v32"
                                                                      : "kimi_linear");
                         });

}  // namespace
}  // namespace hyserve
