// CUDA linear layers and embedding lookup (params.h; pointers are device pointers, the
// Weight structs are host structs whose data / scales point to device memory, e.g.
// DeviceWeight::view()).
//
// linear picks one of two paths by the number of tokens T:
//   T <= small_batch_max_tokens   memory-bound GEMV: each weight row is streamed once per
//                                 16 tokens, decoded in registers, dotted in fp32. Exact
//                                 fp32 math; differs from the CPU only in summation order.
//   T >  small_batch_max_tokens   tensor cores (cuBLAS, fp32 accumulate and output): x is
//                                 rounded to bf16; a BF16 weight is used as stored, any
//                                 other format is decoded to bf16 in row blocks of
//                                 kGemmRowBlock rows (so FP8 / F32 / F16 weights are also
//                                 rounded to bf16; MXFP4 decodes exactly).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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
inline constexpr int64_t kGemmRowBlock = 4096;

// Device workspace the tensor-core path of linear needs for up to max_tokens tokens:
// x in bf16 [max_tokens, cols], plus a bf16 [min(rows, kGemmRowBlock), cols] block of
// decoded weight rows unless w is dense BF16.
size_t linear_workspace_bytes(const Weight& w, int64_t max_tokens);

// y = x W^T (+ bias) on `stream` (must be blas.stream()). The workspace is only used
// (and only checked) on the tensor-core path.
void linear(const LinearParams& p, const Blas& blas, void* workspace, size_t workspace_bytes,
            cudaStream_t stream, int64_t small_batch_max_tokens = kSmallBatchMaxTokens);

// The GEMV path alone, for any number of tokens (the weight is streamed once per 16
// tokens): exact fp32 up to summation order, no workspace. Used where a discrete
// decision follows (the MoE router) and by tests.
void linear_gemv(const LinearParams& p, cudaStream_t stream);

// out[i] = table[ids[i]] decoded to fp32. The GPU cannot throw on a bad id: a row whose
// id is outside [0, vocab) is filled with NaN (the CPU op throws).
void embedding_lookup(const Weight& table /* [vocab, dim] */, const int32_t* ids /* [n] */,
                      int64_t n, float* out /* [n, dim] */, cudaStream_t stream);

}  // namespace hyserve::cuda
