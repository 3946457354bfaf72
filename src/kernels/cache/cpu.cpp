#include "kernels/cache/cpu.h"

#include <cstring>

#include "kernels/cache/check.h"

namespace hyserve::cpu {

void scatter_rows(const ScatterRowsParams& p) {
  check_scatter_rows(p);
  const auto* src = static_cast<const char*>(p.src);
  auto* dst = static_cast<char*>(p.dst);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const int64_t slot = p.slots[i];
    if (slot < 0) continue;
    std::memcpy(
        dst + (slot / p.block_size) * p.block_stride_bytes + (slot % p.block_size) * p.row_bytes,
        src + i * p.row_bytes, static_cast<size_t>(p.row_bytes));
  }
}

void gather_rows(const GatherRowsParams& p) {
  check_gather_rows(p);
  const auto* src = static_cast<const char*>(p.src);
  auto* dst = static_cast<char*>(p.dst);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    std::memcpy(dst + i * p.dst_stride_bytes, src + p.src_pages.byte_offset(i, p.row_bytes),
                static_cast<size_t>(p.row_bytes));
  }
}

}  // namespace hyserve::cpu
