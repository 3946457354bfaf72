// CUDA top-k merge steps (params.h; device pointers, stream-ordered): equal to the CPU
// steps (integer keys throughout). One block of 256 threads per row; pack sorts a row's
// up-to-2048 keys with CUB's block radix sort; the threshold and the ranks of round 2 come
// from binary searches in the other ranks' sorted lists.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/topk_merge/params.h"

namespace hyserve::cuda {

void topk_merge_pack(const TopkMergeParams& p, cudaStream_t stream);
void topk_merge_decide(const TopkMergeParams& p, cudaStream_t stream);
void topk_merge_resend_pack(const TopkMergeParams& p, cudaStream_t stream);
void topk_merge_resend_decide(const TopkMergeParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
