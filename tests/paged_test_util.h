// Helpers for the paged-cache tests (CPU and GPU): a host pool laid out like the packed
// block cache, with one sequence's rows written into shuffled blocks by hand (no
// PagedRows, no scatter_rows), and a bitwise comparator that names the worst element.
//
//   pool row b:  | other pages (page_offset B) | this page (page_bytes B) | other pages |
//   row s of the sequence:  block_table[s / bs] * block_stride_bytes + page_offset
//                           + at + (s % bs) * row_bytes       (at: a part of the page)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/paged.h"

namespace hyserve::test {

// Fill byte of a fresh pool: 0xff bytes read as float are NaN, so a row read from the
// wrong place poisons the result instead of passing by luck.
inline constexpr uint8_t kPoolFill = 0xff;

struct PagedPool {
  int64_t block_size = 0;
  int64_t page_offset = 0;         // bytes of other layers' pages before ours in a row
  int64_t block_stride_bytes = 0;  // pool row, 256-byte multiple
  int64_t num_blocks = 0;
  std::vector<int32_t> block_table;  // [ceil(num_rows / bs)] distinct, shuffled block ids
  std::vector<uint8_t> bytes;        // [num_blocks, block_stride_bytes]

  // Room for num_rows rows of a page of page_bytes per block, 3 spare blocks, ids shuffled.
  PagedPool(int64_t num_rows, int64_t bs, int64_t page_bytes, uint32_t seed)
      : block_size(bs), page_offset(256) {
    block_stride_bytes = (page_offset + page_bytes + 256 + 255) / 256 * 256;
    const int64_t used = std::max<int64_t>(1, (num_rows + bs - 1) / bs);
    num_blocks = used + 3;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(ids.begin(), ids.begin() + used);
    bytes.assign(static_cast<size_t>(num_blocks * block_stride_bytes), kPoolFill);
  }

  int64_t address(int64_t s, int64_t row_bytes, int64_t at) const {
    return block_table[s / block_size] * block_stride_bytes + page_offset + at +
           (s % block_size) * row_bytes;
  }
  // Writes rows [n, row_bytes] at their slots of the page part starting at `at`.
  void write(const void* rows, int64_t n, int64_t row_bytes, int64_t at = 0) {
    for (int64_t s = 0; s < n; ++s) {
      std::memcpy(&bytes[address(s, row_bytes, at)],
                  static_cast<const uint8_t*>(rows) + s * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  }
  // The page of block 0 in a pool copy at `base` (what kernels take as their base).
  template <typename T>
  const T* page(const uint8_t* base, int64_t at = 0) const {
    return reinterpret_cast<const T*>(base + page_offset + at);
  }
  PagedRows pages(const int32_t* table) const { return {table, block_size, block_stride_bytes}; }
};

inline std::vector<float> random_normal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Bitwise equality of two float arrays; on failure names the element with the largest
// difference (NaN against a number counts as the largest) and how many differ.
inline testing::AssertionResult same_bits(const std::vector<float>& got,
                                          const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t num_diff = 0, worst_at = 0;
  double worst = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
    ++num_diff;
    const double d = std::isnan(got[i]) || std::isnan(want[i])
                         ? INFINITY
                         : std::fabs(static_cast<double>(got[i]) - want[i]);
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  if (num_diff == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << num_diff << " of " << got.size() << " elements differ; worst element " << worst_at
         << ": got " << got[worst_at] << ", want " << want[worst_at];
}

// Bytewise equality; on failure names the first differing byte and how many differ.
inline testing::AssertionResult same_bytes(const std::vector<uint8_t>& got,
                                           const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t num_diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && num_diff++ == 0) first = i;
  }
  if (num_diff == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << num_diff << " of " << got.size() << " bytes differ; first at byte " << first << ": got "
         << int{got[first]} << ", want " << int{want[first]};
}

}  // namespace hyserve::test
