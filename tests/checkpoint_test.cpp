// Checkpoint folders: single file, indexed shards, unindexed shards; require / load_f32 /
// load_weight on handmade tensors; and each way a folder can be wrong, checking the error
// names the file (or folder) and the tensor.
#include "model/checkpoint.h"

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir =
      fs::path(testing::TempDir()) / ("hyserve_checkpoint_" + std::string(info->name()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TensorToWrite make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          uint64_t seed = 1) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(static_cast<size_t>(n * dtype_size(dtype)));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return {name, dtype, std::move(shape), std::move(bytes)};
}

TensorToWrite f32_tensor(const std::string& name, const std::vector<float>& values,
                         std::vector<int64_t> shape) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return {name, DType::kF32, std::move(shape), std::move(bytes)};
}

TensorToWrite u16_tensor(const std::string& name, DType dtype, const std::vector<uint16_t>& values,
                         std::vector<int64_t> shape) {
  std::vector<uint8_t> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return {name, dtype, std::move(shape), std::move(bytes)};
}

void write_index(const fs::path& dir, const std::map<std::string, std::string>& weight_map) {
  std::ofstream(dir / "model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
}

void expect_checkpoint_error(const std::function<void()>& fn,
                             const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no CheckpointError thrown";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    for (const auto& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "message \"" << what << "\" lacks " << part;
    }
  }
}

// ---- Folder layouts ----

TEST(Checkpoint, SingleFile) {
  const fs::path dir = fresh_dir();
  const auto b = make_tensor("b", DType::kBF16, {3, 2});
  write_safetensors(dir / "model.safetensors",
                    {make_tensor("c", DType::kU8, {5}), b, make_tensor("a", DType::kF32, {})});
  // Ignored: model.safetensors wins over other files.
  write_safetensors(dir / "other.safetensors", {make_tensor("b", DType::kU8, {1})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.dir(), dir);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(ckpt.contains("a"));
  EXPECT_FALSE(ckpt.contains("d"));
  EXPECT_EQ(ckpt.find("d"), nullptr);
  const TensorInfo* t = ckpt.find("b");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->file, (dir / "model.safetensors").string());
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::memcmp(t->data, b.bytes.data(), b.bytes.size()), 0);
}

TEST(Checkpoint, IndexedShards) {
  const fs::path dir = fresh_dir();
  const auto x = make_tensor("x", DType::kF16, {4}, 7);
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {make_tensor("w", DType::kBF16, {2, 2}), x});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {make_tensor("y", DType::kU8, {3})});
  write_safetensors(dir / "stray.safetensors", {make_tensor("w", DType::kU8, {1})});
  write_index(dir, {{"w", "model-00001-of-00002.safetensors"},
                    {"x", "model-00001-of-00002.safetensors"},
                    {"y", "model-00002-of-00002.safetensors"}});
  Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"w", "x", "y"}));
  EXPECT_EQ(ckpt.find("x")->file, (dir / "model-00001-of-00002.safetensors").string());
  EXPECT_EQ(ckpt.find("y")->file, (dir / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(std::memcmp(ckpt.find("x")->data, x.bytes.data(), x.bytes.size()), 0);

  // The mappings survive moving the Checkpoint.
  const Checkpoint moved = std::move(ckpt);
  EXPECT_EQ(std::memcmp(moved.find("x")->data, x.bytes.data(), x.bytes.size()), 0);
}

TEST(Checkpoint, UnindexedShards) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "b.safetensors", {make_tensor("t2", DType::kI32, {2})});
  write_safetensors(dir / "a.safetensors", {make_tensor("t1", DType::kI64, {1})});
  write_safetensors(dir / "c.safetensors",
                    {make_tensor("t3", DType::kBool, {0}), make_tensor("t0", DType::kI8, {1})});
  std::ofstream(dir / "config.json") << "{}";
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"t0", "t1", "t2", "t3"}));
  EXPECT_EQ(ckpt.find("t0")->file, (dir / "c.safetensors").string());
  EXPECT_EQ(ckpt.find("t1")->file, (dir / "a.safetensors").string());
}

TEST(Checkpoint, FolderWithoutSafetensors) {
  const fs::path dir = fresh_dir();
  std::ofstream(dir / "config.json") << "{}";
  expect_checkpoint_error([&] { Checkpoint::open(dir); }, {dir.string(), "no .safetensors"});
  expect_checkpoint_error([&] { Checkpoint::open(dir / "absent"); },
                          {(dir / "absent").string(), "not a folder"});
}

TEST(Checkpoint, BadFileInFolderNamesIt) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "a.safetensors", {make_tensor("t1", DType::kI64, {1})});
  std::ofstream(dir / "b.safetensors") << "garbage";
  expect_checkpoint_error([&] { Checkpoint::open(dir); }, {(dir / "b.safetensors").string()});
}

TEST(Checkpoint, DuplicateTensorAcrossUnindexedShards) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "a.safetensors", {make_tensor("dup", DType::kU8, {1})});
  write_safetensors(dir / "b.safetensors", {make_tensor("dup", DType::kU8, {2})});
  expect_checkpoint_error([&] { Checkpoint::open(dir); }, {"dup", (dir / "a.safetensors").string(),
                                                           (dir / "b.safetensors").string()});
}

TEST(Checkpoint, DuplicateTensorAcrossIndexedShards) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "s1.safetensors",
                    {make_tensor("dup", DType::kU8, {1}), make_tensor("a", DType::kU8, {1})});
  write_safetensors(dir / "s2.safetensors", {make_tensor("dup", DType::kU8, {1})});
  write_index(dir, {{"dup", "s2.safetensors"}, {"a", "s1.safetensors"}});
  expect_checkpoint_error([&] { Checkpoint::open(dir); }, {"dup", (dir / "s1.safetensors").string(),
                                                           (dir / "s2.safetensors").string()});
}

TEST(Checkpoint, IndexReferencesMissingShard) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "s1.safetensors", {make_tensor("a", DType::kU8, {1})});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  expect_checkpoint_error([&] { Checkpoint::open(dir); },
                          {"model.safetensors.index.json", (dir / "s2.safetensors").string(), "b"});
}

TEST(Checkpoint, TensorMissingFromItsShard) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "s1.safetensors", {make_tensor("a", DType::kU8, {1})});
  write_safetensors(dir / "s2.safetensors", {make_tensor("c", DType::kU8, {1})});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"c", "s2.safetensors"}});
  expect_checkpoint_error([&] { Checkpoint::open(dir); },
                          {"tensor b", (dir / "s2.safetensors").string(), "missing"});
}

TEST(Checkpoint, TensorInTheWrongShard) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "s1.safetensors",
                    {make_tensor("a", DType::kU8, {1}), make_tensor("b", DType::kU8, {1})});
  write_safetensors(dir / "s2.safetensors", {make_tensor("c", DType::kU8, {1})});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"c", "s2.safetensors"}});
  expect_checkpoint_error(
      [&] { Checkpoint::open(dir); },
      {"tensor b", (dir / "s2.safetensors").string(), (dir / "s1.safetensors").string()});
}

TEST(Checkpoint, BadIndexJson) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "s1.safetensors", {make_tensor("a", DType::kU8, {1})});
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {\"a\": ";
  expect_checkpoint_error([&] { Checkpoint::open(dir); },
                          {"model.safetensors.index.json", "not valid JSON"});
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {\"a\": 3}}";
  expect_checkpoint_error([&] { Checkpoint::open(dir); }, {"model.safetensors.index.json", "a"});
  std::ofstream(dir / "model.safetensors.index.json") << "{\"metadata\": {}}";
  expect_checkpoint_error([&] { Checkpoint::open(dir); },
                          {"model.safetensors.index.json", "weight_map"});
}

// ---- require / load_f32 ----

TEST(Checkpoint, RequireChecksDTypeAndShape) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "model.safetensors",
                    {make_tensor("w", DType::kBF16, {4, 3}), make_tensor("q", DType::kU8, {2})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  const std::string file = (dir / "model.safetensors").string();
  EXPECT_EQ(&ckpt.require("w", {}, {4, 3}), ckpt.find("w"));
  EXPECT_EQ(&ckpt.require("w", {DType::kBF16}, {4, 3}), ckpt.find("w"));
  EXPECT_EQ(&ckpt.require("q", {DType::kE8M0, DType::kU8}, {2}), ckpt.find("q"));
  expect_checkpoint_error(
      [&] {
        ckpt.require("w", {}, {3, 4});
      },
      {file, "tensor w", "[4, 3]", "[3, 4]"});
  expect_checkpoint_error([&] { ckpt.require("w", {}, {4, 3, 1}); }, {file, "tensor w"});
  expect_checkpoint_error(
      [&] {
        ckpt.require("w", {DType::kF32}, {4, 3});
      },
      {file, "tensor w", "BF16", "F32"});
  expect_checkpoint_error([&] { ckpt.require("q", {}, {2}); },
                          {file, "tensor q", "U8", "F32/F16/BF16"});
  expect_checkpoint_error([&] { ckpt.require("nope", {}, {1}); },
                          {"checkpoint " + dir.string() + ": missing tensor nope"});
}

TEST(Checkpoint, LoadF32ConvertsEveryFloatDType) {
  const fs::path dir = fresh_dir();
  // Values exact in f16 and bf16, with their bit patterns written out by hand.
  const std::vector<float> values = {1.0f, -2.0f, 0.5f, 3.0f, -0.125f};
  const std::vector<uint16_t> bf16_bits = {0x3f80, 0xc000, 0x3f00, 0x4040, 0xbe00};
  const std::vector<uint16_t> f16_bits = {0x3c00, 0xc000, 0x3800, 0x4200, 0xb000};
  write_safetensors(dir / "model.safetensors",
                    {f32_tensor("a32", values, {5}), u16_tensor("a16", DType::kF16, f16_bits, {5}),
                     u16_tensor("ab16", DType::kBF16, bf16_bits, {1, 5, 1}),
                     make_tensor("empty", DType::kBF16, {0}), make_tensor("i", DType::kI32, {5})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.load_f32("a32", {5}), values);
  EXPECT_EQ(ckpt.load_f32("a16", {5}), values);
  EXPECT_EQ(ckpt.load_f32("ab16", {1, 5, 1}), values);
  EXPECT_TRUE(ckpt.load_f32("empty", {0}).empty());
  expect_checkpoint_error([&] { ckpt.load_f32("i", {5}); }, {"tensor i", "I32"});
  expect_checkpoint_error([&] { ckpt.load_f32("a32", {1, 5}); }, {"tensor a32", "[5]"});
}

// ---- load_weight ----

TEST(Checkpoint, LoadWeightDense) {
  const fs::path dir = fresh_dir();
  write_safetensors(
      dir / "model.safetensors",
      {make_tensor("p.weight", DType::kBF16, {3, 65}), make_tensor("f.weight", DType::kF32, {1, 1}),
       make_tensor("h.weight", DType::kF16, {63, 2}), make_tensor("u.weight", DType::kU8, {2, 2})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  for (const auto& [name, dtype, rows, cols] :
       {std::tuple{"p", DType::kBF16, 3, 65}, std::tuple{"f", DType::kF32, 1, 1},
        std::tuple{"h", DType::kF16, 63, 2}}) {
    const Weight w = ckpt.load_weight(name, rows, cols);
    EXPECT_EQ(w.format, WeightFormat::kDense) << name;
    EXPECT_EQ(w.dtype, dtype) << name;
    EXPECT_EQ(w.rows, rows) << name;
    EXPECT_EQ(w.cols, cols) << name;
    EXPECT_EQ(w.data, ckpt.find(std::string(name) + ".weight")->data) << name;
    EXPECT_EQ(w.scales, nullptr) << name;
  }
  const std::string file = (dir / "model.safetensors").string();
  expect_checkpoint_error([&] { ckpt.load_weight("p", 65, 3); }, {file, "p.weight", "[3, 65]"});
  expect_checkpoint_error([&] { ckpt.load_weight("u", 2, 2); }, {file, "u.weight", "U8"});
  expect_checkpoint_error([&] { ckpt.load_weight("absent", 2, 2); },
                          {dir.string(), "missing tensor absent.weight"});
  EXPECT_THROW(ckpt.load_weight("p", 0, 65), InvalidArgument);
}

TEST(Checkpoint, LoadWeightFp8Block) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "model.safetensors",
                    {make_tensor("a.weight", DType::kE4M3, {130, 65}),
                     make_tensor("a.weight_scale_inv", DType::kF32, {2, 1}),
                     make_tensor("b.weight", DType::kE4M3, {128, 256}),
                     make_tensor("b.weight_scale_inv", DType::kBF16, {1, 2}),
                     make_tensor("c.weight", DType::kE4M3, {4, 4}),
                     make_tensor("d.weight", DType::kE4M3, {129, 4}),
                     make_tensor("d.weight_scale_inv", DType::kF32, {1, 1}),
                     make_tensor("e.weight", DType::kE4M3, {4, 4}),
                     make_tensor("e.weight_scale_inv", DType::kE8M0, {1, 1})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  for (const auto& [name, scales_dtype, rows, cols] :
       {std::tuple{"a", DType::kF32, 130, 65}, std::tuple{"b", DType::kBF16, 128, 256}}) {
    const Weight w = ckpt.load_weight(name, rows, cols);
    EXPECT_EQ(w.format, WeightFormat::kFp8Block) << name;
    EXPECT_EQ(w.dtype, DType::kE4M3) << name;
    EXPECT_EQ(w.rows, rows) << name;
    EXPECT_EQ(w.cols, cols) << name;
    EXPECT_EQ(w.data, ckpt.find(std::string(name) + ".weight")->data) << name;
    EXPECT_EQ(w.scales, ckpt.find(std::string(name) + ".weight_scale_inv")->data) << name;
    EXPECT_EQ(w.scales_dtype, scales_dtype) << name;
  }
  const std::string file = (dir / "model.safetensors").string();
  expect_checkpoint_error([&] { ckpt.load_weight("c", 4, 4); },
                          {file, "c.weight", "c.weight_scale_inv"});
  expect_checkpoint_error([&] { ckpt.load_weight("d", 129, 4); },
                          {file, "d.weight_scale_inv", "[1, 1]", "[2, 1]"});
  expect_checkpoint_error([&] { ckpt.load_weight("e", 4, 4); },
                          {file, "e.weight_scale_inv", "F8_E8M0"});
  expect_checkpoint_error([&] { ckpt.load_weight("a", 130, 64); }, {file, "a.weight", "[130, 64]"});
}

TEST(Checkpoint, LoadWeightMxfp4) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "model.safetensors",
                    {make_tensor("m.weight_blocks", DType::kU8, {3, 2, 16}),
                     make_tensor("m.weight_scales", DType::kE8M0, {3, 2}),
                     make_tensor("n.weight_blocks", DType::kU8, {1, 1, 16}),
                     make_tensor("n.weight_scales", DType::kU8, {1, 1}),
                     make_tensor("bad.weight_blocks", DType::kU8, {3, 2, 16}),
                     make_tensor("bad.weight_scales", DType::kE8M0, {3, 1}),
                     make_tensor("odd.weight_blocks", DType::kU8, {2, 1, 16}),
                     make_tensor("odd.weight_scales", DType::kE8M0, {2, 1}),
                     make_tensor("lone.weight_blocks", DType::kU8, {2, 1, 16})});
  const Checkpoint ckpt = Checkpoint::open(dir);
  for (const auto& [name, scales_dtype, rows, cols] :
       {std::tuple{"m", DType::kE8M0, 3, 64}, std::tuple{"n", DType::kU8, 1, 32}}) {
    const Weight w = ckpt.load_weight(name, rows, cols);
    EXPECT_EQ(w.format, WeightFormat::kMxfp4) << name;
    EXPECT_EQ(w.dtype, DType::kU8) << name;
    EXPECT_EQ(w.rows, rows) << name;
    EXPECT_EQ(w.cols, cols) << name;
    EXPECT_EQ(w.data, ckpt.find(std::string(name) + ".weight_blocks")->data) << name;
    EXPECT_EQ(w.scales, ckpt.find(std::string(name) + ".weight_scales")->data) << name;
    EXPECT_EQ(w.scales_dtype, scales_dtype) << name;
  }
  const std::string file = (dir / "model.safetensors").string();
  expect_checkpoint_error([&] { ckpt.load_weight("bad", 3, 64); },
                          {file, "bad.weight_scales", "[3, 1]", "[3, 2]"});
  expect_checkpoint_error([&] { ckpt.load_weight("odd", 2, 48); },
                          {file, "odd.weight_blocks", "multiple of 32"});
  expect_checkpoint_error([&] { ckpt.load_weight("m", 3, 32); },
                          {file, "m.weight_blocks", "[3, 2, 16]", "[3, 1, 16]"});
  expect_checkpoint_error([&] { ckpt.load_weight("lone", 2, 32); },
                          {"missing tensor lone.weight_scales"});
}

}  // namespace
}  // namespace hyserve
