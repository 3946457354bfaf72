// The log-sum-exp merge of partial attention results (decode context parallelism: each
// rank attends over its share of the keys; DESIGN.md "Parallelism"). For row r (a query
// and head) of P parts, part j holding out_j[r] (width values) and lse_j[r]:
//
//   m = max_j lse_j,  w_j = exp(lse_j - m),  out[r] = sum_j w_j out_j[r] / sum_j w_j,
//   lse[r] = m + ln sum_j w_j
//
// summed in part order j = 0, 1, ... (fixed, so the result does not depend on anything
// but the parts). A part with lse -inf (no key) weighs 0; a row whose parts all have
// -inf gets out = 0 and lse = -inf, as one attention over no key does.
#pragma once

#include <cstdint>

namespace hyserve {

struct AttentionMergeParams {
  const float* parts = nullptr;  // [P, rows, width]
  const float* lses = nullptr;   // [P, rows]
  int64_t num_parts = 0;         // P >= 1
  int64_t rows = 0;
  int64_t width = 0;
  float* out = nullptr;  // [rows, width]; may not alias parts
  float* lse = nullptr;  // [rows], optional
};

}  // namespace hyserve
