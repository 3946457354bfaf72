// CUDA elementwise steps (params.h; device pointers). Same float expressions as the
// CPU op; expf may differ from the host's exp by an ulp or two.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/elementwise/params.h"

namespace hyserve::cuda {

void residual_add(const ResidualAddParams& p, cudaStream_t stream);
void sigmoid_gate(const SigmoidGateParams& p, cudaStream_t stream);
void silu_mul(const SiluMulParams& p, cudaStream_t stream);
void sigmoid(const SigmoidParams& p, cudaStream_t stream);
void scale(const ScaleParams& p, cudaStream_t stream);
void mul(const MulParams& p, cudaStream_t stream);
void dcp_localize(const DcpLocalizeParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
