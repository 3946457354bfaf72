// PagedRows: where row s of one sequence's per-token cache (a latent, an index key, a
// scale) lives when the cache is paged in the packed block pool (DESIGN.md), or in a
// plain contiguous array. Kernels take a page base pointer plus this struct and never
// learn about blocks, rows of the pool or requests:
//
//   paged:       base + block_table[s / block_size] * block_stride_bytes
//                     + (s % block_size) * row_bytes
//   contiguous:  base + s * row_bytes                       (block_table == nullptr)
//
// base points at the page of block 0 (pool base + the layer's page offset);
// block_stride_bytes is the pool's row size. The block table lives in the kernel's
// memory (device memory for CUDA kernels). Header-only, host and device.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hyserve {

// The cache slot of row s of a paged sequence: block_table[s / block_size] * block_size +
// s % block_size (the slot mapping kernels write to; the one formula of the codebase).
HYSERVE_HOST_DEVICE inline int64_t slot_index(const int32_t* block_table, int64_t block_size,
                                              int64_t s) {
  return static_cast<int64_t>(block_table[s / block_size]) * block_size + s % block_size;
}

struct PagedRows {
  const int32_t* block_table = nullptr;  // [ceil(S / block_size)] block ids; null: contiguous
  int64_t block_size = 0;                // rows per block (power of two when paged)
  int64_t block_stride_bytes = 0;        // bytes between one block's page and the next's

  HYSERVE_HOST_DEVICE bool paged() const { return block_table != nullptr; }

  // Byte offset of row s from the page base, rows of row_bytes each.
  HYSERVE_HOST_DEVICE int64_t byte_offset(int64_t s, int64_t row_bytes) const {
    if (block_table == nullptr) return s * row_bytes;
    return static_cast<int64_t>(block_table[s / block_size]) * block_stride_bytes +
           (s % block_size) * row_bytes;
  }

  // The pages of query t when every query has its own block table, table_stride apart
  // (batched decode); this table when table_stride is 0.
  HYSERVE_HOST_DEVICE PagedRows for_query(int64_t t, int64_t table_stride) const {
    PagedRows r = *this;
    if (table_stride > 0 && r.block_table != nullptr) r.block_table += t * table_stride;
    return r;
  }

  template <typename T>
  HYSERVE_HOST_DEVICE const T* row(const T* base, int64_t s, int64_t width) const {
    return reinterpret_cast<const T*>(reinterpret_cast<const char*>(base) +
                                      byte_offset(s, width * static_cast<int64_t>(sizeof(T))));
  }
};

}  // namespace hyserve
