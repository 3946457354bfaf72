// CUDA_CHECK / CUBLAS_CHECK: every CUDA runtime and cuBLAS call is checked; a failure
// throws hyserve::CudaError naming the call, the error and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "util/error.h"

namespace hyserve {

class CudaError : public Error {
 public:
  using Error::Error;
};

}  // namespace hyserve

#define CUDA_CHECK(call)                                                                         \
  do {                                                                                           \
    const cudaError_t hyserve_cuda_err_ = (call);                                                \
    if (hyserve_cuda_err_ != cudaSuccess)                                                        \
      HYSERVE_THROW(::hyserve::CudaError, #call ": ", cudaGetErrorName(hyserve_cuda_err_), " (", \
                    cudaGetErrorString(hyserve_cuda_err_), ")");                                 \
  } while (0)

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    const cublasStatus_t hyserve_cublas_st_ = (call);                                           \
    if (hyserve_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                            \
      HYSERVE_THROW(::hyserve::CudaError, #call ": ", cublasGetStatusName(hyserve_cublas_st_)); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at once.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
