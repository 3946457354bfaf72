#include "model/random_weights.h"

#include <cmath>
#include <string>

#include "core/dtype.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from the hash of (seed, i).
float uniform(uint64_t seed, int64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

RandomWeights::RandomWeights(const ModelConfig& config, uint64_t seed)
    : config_(config), seed_(seed) {}

std::vector<float> RandomWeights::load_f32(std::string_view name,
                                           std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t s = next_seed();
  if (ends_with(name, "A_log")) {
    for (int64_t i = 0; i < n; ++i) v[i] = std::log(8.5f + 7.5f * uniform(s, i));  // A in [1, 16]
  } else if (ends_with(name, "dt_bias") || ends_with(name, "bias")) {
    for (int64_t i = 0; i < n; ++i) v[i] = 0.1f * uniform(s, i);
  } else if (ends_with(name, "_res_proj.weight")) {
    // AttnRes query ~ N(0, 1/D)-scaled: candidate scores of order one.
    const float scale = 1.0f / std::sqrt(static_cast<float>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = scale * uniform(s, i);
  } else if (name.find("conv1d") != std::string_view::npos) {
    for (int64_t i = 0; i < n; ++i) v[i] = 0.5f * uniform(s, i);
  } else {  // norm weights
    for (int64_t i = 0; i < n; ++i) v[i] = 1.0f + 0.05f * uniform(s, i);
  }
  bytes_ += n * 4;
  return v;
}

const std::vector<uint8_t>& RandomWeights::random_bytes(int64_t num_bytes, uint64_t seed) const {
  storage_.emplace_back(static_cast<size_t>(num_bytes));
  std::vector<uint8_t>& out = storage_.back();
  parallel_for(
      num_bytes,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = static_cast<uint8_t>(splitmix64(seed + i));
      },
      1 << 20);
  return out;
}

Weight RandomWeights::load_weight(const std::string& prefix, int64_t rows, int64_t cols) const {
  CHECK(rows > 0 && cols > 0, "random weight ", prefix, " needs a positive shape");
  Weight w;
  w.rows = rows;
  w.cols = cols;
  const uint64_t s = next_seed();
  const bool mxfp4 = config_.expert_format == ExpertFormat::kMxfp4 &&
                     prefix.find(".experts.") != std::string::npos && cols % 32 == 0;
  if (mxfp4) {
    // Codes uniform over e2m1 (|v| <= 6, mean |v| ~ 2.3); scale 2^e so |w| ~ cols^-0.5.
    const int64_t code_bytes = rows * cols / 2, scale_bytes = rows * (cols / 32);
    const std::vector<uint8_t>& codes = random_bytes(code_bytes, s);
    storage_.emplace_back(static_cast<size_t>(scale_bytes));
    std::vector<uint8_t>& scales = storage_.back();
    const int e = 127 + static_cast<int>(std::lround(std::log2(1.0 / (2.3 * std::sqrt(cols)))));
    for (int64_t i = 0; i < scale_bytes; ++i)
      scales[i] = static_cast<uint8_t>(e + static_cast<int>(splitmix64(s ^ (i * 31)) % 3) - 1);
    w.format = WeightFormat::kMxfp4;
    w.dtype = DType::kU8;
    w.data = codes.data();
    w.scales = scales.data();
    w.scales_dtype = DType::kE8M0;
    bytes_ += code_bytes + scale_bytes;
    return w;
  }
  if (config_.expert_format == ExpertFormat::kInt4 &&
      prefix.find(".experts.") != std::string::npos && cols % 32 == 0) {
    // Codes uniform over [0, 15] (q = code - 8: rms ~ 4.6); bf16 scales within 25% of
    // 1 / (4.6 sqrt(cols)), so |w| ~ cols^-0.5.
    const int64_t code_bytes = rows * cols / 2, num_scales = rows * (cols / 32);
    const std::vector<uint8_t>& codes = random_bytes(code_bytes, s);
    storage_.emplace_back(static_cast<size_t>(num_scales * 2));
    auto* scales = reinterpret_cast<uint16_t*>(storage_.back().data());
    const float base = 1.0f / (4.6f * std::sqrt(static_cast<float>(cols)));
    for (int64_t i = 0; i < num_scales; ++i)
      scales[i] = f32_to_bf16(base * (1.0f + 0.25f * uniform(s ^ 0x5ca1e, i)));
    w.format = WeightFormat::kInt4;
    w.dtype = DType::kU8;
    w.data = codes.data();
    w.scales = scales;
    w.scales_dtype = DType::kBF16;
    bytes_ += code_bytes + num_scales * 2;
    return w;
  }
  // bf16 ~ uniform with the variance of N(0, 1/cols).
  const int64_t n = rows * cols;
  storage_.emplace_back(static_cast<size_t>(n * 2));
  auto* out = reinterpret_cast<uint16_t*>(storage_.back().data());
  const float amp = std::sqrt(3.0f / static_cast<float>(cols));
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(amp * uniform(s, i));
      },
      1 << 20);
  w.format = WeightFormat::kDense;
  w.dtype = DType::kBF16;
  w.data = out;
  bytes_ += n * 2;
  return w;
}

}  // namespace hyserve
