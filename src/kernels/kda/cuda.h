// CUDA versions of the KDA ops (params.h, cpu.h): same Params, DEVICE pointers,
// launched on a stream; no allocation. The elementwise ops and kda_recurrent compute
// each output element in the CPU's operation order, so results differ from cpu:: only by
// fp32 rounding (FMA contraction, the device expf/logf/sqrtf). kda_chunked sums the
// in-chunk gates in double, as the CPU does, and runs its matrix products on tensor
// cores at near-fp32 accuracy (3xTF32, kda_chunked.cu). kda_recurrent and kda_chunked
// need head_dim <= 128.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kda/params.h"

namespace hyserve::cuda {

void short_conv_silu(const ShortConvParams& p, cudaStream_t stream);

void kda_gate(const KdaGateParams& p, cudaStream_t stream);

// Each row of x [rows, dim] becomes x / sqrt(sum x^2 + 1e-6) * scale, in place.
void l2norm_rows(float* x, int64_t rows, int64_t dim, float scale, cudaStream_t stream);
inline void l2norm_rows(const L2NormRowsParams& p, cudaStream_t stream) {
  l2norm_rows(p.x, p.rows, p.dim, p.scale, stream);
}

// Token by token (one-token prefill chunks). Grid: heads x V-slices of 32 columns (the
// columns of S are independent given k, q, g, beta).
void kda_recurrent(const KdaParams& p, cudaStream_t stream);

// Bytes of workspace kda_chunked needs: one record per (chunk, head) of a slab of up
// to 64 chunks (about 148 KiB per chunk and head at head_dim 128), so it stops growing
// past 64 chunks of tokens. 0 for num_tokens == 0.
size_t kda_chunked_workspace_bytes(const KdaParams& p, int64_t chunk_size = kKdaChunkSize);

// Chunked (WY) form for prefill, chunks of chunk_size <= 64 tokens from the start of the
// call. Per slab of 64 chunks: all (chunk, head) pairs build their chunk's A, W, U, Aqk
// at once, then one block per (head, slice of V columns) carries S through the chunks.
// v_slice: the slice width, 64, 32 or 16 (0: the widest whose blocks fill every SM); it
// changes no bit of the result (tests, benchmarks).
// workspace: 256-byte aligned, at least kda_chunked_workspace_bytes(p, chunk_size).
void kda_chunked(const KdaParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                 int64_t chunk_size = kKdaChunkSize, int v_slice = 0);

void gated_rms_norm(const GatedRmsNormParams& p, cudaStream_t stream);

// The fused decode (params.h KdaDecodeParams): one block per (request, head), the state
// in registers, read and written once per call; any number of tokens per request.
void kda_decode(const KdaDecodeParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
