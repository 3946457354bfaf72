#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::json;

constexpr size_t kLengthBytes = 8;
// The reference implementation's limit on the JSON header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 deep (object -> tensor -> shape); anything far deeper is garbage,
// and refusing it keeps recursive walks of the parsed value (dump, destruction) shallow.
constexpr int kMaxHeaderDepth = 8;
constexpr size_t kMaxQuotedChars = 64;
constexpr const char* kMetadataKey = "__metadata__";

struct ParsedFile {
  std::vector<TensorInfo> tensors;
  json metadata = json::object();
};

#define FAIL_IN_FILE(file, ...) HYSERVE_THROW(CheckpointError, file, ": ", __VA_ARGS__)

// A JSON value for an error message, cut short when long.
std::string quote(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMaxQuotedChars) s = s.substr(0, kMaxQuotedChars) + "...";
  return s;
}

std::optional<int64_t> as_non_negative_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_min_size(size_t size, const std::string& file) {
  if (size < kLengthBytes) {
    FAIL_IN_FILE(file, "file is ", size, " bytes, shorter than the 8-byte header length");
  }
}

json parse_header_json(const uint8_t* begin, const uint8_t* end, const std::string& file) {
  const auto limit_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth > kMaxHeaderDepth) {
      FAIL_IN_FILE(file, "header JSON nests deeper than ", kMaxHeaderDepth, " levels");
    }
    return true;
  };
  try {
    return json::parse(begin, end, limit_depth);
  } catch (const json::exception& e) {
    FAIL_IN_FILE(file, "header is not valid JSON: ", e.what());
  }
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, const uint8_t* data,
                              int64_t data_size, const std::string& file) {
  if (!entry.is_object()) {
    FAIL_IN_FILE(file, "header entry \"", name, "\" is not a tensor object: ", quote(entry));
  }
  TensorInfo t;
  t.name = name;
  t.file = file;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    FAIL_IN_FILE(file, "tensor ", name, ": dtype missing or not a string");
  }
  const auto& dtype_str = dtype_it->get_ref<const std::string&>();
  const auto dtype = parse_dtype(dtype_str);
  if (!dtype) FAIL_IN_FILE(file, "tensor ", name, ": unknown dtype ", quote(*dtype_it));
  t.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    FAIL_IN_FILE(file, "tensor ", name, ": shape missing or not an array");
  }
  int64_t num_elements = 1;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const auto dim = as_non_negative_int((*shape_it)[i]);
    if (!dim) {
      FAIL_IN_FILE(file, "tensor ", name, ": shape[", i,
                   "] is not a non-negative 64-bit integer: ", quote((*shape_it)[i]));
    }
    t.shape.push_back(*dim);
  }
  // Overflow is only an error when no dimension is zero.
  const bool has_zero_dim = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
  if (has_zero_dim) {
    num_elements = 0;
  } else {
    for (int64_t dim : t.shape) {
      if (__builtin_mul_overflow(num_elements, dim, &num_elements)) {
        FAIL_IN_FILE(file, "tensor ", name, ": shape ", shape_string(t.shape),
                     " has too many elements");
      }
    }
  }
  int64_t num_bytes = 0;
  if (__builtin_mul_overflow(num_elements, int64_t{dtype_size(t.dtype)}, &num_bytes)) {
    FAIL_IN_FILE(file, "tensor ", name, ": shape ", shape_string(t.shape), " has too many bytes");
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    FAIL_IN_FILE(file, "tensor ", name, ": data_offsets missing or not [begin, end]");
  }
  const auto begin = as_non_negative_int((*offsets_it)[0]);
  const auto end = as_non_negative_int((*offsets_it)[1]);
  if (!begin || !end) {
    FAIL_IN_FILE(file, "tensor ", name,
                 ": data_offsets are not non-negative 64-bit integers: ", quote(*offsets_it));
  }
  if (*begin > *end || *end > data_size) {
    FAIL_IN_FILE(file, "tensor ", name, ": data_offsets [", *begin, ", ", *end,
                 "] lie outside the data buffer of ", data_size, " bytes");
  }
  if (*end - *begin != num_bytes) {
    FAIL_IN_FILE(file, "tensor ", name, ": data_offsets [", *begin, ", ", *end, "] hold ",
                 *end - *begin, " bytes but ", dtype_str, " ", shape_string(t.shape), " needs ",
                 num_bytes);
  }
  t.data = data + *begin;
  t.num_bytes = num_bytes;
  return t;
}

void check_no_overlap(const std::vector<TensorInfo>& tensors, const std::string& file) {
  std::vector<const TensorInfo*> by_start;
  for (const auto& t : tensors) by_start.push_back(&t);
  std::sort(by_start.begin(), by_start.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->data, a->num_bytes) < std::pair(b->data, b->num_bytes);
  });
  const TensorInfo* furthest = nullptr;  // the tensor reaching furthest so far
  for (const TensorInfo* t : by_start) {
    if (furthest && t->data < furthest->data + furthest->num_bytes) {
      FAIL_IN_FILE(file, "tensors ", furthest->name, " and ", t->name, " overlap");
    }
    if (!furthest || t->data + t->num_bytes >= furthest->data + furthest->num_bytes) furthest = t;
  }
}

ParsedFile parse_file(const uint8_t* bytes, size_t size, const std::string& file) {
  check_min_size(size, file);
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) header_bytes |= uint64_t{bytes[i]} << (8 * i);
  if (header_bytes > size - kLengthBytes) {
    FAIL_IN_FILE(file, "header length ", header_bytes, " exceeds the ", size - kLengthBytes,
                 " bytes after the length prefix (truncated file?)");
  }
  if (header_bytes > kMaxHeaderBytes) {
    FAIL_IN_FILE(file, "header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes);
  }
  const uint8_t* header_begin = bytes + kLengthBytes;
  const uint8_t* data = header_begin + header_bytes;
  const auto data_size = static_cast<int64_t>(size - kLengthBytes - header_bytes);

  const json header = parse_header_json(header_begin, data, file);
  if (!header.is_object()) FAIL_IN_FILE(file, "header is not a JSON object");

  ParsedFile parsed;
  try {
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) FAIL_IN_FILE(file, kMetadataKey, " is not an object");
        for (const auto& [meta_key, meta_value] : value.items()) {
          if (!meta_value.is_string()) {
            FAIL_IN_FILE(file, kMetadataKey, " value \"", meta_key, "\" is not a string");
          }
        }
        parsed.metadata = value;
        continue;
      }
      parsed.tensors.push_back(parse_tensor_entry(key, value, data, data_size, file));
    }
  } catch (const json::exception& e) {
    FAIL_IN_FILE(file, "bad header: ", e.what());
  }
  check_no_overlap(parsed.tensors, file);
  return parsed;
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

std::vector<TensorInfo> SafetensorsFile::parse(const uint8_t* bytes, size_t size,
                                               const std::string& file_name) {
  return parse_file(bytes, size, file_name).tensors;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) FAIL_IN_FILE(file, "cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    FAIL_IN_FILE(file, "not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < kLengthBytes) {
    ::close(fd);
    check_min_size(size, file);  // throws; mmap refuses an empty file
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) FAIL_IN_FILE(file, "mmap failed: ", std::strerror(map_errno));

  SafetensorsFile result;
  result.path_ = path;
  result.map_ = map;
  result.map_size_ = size;
  ParsedFile parsed = parse_file(static_cast<const uint8_t*>(map), size, file);
  result.tensors_ = std::move(parsed.tensors);
  result.metadata_ = std::move(parsed.metadata);
  for (size_t i = 0; i < result.tensors_.size(); ++i) result.index_[result.tensors_[i].name] = i;
  return result;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  unmap();
}

void SafetensorsFile::unmap() {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string_view> names;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    CHECK(t.name != kMetadataKey && names.insert(t.name).second,
          "write_safetensors: duplicate or reserved tensor name ", t.name);
    int64_t num_elements = 1;
    for (int64_t dim : t.shape) {
      CHECK(dim >= 0, "write_safetensors: tensor ", t.name, " has a negative dimension");
      num_elements *= dim;
    }
    const int64_t num_bytes = num_elements * dtype_size(t.dtype);
    CHECK(static_cast<int64_t>(t.bytes.size()) == num_bytes, "write_safetensors: tensor ", t.name,
          " has ", t.bytes.size(), " bytes, its shape ", shape_string(t.shape), " needs ",
          num_bytes);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + num_bytes}}};
    offset += num_bytes;
  }
  std::string header_text = header.dump();
  header_text.append((kLengthBytes - header_text.size() % kLengthBytes) % kLengthBytes, ' ');

  char length_prefix[kLengthBytes];
  for (size_t i = 0; i < kLengthBytes; ++i) {
    length_prefix[i] = static_cast<char>((uint64_t{header_text.size()} >> (8 * i)) & 0xff);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(length_prefix, kLengthBytes);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) FAIL_IN_FILE(path.string(), "cannot write");
}

}  // namespace hyserve
