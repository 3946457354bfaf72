// CUDA logits processors and log-probabilities (params.h; every pointer is a device
// pointer). No workspace, no host synchronization: all are capturable in a CUDA graph.
// Results equal the CPU ops' (cpu.h) bit for bit, except token_logprobs' logprob values,
// whose double log-sum-exp is summed in another order (and with the device exp / log):
// within a couple of fp32 ulp of the CPU's; its ranks and top ids are exact.
//
// The host launchers check shapes and pointers and throw InvalidArgument; what only the
// device can see is not refused but handled as stated:
//   count_tokens      entries with rows[i] < 0 are skipped (tokens outside the vocab too)
//   adjust_logits     entries with a row or id out of range are skipped
//   apply_token_mask  rows out of range are skipped; rows must be distinct
//   token_logprobs    a target outside [0, vocab) gets logprob NaN and rank 0; with
//                     top_n > vocab the slots past the vocab get id -1 and logprob -inf
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/logits/params.h"

namespace hyserve::cuda {

void apply_penalties(const PenaltyParams& p, cudaStream_t stream);
void count_tokens(const CountTokensParams& p, cudaStream_t stream);
void adjust_logits(const LogitAdjustParams& p, cudaStream_t stream);
void apply_token_mask(const TokenMaskParams& p, cudaStream_t stream);
void token_logprobs(const LogprobParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
