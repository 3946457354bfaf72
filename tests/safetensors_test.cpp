// Safetensors reader and writer: round trips of every dtype, one test per kind of bad file
// (each checks the error names the file and the tensor), and a mutation property test of
// the parser: it must throw CheckpointError or return tensors inside the buffer.
#include "model/safetensors.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE8M0,
                                DType::kU8,  DType::kI8,  DType::kI32,  DType::kI64,  DType::kBool};

// A fresh, empty folder for the running test.
fs::path fresh_dir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir =
      fs::path(testing::TempDir()) / ("hyserve_safetensors_" + std::string(info->name()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorToWrite make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          std::mt19937_64& rng) {
  const auto num_bytes = static_cast<size_t>(product(shape) * dtype_size(dtype));
  return {name, dtype, std::move(shape), random_bytes(num_bytes, rng)};
}

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> length_prefix(uint64_t n) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  return bytes;
}

uint64_t read_length_prefix(const std::vector<uint8_t>& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{bytes[i]} << (8 * i);
  return n;
}

// Length prefix, header, data.
std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes(8 + header.size() + data.size());
  const auto prefix = length_prefix(header.size());
  std::copy(prefix.begin(), prefix.end(), bytes.begin());
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  std::copy(data.begin(), data.end(),
            bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return bytes;
}

// A file with this header text and num_data_bytes of data after it.
fs::path write_raw(const fs::path& dir, const std::string& header, size_t num_data_bytes) {
  const fs::path path = dir / "raw.safetensors";
  write_all(path, assemble(header, std::vector<uint8_t>(num_data_bytes, 0x5a)));
  return path;
}

// Runs fn, expecting a CheckpointError whose message contains every one of parts.
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

void expect_open_error(const fs::path& path, std::vector<std::string> parts) {
  parts.push_back(path.string());
  expect_checkpoint_error([&] { SafetensorsFile::open(path); }, parts);
}

TEST(Safetensors, RoundTripsEveryDTypeAndShape) {
  const fs::path dir = fresh_dir();
  std::mt19937_64 rng(1);
  const std::vector<std::vector<int64_t>> shapes = {{},     {0},       {1},        {3}, {3, 0, 2},
                                                    {3, 5}, {2, 3, 4}, {1, 1, 63}, {65}};
  std::vector<TensorToWrite> written;
  for (DType dtype : kAllDTypes) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      written.push_back(make_tensor(std::string(dtype_name(dtype)) + ".t" + std::to_string(s),
                                    dtype, shapes[s], rng));
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "a \"b\" c"}};
  const fs::path path = dir / "all.safetensors";
  write_safetensors(path, written, metadata);

  const std::vector<uint8_t> bytes = read_all(path);
  const uint64_t header_bytes = read_length_prefix(bytes);
  EXPECT_EQ(header_bytes % 8, 0u) << "header is padded to a multiple of 8";

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.tensors().size(), written.size());
  for (const auto& w : written) {
    const TensorInfo* t = file.find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    EXPECT_EQ(t->num_elements(), product(w.shape)) << w.name;
    EXPECT_EQ(t->num_bytes, static_cast<int64_t>(w.bytes.size())) << w.name;
    EXPECT_EQ(t->file, path.string());
    if (!w.bytes.empty()) {
      EXPECT_EQ(std::memcmp(t->data, w.bytes.data(), w.bytes.size()), 0) << w.name;
    }
  }
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.metadata(), nlohmann::json(metadata));

  // The in-memory parser agrees with the mapped file.
  const auto parsed = SafetensorsFile::parse(bytes.data(), bytes.size(), "mem");
  ASSERT_EQ(parsed.size(), written.size());
  for (const auto& t : parsed) {
    const TensorInfo* mapped = file.find(t.name);
    ASSERT_NE(mapped, nullptr) << t.name;
    EXPECT_EQ(t.shape, mapped->shape) << t.name;
    ASSERT_EQ(t.num_bytes, mapped->num_bytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, mapped->data, static_cast<size_t>(t.num_bytes)), 0) << t.name;
    EXPECT_EQ(t.file, "mem");
  }
}

TEST(Safetensors, EmptyFileAndNoMetadata) {
  const fs::path dir = fresh_dir();
  write_safetensors(dir / "empty.safetensors", {});
  const SafetensorsFile file = SafetensorsFile::open(dir / "empty.safetensors");
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().is_object());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(Safetensors, MoveKeepsTheMappingAlive) {
  const fs::path dir = fresh_dir();
  std::mt19937_64 rng(2);
  const TensorToWrite w = make_tensor("x", DType::kF32, {4, 4}, rng);
  write_safetensors(dir / "m.safetensors", {w});
  SafetensorsFile a = SafetensorsFile::open(dir / "m.safetensors");
  const uint8_t* data = a.find("x")->data;
  SafetensorsFile b = std::move(a);
  ASSERT_NE(b.find("x"), nullptr);
  EXPECT_EQ(b.find("x")->data, data);
  EXPECT_EQ(std::memcmp(data, w.bytes.data(), w.bytes.size()), 0);
  SafetensorsFile c = SafetensorsFile::open(dir / "m.safetensors");
  c = std::move(b);
  EXPECT_EQ(std::memcmp(c.find("x")->data, w.bytes.data(), w.bytes.size()), 0);
}

TEST(Safetensors, WriterRefusesBytesThatDoNotMatchTheShape) {
  const fs::path dir = fresh_dir();
  EXPECT_THROW(write_safetensors(dir / "w.safetensors",
                                 {{"x", DType::kBF16, {2, 3}, std::vector<uint8_t>(11)}}),
               InvalidArgument);
  EXPECT_THROW(write_safetensors(dir / "w.safetensors",
                                 {{"x", DType::kU8, {1}, {1}}, {"x", DType::kU8, {1}, {2}}}),
               InvalidArgument);
}

TEST(Safetensors, MissingFileAndFolder) {
  const fs::path dir = fresh_dir();
  expect_open_error(dir / "absent.safetensors", {"cannot open"});
  expect_open_error(dir, {"not a regular file"});
}

TEST(Safetensors, FileShorterThanTheLengthPrefix) {
  const fs::path dir = fresh_dir();
  write_all(dir / "short.safetensors", {1, 2, 3});
  expect_open_error(dir / "short.safetensors", {"shorter than the 8-byte"});
  write_all(dir / "zero.safetensors", {});
  expect_open_error(dir / "zero.safetensors", {"shorter than the 8-byte"});
}

// A valid two-tensor file: "first" F32 [2, 2] then "second" BF16 [3].
fs::path write_two_tensors(const fs::path& dir) {
  std::mt19937_64 rng(3);
  const fs::path path = dir / "two.safetensors";
  write_safetensors(path, {make_tensor("first", DType::kF32, {2, 2}, rng),
                           make_tensor("second", DType::kBF16, {3}, rng)});
  return path;
}

TEST(Safetensors, TruncatedInHeader) {
  const fs::path dir = fresh_dir();
  const fs::path path = write_two_tensors(dir);
  std::vector<uint8_t> bytes = read_all(path);
  bytes.resize(8 + read_length_prefix(bytes) / 2);
  write_all(path, bytes);
  expect_open_error(path, {"header length", "truncated"});
}

TEST(Safetensors, TruncatedInData) {
  const fs::path dir = fresh_dir();
  const fs::path path = write_two_tensors(dir);
  std::vector<uint8_t> bytes = read_all(path);
  bytes.pop_back();
  write_all(path, bytes);
  expect_open_error(path, {"second", "outside the data buffer"});
}

TEST(Safetensors, CorruptHeaderJson) {
  const fs::path dir = fresh_dir();
  const fs::path path = write_raw(dir, R"({"a": {"dtype": "F32", "shape": [1], )", 4);
  expect_open_error(path, {"not valid JSON"});
}

TEST(Safetensors, HeaderNotAnObject) {
  const fs::path dir = fresh_dir();
  expect_open_error(write_raw(dir, "[1, 2]  ", 0), {"not a JSON object"});
}

TEST(Safetensors, HeaderNestedTooDeep) {
  const fs::path dir = fresh_dir();
  expect_open_error(write_raw(dir, R"({"a": )" + std::string(100000, '['), 0), {"nests deeper"});
}

TEST(Safetensors, HeaderLengthLargerThanTheFile) {
  const fs::path dir = fresh_dir();
  const fs::path path = write_two_tensors(dir);
  std::vector<uint8_t> bytes = read_all(path);
  for (uint64_t n : {uint64_t{bytes.size()}, uint64_t{1} << 63, ~uint64_t{0}}) {
    const auto prefix = length_prefix(n);
    std::copy(prefix.begin(), prefix.end(), bytes.begin());
    write_all(path, bytes);
    expect_open_error(path, {"header length", std::to_string(n)});
  }
}

TEST(Safetensors, DataOffsetsPastTheEnd) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir, R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", 6);
  expect_open_error(path, {"tensor w", "outside the data buffer"});
}

TEST(Safetensors, DataOffsetsReversed) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir, R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})", 6);
  expect_open_error(path, {"tensor w", "outside the data buffer"});
}

TEST(Safetensors, OffsetsInconsistentWithShapeAndDType) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir, R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 6]}})", 16);
  expect_open_error(path, {"tensor w", "needs 12"});
}

TEST(Safetensors, OverlappingTensors) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir,
                R"({"aa": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                R"( "bb": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                8);
  expect_open_error(path, {"aa", "bb", "overlap"});
}

TEST(Safetensors, ZeroSizeTensorsMayShareOffsets) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir,
                R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},)"
                R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                R"( "c": {"dtype": "I64", "shape": [3, 0], "data_offsets": [4, 4]}})",
                4);
  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.find("c")->num_bytes, 0);
  EXPECT_EQ(file.find("b")->num_bytes, 4);
}

TEST(Safetensors, UnknownDType) {
  const fs::path dir = fresh_dir();
  const fs::path path =
      write_raw(dir, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  expect_open_error(path, {"tensor w", "unknown dtype", "F64"});
}

TEST(Safetensors, BadShapes) {
  const fs::path dir = fresh_dir();
  for (const std::string shape :
       {"[-1]", "[1.5]", R"(["2"])", "[18446744073709551615]", "[1e3]", "3", "[null]"}) {
    const fs::path path = write_raw(
        dir, R"({"w": {"dtype": "U8", "shape": )" + shape + R"(, "data_offsets": [0, 0]}})", 0);
    expect_open_error(path, {"tensor w", "shape"});
  }
}

TEST(Safetensors, ShapeWhoseSizeOverflows) {
  const fs::path dir = fresh_dir();
  const fs::path path = write_raw(
      dir, R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
      0);
  expect_open_error(path, {"tensor w", "too many elements"});
  const fs::path bytes_path = write_raw(
      dir, R"({"w": {"dtype": "I64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0);
  expect_open_error(bytes_path, {"tensor w", "too many bytes"});
}

TEST(Safetensors, BadDataOffsets) {
  const fs::path dir = fresh_dir();
  for (const std::string offsets : {"[0]", "[0, 1, 2]", "[-1, 0]", "[0, 1.0]", "null"}) {
    const fs::path path = write_raw(
        dir, R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": )" + offsets + "}}", 1);
    expect_open_error(path, {"tensor w", "data_offsets"});
  }
}

TEST(Safetensors, NonObjectEntriesAndBadMetadata) {
  const fs::path dir = fresh_dir();
  expect_open_error(write_raw(dir, R"({"w": 3})", 0), {"\"w\"", "not a tensor object"});
  expect_open_error(write_raw(dir, R"({"__metadata__": {"k": 1}})", 0), {"__metadata__", "\"k\""});
  expect_open_error(write_raw(dir, R"({"__metadata__": []})", 0), {"__metadata__"});
  expect_open_error(write_raw(dir, R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1),
                    {"tensor w", "dtype"});
}

// ---- Property test: random mutations of valid files ----

std::vector<std::vector<uint8_t>> valid_files(const fs::path& dir) {
  std::mt19937_64 rng(4);
  std::vector<std::vector<TensorToWrite>> contents;
  contents.push_back({make_tensor("w", DType::kF32, {2, 3}, rng)});
  contents.push_back({});
  std::vector<TensorToWrite> mixed;
  int i = 0;
  for (DType dtype : kAllDTypes) {
    mixed.push_back(make_tensor("m" + std::to_string(i++), dtype, {}, rng));
    mixed.push_back(make_tensor("m" + std::to_string(i++), dtype, {3, 0}, rng));
    mixed.push_back(make_tensor("m" + std::to_string(i++), dtype, {2, 5}, rng));
  }
  contents.push_back(mixed);
  std::vector<TensorToWrite> many;
  for (int t = 0; t < 24; ++t) {
    many.push_back(make_tensor("model.layers." + std::to_string(t) + ".weight", DType::kBF16,
                               {static_cast<int64_t>(t % 5), 3}, rng));
  }
  contents.push_back(many);

  std::vector<std::vector<uint8_t>> files;
  for (size_t f = 0; f < contents.size(); ++f) {
    const fs::path path = dir / ("seed" + std::to_string(f) + ".safetensors");
    write_safetensors(path, contents[f],
                      f == 2 ? std::map<std::string, std::string>{{"k", "v"}}
                             : std::map<std::string, std::string>{});
    files.push_back(read_all(path));
  }
  return files;
}

// Numbers a parser must survive in any numeric position.
const std::vector<std::string> kAwkwardNumbers = {"0",
                                                  "1",
                                                  "2",
                                                  "3",
                                                  "7",
                                                  "8",
                                                  "-1",
                                                  "-8",
                                                  "1.5",
                                                  "2.0",
                                                  "1e3",
                                                  "1e308",
                                                  "-0",
                                                  "4294967296",
                                                  "4611686018427387904",
                                                  "9223372036854775807",
                                                  "9223372036854775808",
                                                  "-9223372036854775808",
                                                  "18446744073709551615",
                                                  "18446744073709551616",
                                                  "99999999999999999999999999",
                                                  "\"2\"",
                                                  "null",
                                                  "true",
                                                  "[]",
                                                  "{}"};

// A random header, often (but not always) consistent, with random data size.
std::vector<uint8_t> random_file(std::mt19937_64& rng) {
  static const std::vector<std::string> dtypes = {"F32", "F16", "BF16", "F8_E4M3", "F8_E8M0",
                                                  "U8",  "I8",  "I32",  "I64",     "BOOL",
                                                  "F64", "",    "bf16", "F8_E5M2"};
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  const auto number = [&]() {
    return rng() % 2 ? std::to_string(rng() % 64) : pick(kAwkwardNumbers);
  };
  const size_t data_size = rng() % 200;
  std::string header = "{";
  const size_t num_entries = rng() % 5;
  uint64_t offset = 0;
  for (size_t e = 0; e < num_entries; ++e) {
    if (e) header += ", ";
    header +=
        "\"" + (rng() % 8 == 0 ? std::string("__metadata__") : "t" + std::to_string(e)) + "\": ";
    if (rng() % 10 == 0) {
      header += number();
      continue;
    }
    if (rng() % 2) {
      // Consistent entry: a known dtype, a small shape, offsets that follow the last one.
      const int dtype_index = static_cast<int>(rng() % 10);
      const DType dtype = kAllDTypes[dtype_index];
      std::string shape = "[";
      int64_t n = 1;
      const size_t rank = rng() % 4;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t dim = static_cast<int64_t>(rng() % 5);
        n *= dim;
        shape += (d ? ", " : "") + std::to_string(dim);
      }
      shape += "]";
      const uint64_t end = offset + static_cast<uint64_t>(n * dtype_size(dtype));
      header += "{\"dtype\": \"" + std::string(dtype_name(dtype)) + "\", \"shape\": " + shape +
                ", \"data_offsets\": [" + std::to_string(offset) + ", " + std::to_string(end) +
                "]}";
      offset = end;
      continue;
    }
    std::string entry = "{";
    if (rng() % 8) entry += "\"dtype\": " + (rng() % 8 ? "\"" + pick(dtypes) + "\"" : number());
    if (rng() % 8) {
      entry += std::string(entry.size() > 1 ? ", " : "") + "\"shape\": [";
      const size_t rank = rng() % 5;
      for (size_t d = 0; d < rank; ++d) entry += (d ? ", " : "") + number();
      entry += "]";
    }
    if (rng() % 8) {
      entry += std::string(entry.size() > 1 ? ", " : "") + "\"data_offsets\": [";
      const size_t count = rng() % 8 ? 2 : rng() % 4;
      for (size_t d = 0; d < count; ++d) entry += (d ? ", " : "") + number();
      entry += "]";
    }
    header += entry + "}";
  }
  header += "}";
  return assemble(header, random_bytes(std::max<size_t>(data_size, offset), rng));
}

std::vector<uint8_t> mutate(const std::vector<uint8_t>& original, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes = original;
  const size_t header_end =
      static_cast<size_t>(std::min<uint64_t>(8 + read_length_prefix(bytes), bytes.size()));
  switch (rng() % 6) {
    case 0: {  // flip bytes and bits in the length prefix and header
      const size_t num_flips = 1 + rng() % 4;
      for (size_t f = 0; f < num_flips; ++f) {
        const size_t at = rng() % header_end;
        bytes[at] = rng() % 2 ? static_cast<uint8_t>(rng()) : bytes[at] ^ (1u << (rng() % 8));
      }
      break;
    }
    case 1: {  // a new length prefix
      const uint64_t n = read_length_prefix(bytes);
      const uint64_t choices[] = {0,
                                  1,
                                  n - 1,
                                  n + 1,
                                  n + 8,
                                  bytes.size() - 8,
                                  bytes.size() - 7,
                                  bytes.size(),
                                  1ull << 32,
                                  1ull << 63,
                                  ~0ull,
                                  rng()};
      const auto prefix = length_prefix(choices[rng() % std::size(choices)]);
      std::copy(prefix.begin(), prefix.end(), bytes.begin());
      break;
    }
    case 2:  // truncation
      bytes.resize(rng() % bytes.size());
      break;
    case 3:
      bytes = random_file(rng);
      break;
    case 4: {  // an awkward number in place of a number in the header
      std::vector<size_t> digit_runs;
      for (size_t i = 8; i < header_end; ++i) {
        if (std::isdigit(bytes[i]) && !std::isdigit(bytes[i - 1])) digit_runs.push_back(i);
      }
      if (digit_runs.empty()) break;
      const size_t begin = digit_runs[rng() % digit_runs.size()];
      size_t end = begin;
      while (end < header_end && std::isdigit(bytes[end])) ++end;
      const std::string replacement = kAwkwardNumbers[rng() % kAwkwardNumbers.size()];
      bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(begin),
                  bytes.begin() + static_cast<std::ptrdiff_t>(end));
      bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(begin), replacement.begin(),
                   replacement.end());
      const int64_t growth =
          static_cast<int64_t>(replacement.size()) - static_cast<int64_t>(end - begin);
      const auto prefix = length_prefix(read_length_prefix(bytes) + static_cast<uint64_t>(growth));
      std::copy(prefix.begin(), prefix.end(), bytes.begin());
      break;
    }
    case 5: {  // insert or delete header bytes, keeping the length prefix in half the cases
      if (header_end <= 8) break;
      const size_t at = 8 + rng() % (header_end - 8);
      int64_t growth = 0;
      if (rng() % 2) {
        const size_t count = 1 + rng() % 4;
        const std::vector<uint8_t> inserted = random_bytes(count, rng);
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), inserted.begin(),
                     inserted.end());
        growth = static_cast<int64_t>(count);
      } else {
        const size_t count = std::min<size_t>(1 + rng() % 4, header_end - at);
        bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                    bytes.begin() + static_cast<std::ptrdiff_t>(at + count));
        growth = -static_cast<int64_t>(count);
      }
      if (rng() % 2) {
        const auto prefix =
            length_prefix(read_length_prefix(bytes) + static_cast<uint64_t>(growth));
        std::copy(prefix.begin(), prefix.end(), bytes.begin());
      }
      break;
    }
  }
  return bytes;
}

// The contract of parse() for an accepted buffer.
void check_accepted(const std::vector<TensorInfo>& tensors, const std::vector<uint8_t>& bytes,
                    int iteration) {
  const auto base = reinterpret_cast<uintptr_t>(bytes.data());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const auto begin = reinterpret_cast<uintptr_t>(t.data);
    ASSERT_GE(t.num_bytes, 0) << "iteration " << iteration << " tensor " << t.name;
    ASSERT_TRUE(begin >= base && begin - base <= bytes.size() &&
                static_cast<uint64_t>(t.num_bytes) <= bytes.size() - (begin - base))
        << "iteration " << iteration << " tensor " << t.name << " lies outside the buffer";
    __int128 n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      ASSERT_GE(d, 0) << "iteration " << iteration << " tensor " << t.name;
      n *= d;
      if (n > (__int128{1} << 64)) n = __int128{1} << 64;
    }
    ASSERT_EQ(n, static_cast<__int128>(t.num_bytes))
        << "iteration " << iteration << " tensor " << t.name << " size mismatch";
    for (size_t j = 0; j < i; ++j) {
      const TensorInfo& u = tensors[j];
      const bool disjoint = t.data + t.num_bytes <= u.data || u.data + u.num_bytes <= t.data ||
                            t.num_bytes == 0 || u.num_bytes == 0;
      ASSERT_TRUE(disjoint) << "iteration " << iteration << ": " << t.name << " overlaps "
                            << u.name;
    }
  }
}

TEST(SafetensorsProperty, ParserSurvivesRandomMutations) {
  const fs::path dir = fresh_dir();
  const auto seeds = valid_files(dir);
  for (const auto& seed : seeds) {
    ASSERT_NO_THROW(SafetensorsFile::parse(seed.data(), seed.size(), "seed"));
  }
  std::mt19937_64 rng(20240611);
  constexpr int kIterations = 30000;
  int num_accepted = 0;
  int num_rejected = 0;
  for (int it = 0; it < kIterations; ++it) {
    const std::vector<uint8_t> bytes = mutate(seeds[rng() % seeds.size()], rng);
    try {
      const auto tensors = SafetensorsFile::parse(bytes.data(), bytes.size(), "fuzz.safetensors");
      check_accepted(tensors, bytes, it);
      if (testing::Test::HasFatalFailure()) return;
      ++num_accepted;
    } catch (const CheckpointError& e) {
      ASSERT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos)
          << "iteration " << it << ": " << e.what();
      ++num_rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": unexpected exception: " << e.what();
    }
  }
  RecordProperty("accepted", num_accepted);
  RecordProperty("rejected", num_rejected);
  // Both outcomes must be exercised, or the mutations test nothing.
  EXPECT_GT(num_accepted, kIterations / 20);
  EXPECT_GT(num_rejected, kIterations / 2);
}

}  // namespace
}  // namespace hyserve
