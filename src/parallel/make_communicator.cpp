#include "parallel/make_communicator.h"

#include "backend/device.h"
#if HYSERVE_WITH_NCCL
#include "parallel/cuda/nccl_communicator.h"
#endif

#if HYSERVE_WITH_GLOO
#include "parallel/gloo/gloo_communicator.h"
#else
#include "parallel/single_rank_communicator.h"
#endif

namespace hyserve::parallel {

std::unique_ptr<Communicator> make_cpu_communicator(
    [[maybe_unused]] Store& store, int rank, int size,
    [[maybe_unused]] std::chrono::milliseconds timeout,
    [[maybe_unused]] const std::string& prefix) {
#if HYSERVE_WITH_GLOO
  return make_gloo_communicator(store, rank, size, timeout, prefix);
#else
  CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of a group of ", size);
  if (size > 1)
    throw CommError(
        str_cat("a group of ", size, " ranks needs Gloo: hyserve was built without Gloo"));
  return make_single_rank_communicator();
#endif
}

std::unique_ptr<Communicator> make_backend_communicator(Device& device, Store& store, int rank,
                                                        int size, std::chrono::milliseconds timeout,
                                                        const std::string& prefix) {
  if (device.kind() == DeviceKind::kCpu) {
    return make_cpu_communicator(store, rank, size, timeout, prefix);
  }
#if HYSERVE_WITH_NCCL
  return make_nccl_communicator(store, rank, size, 0,
                                static_cast<cudaStream_t>(device.native_stream()), timeout, prefix);
#else
  if (size == 1) return make_cpu_communicator(store, rank, size, timeout, prefix);
  throw CommError(str_cat("a group of ", size, " GPUs needs NCCL: hyserve was built without it"));
#endif
}

}  // namespace hyserve::parallel
