// CUDA attention merge (params.h; device pointers): the CPU op's sums in the same order;
// expf / logf may differ from the host's by an ulp.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/merge/params.h"

namespace hyserve::cuda {

void attention_merge(const AttentionMergeParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
