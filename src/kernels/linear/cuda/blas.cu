#include "kernels/linear/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  const cublasStatus_t st = cublasSetStream(handle_, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle_);
    CUBLAS_CHECK(st);
  }
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

}  // namespace hyserve::cuda
