// TensorSource: where load_weights finds a model's tensors by name. A Checkpoint
// (safetensors on disk) is one; RandomWeights (synthetic tensors of the right shapes
// and formats, for benchmarks at full model size) is another.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/weight.h"
#include "model/safetensors.h"

namespace hyserve {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // nullptr when absent (or when the source makes tensors on demand).
  virtual const TensorInfo* find(std::string_view name) const = 0;
  virtual bool contains(std::string_view name) const { return find(name) != nullptr; }
  // A float tensor of this shape, converted to fp32.
  virtual std::vector<float> load_f32(std::string_view name, std::vector<int64_t> shape) const = 0;
  // The matrix [rows, cols] stored under prefix (Checkpoint::load_weight has the rules).
  virtual Weight load_weight(const std::string& prefix, int64_t rows, int64_t cols) const = 0;
  // Where the tensors come from, for messages.
  virtual const std::filesystem::path& dir() const = 0;
};

}  // namespace hyserve
