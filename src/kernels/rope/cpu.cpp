// CPU reference of the RoPE rotations; see cpu.h for the formulas.
#include "kernels/rope/cpu.h"

#include <cmath>
#include <vector>

#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

void check_params(const RopeTable& table, const RopeParams& p) {
  CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 &&
            static_cast<int64_t>(table.inv_freq.size()) == table.rotary_dim / 2,
        "RopeTable is not built (rotary_dim ", table.rotary_dim, ")");
  CHECK(p.num_tokens >= 0, "num_tokens ", p.num_tokens);
  CHECK(p.num_heads > 0, "num_heads ", p.num_heads);
  CHECK(p.offset >= 0 && p.offset + table.rotary_dim <= p.head_stride, "rotated dims [", p.offset,
        ", ", p.offset + table.rotary_dim, ") do not fit a head of ", p.head_stride);
  if (p.num_tokens > 0) CHECK(p.x != nullptr && p.positions != nullptr, "null x or positions");
}

// Rotates pair i of every head by its angle; pair_dims(i, half) names the two dims.
template <typename PairDims>
void apply_rope(const RopeTable& table, const RopeParams& p, PairDims pair_dims) {
  check_params(table, p);
  const int64_t half = table.rotary_dim / 2;
  parallel_for(
      p.num_tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
        for (int64_t t = begin; t < end; ++t) {
          const float pos = static_cast<float>(p.positions[t]);
          for (int64_t i = 0; i < half; ++i) {
            const float angle = pos * table.inv_freq[static_cast<size_t>(i)];
            cos_v[static_cast<size_t>(i)] = std::cos(angle) * table.attention_factor;
            sin_v[static_cast<size_t>(i)] = std::sin(angle) * table.attention_factor;
          }
          for (int64_t h = 0; h < p.num_heads; ++h) {
            float* x = p.x + (t * p.num_heads + h) * p.head_stride + p.offset;
            for (int64_t i = 0; i < half; ++i) {
              const auto [ia, ib] = pair_dims(i, half);
              const float a = x[ia], b = x[ib];
              const float c = cos_v[static_cast<size_t>(i)], s = sin_v[static_cast<size_t>(i)];
              x[ia] = a * c - b * s;
              x[ib] = b * c + a * s;
            }
          }
        }
      },
      16);
}

struct DimPair {
  int64_t a, b;
};

}  // namespace

void apply_rope_interleaved(const RopeTable& table, const RopeParams& p) {
  apply_rope(table, p, [](int64_t i, int64_t) { return DimPair{2 * i, 2 * i + 1}; });
}

void apply_rope_neox(const RopeTable& table, const RopeParams& p) {
  apply_rope(table, p, [](int64_t i, int64_t half) { return DimPair{i, i + half}; });
}

}  // namespace hyserve::cpu
