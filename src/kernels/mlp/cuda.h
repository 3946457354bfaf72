// CUDA gated MLP (params.h; device activations, MlpWeights of device-data Weights):
// y = down(act(gate(x), up(x))) as three cuda::linear calls around the elementwise
// activation (p.act: cuda::silu_mul for SiLU, gated_activation for SiTU, both in fp32
// with the CPU op's float expressions), so its numerics are linear's (fp32 GEMV for
// small batches, bf16 tensor cores above; `kernel` picks linear's kernel,
// kernels/linear/cuda.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/linear/cuda.h"
#include "kernels/mlp/params.h"

namespace hyserve::cuda {

// gate and up activations [max_tokens, I] fp32, and the largest linear workspace.
size_t mlp_workspace_bytes(const MlpWeights& w, int64_t max_tokens);

void mlp(const MlpParams& p, const Blas& blas, void* workspace, size_t workspace_bytes,
         cudaStream_t stream, LinearKernel kernel = LinearKernel::kAuto);

}  // namespace hyserve::cuda
