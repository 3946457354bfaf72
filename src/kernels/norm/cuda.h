// CUDA RMSNorm, LayerNorm and the AttnRes mix + RMSNorm (params.h; device pointers).
// One block per row (token); the row statistics (and AttnRes's per-candidate sums) are
// summed in double as on the CPU, so results match the CPU op to a few fp32 ulp (only
// the summation order differs, and attn_res_norm's softmax uses the device expf).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/norm/params.h"

namespace hyserve::cuda {

// attn_res_norm mixes at most this many candidates (snapshots + current); Kimi K3 has
// at most 8 snapshots + current.
inline constexpr int64_t kMaxAttnResCandidates = 33;

void rms_norm(const RmsNormParams& p, cudaStream_t stream);
void layer_norm(const LayerNormParams& p, cudaStream_t stream);
// Refuses num_snapshots >= kMaxAttnResCandidates.
void attn_res_norm(const AttnResNormParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
