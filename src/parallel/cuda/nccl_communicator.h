// The CUDA backend's Communicator, over NCCL: buffers in device memory, collectives issued
// on the given stream (ordered with the backend's kernels, not waited for). Rank 0 makes
// the ncclUniqueId and shares it through the Store (key prefix + "/nccl_unique_id").
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0), so that a peer that died
// or hung shows as an error or a timeout instead of a call that never returns: init and
// every enqueue are polled with ncclCommGetAsyncError up to the timeout, then the
// communicator is aborted and CommError thrown naming this rank. NVLink multicast (NVLS)
// is off: NCCL_NVLS_ENABLE=0 unless the environment already sets it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace hyserve::parallel {

// Blocks until all size ranks have joined (or timeout: CommError). device: the CUDA device
// of this rank; stream: on that device.
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, int rank, int size, int device,
                                                     cudaStream_t stream,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& prefix);

}  // namespace hyserve::parallel
