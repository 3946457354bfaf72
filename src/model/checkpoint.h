// Checkpoint: every tensor of a model folder, memory-mapped, with per-tensor validation.
//
// A folder holds one of (checked in this order):
//   model.safetensors.index.json   {"weight_map": {tensor: shard file}}; each shard opened once
//   model.safetensors              a single file
//   *.safetensors                  unindexed shards, opened in sorted order
// A tensor name may occur in only one file; a shard's tensors beyond its index entries are kept.
// Every failure is a CheckpointError naming the file (or the folder) and the tensor.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/weight.h"
#include "model/safetensors.h"
#include "model/tensor_source.h"

namespace hyserve {

// A tensor held in memory that stands in for a checkpoint's tensor of the same name (a
// weight update's; engine/weight_transfer.h).
struct OverrideTensor {
  TensorInfo info;  // info.data points into *bytes
  std::shared_ptr<const std::vector<uint8_t>> bytes;
};

class Checkpoint final : public TensorSource {
 public:
  static Checkpoint open(const std::filesystem::path& dir);
  // The folder's checkpoint with these tensors in place of the folder's of the same names.
  // A name the folder does not hold, or a tensor whose dtype or shape differs from the
  // folder's, is a CheckpointError naming it.
  static Checkpoint open_with(const std::filesystem::path& dir,
                              std::vector<OverrideTensor> overrides);
  // The tensors open_with put in place (empty for open()).
  const std::vector<OverrideTensor>& overrides() const { return overrides_; }

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const override;
  bool contains(std::string_view name) const override { return find(name) != nullptr; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  const std::filesystem::path& dir() const override { return dir_; }

  // The tensor, checked to have one of the allowed dtypes (empty: any of F32/F16/BF16)
  // and exactly this shape.
  const TensorInfo& require(std::string_view name, std::initializer_list<DType> allowed,
                            std::vector<int64_t> shape) const;

  // A float tensor (F32/F16/BF16) of this shape, converted to fp32: norms, biases, A_log,
  // dt_bias.
  std::vector<float> load_f32(std::string_view name, std::vector<int64_t> shape) const override;

  // The matrix [rows, cols] stored under prefix, in whichever format the tensors show:
  //   prefix.weight F32/F16/BF16 [rows, cols]                                   -> kDense
  //   prefix.weight F8_E4M3 [rows, cols]
  //     + prefix.weight_scale_inv F32/BF16 [ceil(rows/128), ceil(cols/128)]    -> kFp8Block
  //   prefix.weight_blocks U8 [rows, cols/32, 16]
  //     + prefix.weight_scales U8/F8_E8M0 [rows, cols/32]                       -> kMxfp4
  //   prefix.weight_packed U8 [rows, cols/2] (compressed-tensors)
  //     + prefix.weight_scale U8/F8_E8M0 [rows, cols/32]                        -> kMxfp4
  //   prefix.weight_packed I32 [rows, cols/8] (compressed-tensors pack-quantized int4)
  //     + prefix.weight_scale BF16/F16/F32 [rows, cols/32]
  //     + prefix.weight_shape I32/I64 [2] = (rows, cols)                        -> kInt4
  // The Weight points into the mmap: it is valid while this Checkpoint lives.
  // rows and cols must be positive (InvalidArgument otherwise).
  Weight load_weight(const std::string& prefix, int64_t rows, int64_t cols) const override;

 private:
  Checkpoint() = default;
  // Indexes every tensor of files_, refusing names that occur in two files.
  void index_tensors();
  // load_weight for a pack-quantized int4 matrix whose weight_packed is `packed`.
  Weight load_int4(const std::string& prefix, const TensorInfo& packed, int64_t rows,
                   int64_t cols) const;

  std::filesystem::path dir_;
  // The mappings; tensors_ points into their TensorInfo vectors, which moving keeps in place.
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const TensorInfo*, std::less<>> tensors_;
  std::vector<OverrideTensor> overrides_;  // tensors_ points at their infos (never resized)
};

}  // namespace hyserve
