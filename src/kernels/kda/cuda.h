// CUDA versions of the KDA ops (params.h, cpu.h): same Params, DEVICE pointers,
// launched on a stream; no allocation, no workspace. Each output element is computed in
// the CPU's operation order, so results differ from cpu:: only by fp32 rounding (FMA
// contraction, the device expf/logf/sqrtf). kda_chunked sums the in-chunk gates in
// double, as the CPU does. kda_recurrent and kda_chunked need head_dim <= 128.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kda/params.h"

namespace hyserve::cuda {

void short_conv_silu(const ShortConvParams& p, cudaStream_t stream);

void kda_gate(const KdaGateParams& p, cudaStream_t stream);

// Each row of x [rows, dim] becomes x / sqrt(sum x^2 + 1e-6) * scale, in place.
void l2norm_rows(float* x, int64_t rows, int64_t dim, float scale, cudaStream_t stream);

// Token by token (decode). Grid: heads x V-slices of 32 columns (the columns of S are
// independent given k, q, g, beta).
void kda_recurrent(const KdaParams& p, cudaStream_t stream);

// Chunked (WY) form for prefill. Grid: heads x V-slices of 32 columns; each block
// recomputes its chunk's A, W and Aqk (V-independent) and carries its columns of S
// through the chunks in shared memory. chunk_size <= 64.
void kda_chunked(const KdaParams& p, cudaStream_t stream, int64_t chunk_size = kKdaChunkSize);

void gated_rms_norm(const GatedRmsNormParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
