// Parameters of the cache write: the new tokens' rows (latents, index-key codes, their
// scales) scattered into their slots of the packed block cache (core/paged.h):
//
//   slot = block * block_size + offset  ->  dst + block * block_stride_bytes + offset * row_bytes
//
// A negative slot skips its row (padding rows of a captured batch). Bytes are copied as
// they are; converting to the cache dtype happens before (e.g. quantize_fp8_ue8m0).
#pragma once

#include <cstdint>

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

}  // namespace hyserve
