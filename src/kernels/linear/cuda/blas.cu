#include "core/cuda/device_buffer.h"
#include "kernels/linear/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  cublasStatus_t st = cublasSetStream(handle_, stream);
  // A workspace of our own, so cuBLAS allocates nothing while a CUDA graph is captured.
  if (st == CUBLAS_STATUS_SUCCESS) {
    workspace_ = DeviceBuffer(kWorkspaceBytes);
    st = cublasSetWorkspace(handle_, workspace_.data(), kWorkspaceBytes);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle_);
    CUBLAS_CHECK(st);
  }
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

}  // namespace hyserve::cuda
