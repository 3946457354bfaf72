// CPU reference of the logits processors and log-probabilities (params.h), one plain loop
// nest per op in fp32 (the log-sum-exp in double). Every op refuses bad
// shapes, null pointers and out-of-range rows / ids with InvalidArgument naming the field.
//
// Beyond params.h:
//   count_tokens / apply_penalties  rows[i] must be >= 0 (max_rows is not known here).
//   adjust_logits                   (row, id) pairs must be distinct; kAdd needs `value`.
//   apply_token_mask                rows must be distinct; mask bits of ids >= vocab (the
//                                   last word's padding) are ignored.
//   token_logprobs                  targets in [0, vocab); when top_n > vocab, the slots
//                                   past the vocab get id -1 and logprob -inf.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "kernels/logits/params.h"
#include "kernels/sampling/params.h"

namespace hyserve {

namespace logits {

// The logprob rank order of params.h as one unique integer per id, larger first:
// sampling::rank_key for non-NaN logits (logit desc, id asc; -0 and +0 tie,
// core/order_key.h), and below every non-NaN logit (whose order key is >= that of -inf,
// 0x007fffff) the NaNs by id asc. Shared by the CPU and CUDA ops so that ranks and top ids
// agree exactly.
HYSERVE_HOST_DEVICE inline uint64_t logprob_key(float logit, int64_t id) {
  const bool is_nan = logit != logit;
  return is_nan ? uint64_t{0xffffffffu - static_cast<uint32_t>(id)} : sampling::rank_key(logit, id);
}

// The id a logprob_key was made from.
HYSERVE_HOST_DEVICE inline int32_t logprob_key_id(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

}  // namespace logits

namespace cpu {

void apply_penalties(const PenaltyParams& p);
void count_tokens(const CountTokensParams& p);
void adjust_logits(const LogitAdjustParams& p);
void apply_token_mask(const TokenMaskParams& p);
void token_logprobs(const LogprobParams& p);

}  // namespace cpu
}  // namespace hyserve
