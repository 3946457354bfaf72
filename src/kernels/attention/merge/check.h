// validate(Params) of the attention merge (params.h): what both the CPU op (cpu.cpp) and the
// CUDA launcher (cuda/attention_merge.cu) require, checked on the host before either runs.
// The launcher adds only its own limits (parts per row, rows per grid).
#pragma once

#include "kernels/attention/merge/params.h"
#include "util/error.h"

namespace hyserve {

inline void validate(const AttentionMergeParams& p) {
  CHECK(p.num_parts >= 1 && p.rows >= 0 && p.width >= 0, "attention_merge: num_parts ", p.num_parts,
        ", rows ", p.rows, ", width ", p.width);
  if (p.rows > 0) {
    CHECK(p.parts != nullptr && p.lses != nullptr && p.out != nullptr,
          "attention_merge: null parts, lses or out");
  }
}

}  // namespace hyserve
