#include "model/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr std::initializer_list<DType> kFloatDTypes = {DType::kF32, DType::kF16, DType::kBF16};

#define FAIL_IN(where, ...) HYSERVE_THROW(CheckpointError, where, ": ", __VA_ARGS__)

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string dtypes_string(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType t : dtypes) s += (s.empty() ? "" : "/") + std::string(dtype_name(t));
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// tensor name -> shard file name, from model.safetensors.index.json.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string where = index_path.string();
  std::ifstream in(index_path, std::ios::binary);
  if (!in) FAIL_IN(where, "cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FAIL_IN(where, "not valid JSON: ", e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    FAIL_IN(where, "no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) FAIL_IN(where, "weight_map entry ", tensor, " is not a file name");
    weight_map[tensor] = shard.get<std::string>();
  }
  return weight_map;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const std::string where = "checkpoint " + dir.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) FAIL_IN(where, "not a folder");

  const fs::path index_path = dir / kIndexFile;
  if (fs::exists(index_path, ec)) {
    const auto weight_map = read_weight_map(index_path);
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) {
      if (shards.insert(shard).second && !fs::is_regular_file(dir / shard, ec)) {
        FAIL_IN(index_path.string(), "shard ", (dir / shard).string(), " (listed for tensor ",
                tensor, ") does not exist");
      }
    }
    for (const auto& shard : shards) ckpt.files_.push_back(SafetensorsFile::open(dir / shard));
    ckpt.index_tensors();
    for (const auto& [tensor, shard] : weight_map) {
      const std::string shard_file = (dir / shard).string();
      const TensorInfo* t = ckpt.find(tensor);
      if (!t || t->file != shard_file) {
        FAIL_IN(index_path.string(), "tensor ", tensor, " is listed in shard ", shard_file,
                " but missing from it", t ? " (found in " + t->file + ")" : "");
      }
    }
    return ckpt;
  }

  if (fs::exists(dir / kSingleFile, ec)) {
    ckpt.files_.push_back(SafetensorsFile::open(dir / kSingleFile));
    ckpt.index_tensors();
    return ckpt;
  }

  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") paths.push_back(entry.path());
  }
  if (ec) FAIL_IN(where, "cannot list: ", ec.message());
  if (paths.empty()) FAIL_IN(where, "no .safetensors files");
  std::sort(paths.begin(), paths.end());
  for (const auto& path : paths) ckpt.files_.push_back(SafetensorsFile::open(path));
  ckpt.index_tensors();
  return ckpt;
}

Checkpoint Checkpoint::open_with(const fs::path& dir, std::vector<OverrideTensor> overrides) {
  Checkpoint ckpt = open(dir);
  ckpt.overrides_ = std::move(overrides);
  for (const OverrideTensor& o : ckpt.overrides_) {
    const TensorInfo& t = o.info;
    const auto it = ckpt.tensors_.find(t.name);
    if (it == ckpt.tensors_.end()) {
      FAIL_IN(t.file, "tensor ", t.name, " is not a tensor of the model (", dir.string(), ")");
    }
    const TensorInfo& was = *it->second;
    if (was.dtype != t.dtype || was.shape != t.shape) {
      FAIL_IN(t.file, "tensor ", t.name, " is ", dtype_name(t.dtype), " ", shape_string(t.shape),
              " where the model's is ", dtype_name(was.dtype), " ", shape_string(was.shape));
    }
    CHECK(o.bytes != nullptr && t.data == o.bytes->data() &&
              static_cast<int64_t>(o.bytes->size()) == t.num_bytes,
          "override tensor ", t.name, ": its info does not describe its bytes");
    it->second = &o.info;
  }
  return ckpt;
}

void Checkpoint::index_tensors() {
  for (const auto& file : files_) {
    for (const auto& t : file.tensors()) {
      const auto [it, inserted] = tensors_.emplace(t.name, &t);
      if (!inserted) {
        FAIL_IN("checkpoint " + dir_.string(), "tensor ", t.name, " is in both ", it->second->file,
                " and ", t.file);
      }
    }
  }
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

const TensorInfo& Checkpoint::require(std::string_view name, std::initializer_list<DType> allowed,
                                      std::vector<int64_t> shape) const {
  const TensorInfo* t = find(name);
  if (!t) FAIL_IN("checkpoint " + dir_.string(), "missing tensor ", name);
  if (allowed.size() == 0) allowed = kFloatDTypes;
  if (std::find(allowed.begin(), allowed.end(), t->dtype) == allowed.end()) {
    FAIL_IN(t->file, "tensor ", name, " has dtype ", dtype_name(t->dtype), ", expected ",
            dtypes_string(allowed));
  }
  if (t->shape != shape) {
    FAIL_IN(t->file, "tensor ", name, " has shape ", shape_string(t->shape), ", expected ",
            shape_string(shape));
  }
  return *t;
}

std::vector<float> Checkpoint::load_f32(std::string_view name, std::vector<int64_t> shape) const {
  const TensorInfo& t = require(name, {}, std::move(shape));
  std::vector<float> values(static_cast<size_t>(t.num_elements()));
  if (!values.empty()) convert_to_f32(t.data, t.dtype, values.data(), t.num_elements());
  return values;
}

Weight Checkpoint::load_weight(const std::string& prefix, int64_t rows, int64_t cols) const {
  CHECK(rows > 0 && cols > 0, "load_weight ", prefix, ": rows ", rows, " and cols ", cols,
        " must be positive");
  Weight w;
  w.rows = rows;
  w.cols = cols;
  const std::string weight_name = prefix + ".weight";
  const std::string blocks_name = prefix + ".weight_blocks";

  if (const TensorInfo* t = find(weight_name); t && t->dtype == DType::kE4M3) {
    const std::string scale_name = prefix + ".weight_scale_inv";
    if (!contains(scale_name)) {
      FAIL_IN(t->file, "FP8 weight ", weight_name, " has no ", scale_name);
    }
    w.format = WeightFormat::kFp8Block;
    w.dtype = DType::kE4M3;
    w.data = require(weight_name, {DType::kE4M3}, {rows, cols}).data;
    const TensorInfo& scales =
        require(scale_name, {DType::kF32, DType::kBF16},
                {ceil_div(rows, Weight::kFp8BlockSize), ceil_div(cols, Weight::kFp8BlockSize)});
    w.scales = scales.data;
    w.scales_dtype = scales.dtype;
    return w;
  }
  if (const TensorInfo* t = find(weight_name)) {
    const TensorInfo& dense = require(weight_name, kFloatDTypes, {rows, cols});
    w.format = WeightFormat::kDense;
    w.dtype = t->dtype;
    w.data = dense.data;
    return w;
  }
  if (const TensorInfo* t = find(blocks_name)) {
    if (cols % Weight::kMxfp4BlockSize != 0) {
      FAIL_IN(t->file, "MXFP4 weight ", blocks_name, ": cols ", cols, " is not a multiple of ",
              Weight::kMxfp4BlockSize);
    }
    const int64_t num_blocks = cols / Weight::kMxfp4BlockSize;
    const int64_t block_bytes = Weight::kMxfp4BlockSize / 2;
    w.format = WeightFormat::kMxfp4;
    w.dtype = DType::kU8;
    w.data = require(blocks_name, {DType::kU8}, {rows, num_blocks, block_bytes}).data;
    const TensorInfo& scales =
        require(prefix + ".weight_scales", {DType::kU8, DType::kE8M0}, {rows, num_blocks});
    w.scales = scales.data;
    w.scales_dtype = scales.dtype;
    return w;
  }
  const std::string packed_name = prefix + ".weight_packed";
  if (const TensorInfo* t = find(packed_name); t && t->dtype == DType::kI32) {
    return load_int4(prefix, *t, rows, cols);
  }
  // compressed-tensors' mxfp4-pack-quantized (the published Kimi K3 experts): the same
  // bytes as weight_blocks, stored [rows, cols/2]; scales [rows, cols/32].
  if (const TensorInfo* t = find(packed_name)) {
    if (cols % Weight::kMxfp4BlockSize != 0) {
      FAIL_IN(t->file, "MXFP4 weight ", packed_name, ": cols ", cols, " is not a multiple of ",
              Weight::kMxfp4BlockSize);
    }
    w.format = WeightFormat::kMxfp4;
    w.dtype = DType::kU8;
    w.data = require(packed_name, {DType::kU8}, {rows, cols / 2}).data;
    const TensorInfo& scales = require(prefix + ".weight_scale", {DType::kU8, DType::kE8M0},
                                       {rows, cols / Weight::kMxfp4BlockSize});
    w.scales = scales.data;
    w.scales_dtype = scales.dtype;
    return w;
  }
  FAIL_IN("checkpoint " + dir_.string(), "missing tensor ", weight_name);
}

// compressed-tensors' pack-quantized int4 (Kimi K2 Thinking / K2.5 experts): weight_packed
// I32 [rows, cols/8], value j of a word in bits 4j..4j+3 as q + 8. Its little-endian
// bytes are kInt4's [rows, cols/2] nibble pairs (element 2i low), read in place.
Weight Checkpoint::load_int4(const std::string& prefix, const TensorInfo& packed, int64_t rows,
                             int64_t cols) const {
  static_assert(std::endian::native == std::endian::little,
                "INT4 weights are read as the bytes of little-endian int32 words");
  const std::string packed_name = prefix + ".weight_packed";
  if (cols % Weight::kInt4GroupSize != 0) {
    FAIL_IN(packed.file, "INT4 weight ", packed_name, ": cols ", cols, " is not a multiple of ",
            Weight::kInt4GroupSize);
  }
  const std::string shape_name = prefix + ".weight_shape";
  const TensorInfo* shape = find(shape_name);
  if (!shape) FAIL_IN(packed.file, "INT4 weight ", packed_name, " has no ", shape_name);
  require(shape_name, {DType::kI32, DType::kI64}, {2});
  int64_t dims[2];
  for (int i = 0; i < 2; ++i) {
    if (shape->dtype == DType::kI64) {
      std::memcpy(&dims[i], shape->data + 8 * i, 8);
    } else {
      int32_t d;
      std::memcpy(&d, shape->data + 4 * i, 4);
      dims[i] = d;
    }
  }
  if (dims[0] != rows || dims[1] != cols) {
    FAIL_IN(shape->file, "tensor ", shape_name, " = [", dims[0], ", ", dims[1], "], expected [",
            rows, ", ", cols, "]");
  }
  Weight w;
  w.rows = rows;
  w.cols = cols;
  w.format = WeightFormat::kInt4;
  w.dtype = DType::kU8;
  w.data = require(packed_name, {DType::kI32}, {rows, cols / 8}).data;
  const std::string scale_name = prefix + ".weight_scale";
  if (!contains(scale_name))
    FAIL_IN(packed.file, "INT4 weight ", packed_name, " has no ", scale_name);
  const TensorInfo& scales = require(scale_name, {DType::kBF16, DType::kF16, DType::kF32},
                                     {rows, cols / Weight::kInt4GroupSize});
  w.scales = scales.data;
  w.scales_dtype = scales.dtype;
  return w;
}

}  // namespace hyserve
