// CUDA linear layers and embedding lookup (params.h; pointers are device pointers, the
// Weight structs are host structs whose data / scales point to device memory, e.g.
// DeviceWeight::view()).
//
// linear runs one of three kernels (LinearKernel; kAuto picks the GEMV for T <=
// kSmallBatchMaxTokens tokens and cuBLAS above):
//   GEMV             memory-bound: each weight row is streamed once per 16 tokens, decoded
//                    in registers, dotted in fp32. Exact fp32 math; differs from the CPU
//                    only in summation order.
//   cuBLAS           tensor cores (fp32 accumulate and output): x is rounded to bf16; a
//                    BF16 weight is used as stored, any other format is decoded to bf16 in
//                    row blocks of kGemmRowBlock rows (so FP8 / F32 / F16 weights are also
//                    rounded to bf16; MXFP4 decodes exactly). cuBLAS picks its algorithm by
//                    shape, so a token's bits depend on T.
//   batch-invariant  our tensor-core tiles (cuda/mma_tile.cuh): x rounded to bf16, weights
//                    decoded to bf16 in shared memory (FP8: the raw e4m3 values, each
//                    128-wide block's partial sum scaled in fp32), one fixed k order for
//                    every output. A token's result is bitwise the same at any T and in
//                    any batch; the cost is speed (no split-K, no shape tuning).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/cuda/device_buffer.h"
#include "kernels/linear/params.h"

namespace hyserve::cuda {

// A cuBLAS handle bound to one stream; ops that use tensor cores take it.
class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer workspace_;
};

inline constexpr int64_t kSmallBatchMaxTokens = 16;

enum class LinearKernel {
  kAuto,            // GEMV up to kSmallBatchMaxTokens tokens, cuBLAS above: the fastest
  kGemv,            // the GEMV at any T
  kCublas,          // cuBLAS at any T
  kBatchInvariant,  // the batch-invariant tiles at any T
};
inline constexpr int64_t kGemmRowBlock = 4096;

// Device workspace the tensor-core path of linear needs for up to max_tokens tokens:
// x in bf16 [max_tokens, cols], plus a bf16 [min(rows, kGemmRowBlock), cols] block of
// decoded weight rows unless w is dense BF16.
size_t linear_workspace_bytes(const Weight& w, int64_t max_tokens);

// y = x W^T (+ bias) on `stream` (must be blas.stream()). The workspace is only used
// (and only checked) on the cuBLAS path.
void linear(const LinearParams& p, const Blas& blas, void* workspace, size_t workspace_bytes,
            cudaStream_t stream, LinearKernel kernel = LinearKernel::kAuto);

// Several linears of one input x (the same x, num_tokens and cols; e.g. a layer's q, k, v
// projections): on the tensor-core path x is rounded to bf16 once for all of them, each
// result as linear() gives it. The workspace: linears_workspace_bytes.
void linears(std::span<const LinearParams> ps, const Blas& blas, void* workspace,
             size_t workspace_bytes, cudaStream_t stream,
             LinearKernel kernel = LinearKernel::kAuto);
size_t linears_workspace_bytes(std::span<const LinearParams> ps);

// The GEMV path alone, for any number of tokens (the weight is streamed once per 16
// tokens): exact fp32 up to summation order, no workspace. Used where a discrete
// decision follows (the MoE router) and by tests.
void linear_gemv(const LinearParams& p, cudaStream_t stream);

// EmbeddingParams (kernels/linear/params.h). The GPU cannot throw on a bad id: a row
// whose id is outside [0, vocab_size) is filled with NaN (the CPU op throws).
void embedding_lookup(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
