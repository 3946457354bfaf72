// CUDA token sampling (params.h; logits, options and tokens are device pointers). One
// block per row; the filters are found by radix selection over the 64-bit rank keys
// with integer weight sums, so the token equals the CPU op's for the same inputs. No
// workspace. The GPU cannot throw: a row with invalid options, or all-NaN logits, gets
// token -1 (the CPU op throws on invalid options; check sampling::options_valid on the
// host before uploading).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/sampling/params.h"

namespace hyserve::cuda {

void sample_tokens(const SampleParams& p, cudaStream_t stream);
void gather_tokens(const GatherTokensParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
