// Parameters of the cache write: the new tokens' rows (latents, index-key codes, their
// scales) scattered into their slots of the packed block cache (core/paged.h):
//
//   slot = block * block_size + offset  ->  dst + block * block_stride_bytes + offset * row_bytes
//
// A negative slot skips its row (padding rows of a captured batch). Bytes are copied as
// they are; converting to the cache dtype happens before (e.g. quantize_fp8_ue8m0).
//
// And its reverse, the cache read of decode context parallelism's gathered context: rows
// [0, n) of one sequence's pages (or of contiguous rows) copied out, row i to a strided
// contiguous buffer:
//
//   src + src_pages.byte_offset(i, row_bytes)  ->  dst + i * dst_stride_bytes
#pragma once

#include <cstdint>

#include "core/paged.h"

namespace hyserve {

struct ScatterRowsParams {
  const void* src = nullptr;       // [n, row_bytes]
  const int64_t* slots = nullptr;  // [n] slot of each row, < 0: skip
  void* dst = nullptr;             // page of block 0 (pool base + the layer's page offset)
  int64_t num_rows = 0;            // n >= 0
  int64_t row_bytes = 0;           // > 0
  int64_t block_size = 0;          // slots per block, > 0
  int64_t block_stride_bytes = 0;  // the pool's row size
};

struct GatherRowsParams {
  const void* src = nullptr;     // page of block 0 (pool base + the layer's page offset)
  PagedRows src_pages{};         // the sequence's block table (backend memory); default:
                                 // contiguous [n, row_bytes] rows at src
  void* dst = nullptr;           // row i at dst + i * dst_stride_bytes
  int64_t num_rows = 0;          // n >= 0
  int64_t row_bytes = 0;         // > 0
  int64_t dst_stride_bytes = 0;  // >= row_bytes (row_bytes: packed rows)
};

}  // namespace hyserve
