// The argument checks shared by the CPU and CUDA cache writes and reads.
#pragma once

#include "kernels/cache/params.h"
#include "util/error.h"

namespace hyserve {

inline void check_scatter_rows(const ScatterRowsParams& p) {
  CHECK(p.num_rows >= 0 && p.row_bytes > 0 && p.block_size > 0, "scatter_rows: ", p.num_rows,
        " rows of ", p.row_bytes, " bytes, block_size ", p.block_size);
  CHECK(p.block_stride_bytes >= p.block_size * p.row_bytes, "scatter_rows: block stride ",
        p.block_stride_bytes, " bytes is less than a page of ", p.block_size, " rows of ",
        p.row_bytes, " bytes");
  if (p.num_rows > 0) {
    CHECK(p.src != nullptr && p.slots != nullptr && p.dst != nullptr,
          "scatter_rows: null src, slots or dst");
  }
}

inline void check_gather_rows(const GatherRowsParams& p) {
  CHECK(p.num_rows >= 0 && p.row_bytes > 0 && p.dst_stride_bytes >= p.row_bytes,
        "gather_rows: ", p.num_rows, " rows of ", p.row_bytes, " bytes, dst stride ",
        p.dst_stride_bytes);
  if (p.src_pages.paged()) {
    CHECK(p.src_pages.block_size > 0 &&
              p.src_pages.block_stride_bytes >= p.src_pages.block_size * p.row_bytes,
          "gather_rows: block stride ", p.src_pages.block_stride_bytes,
          " bytes is less than a page of ", p.src_pages.block_size, " rows of ", p.row_bytes,
          " bytes");
  }
  if (p.num_rows > 0) CHECK(p.src != nullptr && p.dst != nullptr, "gather_rows: null src or dst");
}

}  // namespace hyserve
