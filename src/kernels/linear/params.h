// Linear layers and the embedding table: everything that reads a Weight matrix
// (dense, FP8 block or MXFP4) row by row. y = x W^T (+ bias) is the workhorse of
// every projection in MODEL.md; embedding_lookup is a gather of decoded rows.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace hyserve {

// y = x W^T (+ bias). Each output is one fp32 dot product over w->cols in a fixed
// order, so a token's result is bitwise the same whatever batch it is in.
// y must not overlap x.
struct LinearParams {
  const float* x = nullptr;   // [num_tokens, w->cols]
  const Weight* w = nullptr;  // [rows, cols]
  float* y = nullptr;         // [num_tokens, w->rows]
  int64_t num_tokens = 0;
  const float* bias = nullptr;  // [w->rows], or null
};

// out[i] = table[ids[i]], decoded to fp32. Throws naming the id when one is out of range.
namespace cpu {

void linear(const LinearParams& p);
void embedding_lookup(const Weight& table /* [vocab, dim] */, const int32_t* ids /* [n] */,
                      int64_t n, float* out /* [n, dim] */);

}  // namespace cpu
}  // namespace hyserve
