// CUDA RMSNorm and LayerNorm (params.h; device pointers). One block per row; the row
// statistics are summed in double as on the CPU, so results match the CPU op to
// about one fp32 ulp (only the summation order differs).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/norm/params.h"

namespace hyserve::cuda {

void rms_norm(const RmsNormParams& p, cudaStream_t stream);
void layer_norm(const LayerNormParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
