// Safetensors files: a memory-mapped reader that validates every header entry, and a
// writer (tests build good and bad checkpoints with it; tools convert weights with it).
//
// File layout (https://github.com/huggingface/safetensors):
//
//   +----------+----------------------------+------------------------------------+
//   | u64 (LE) | N bytes of JSON header     | data buffer                        |
//   |    N     | (space-padded to 8 bytes)  | tensors at [begin, end) offsets    |
//   +----------+----------------------------+------------------------------------+
//   0          8                            8+N                              file size
//
// Header: {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//          "__metadata__": {"<key>": "<value>", ...}}, offsets relative to the data buffer.
//
// The parser trusts nothing: every failure is a CheckpointError naming the file and, where
// one is involved, the tensor. It never reads outside [bytes, bytes + size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace hyserve {

// One tensor of a safetensors file. data points into the file's bytes (the mmap).
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // empty for a 0-d tensor
  const uint8_t* data = nullptr;  // [num_bytes]
  int64_t num_bytes = 0;
  std::string file;  // the file it came from, for error messages

  // Product of shape (1 for a 0-d tensor).
  int64_t num_elements() const;
};

// A read-only memory-mapped safetensors file. Movable; the mapping lives as long as the
// object, so TensorInfo::data stays valid until then (moving does not move the mapping).
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  // Parses and validates a whole file held in memory. Every returned tensor satisfies
  // bytes <= data, data + num_bytes <= bytes + size, num_bytes == num_elements * dtype size.
  static std::vector<TensorInfo> parse(const uint8_t* bytes, size_t size,
                                       const std::string& file_name);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // The "__metadata__" object ({} when the file has none).
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void unmap();

  std::filesystem::path path_;
  void* map_ = nullptr;  // [map_size_] bytes, PROT_READ
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  nlohmann::json metadata_ = nlohmann::json::object();
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // [num_elements * dtype_size(dtype)]
};

// Writes tensors in the given order, the header padded with spaces to a multiple of 8
// bytes (as the reference implementation does). Throws InvalidArgument for a tensor whose
// bytes do not match its shape, and CheckpointError when the file cannot be written.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace hyserve
