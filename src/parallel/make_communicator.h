// The CPU backend's communicator for a group: Gloo when hyserve is built with it
// (HYSERVE_WITH_GLOO), otherwise only a group of one.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace hyserve {
class Device;
}

namespace hyserve::parallel {

// As make_gloo_communicator; without Gloo, size > 1 throws CommError.
std::unique_ptr<Communicator> make_cpu_communicator(Store& store, int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& prefix);

// The communicator for buffers of `device` (a backend): NCCL on its stream and device 0 (each
// rank's process sees its one GPU) for the CUDA backend, make_cpu_communicator for the CPU one.
// CommError when the device's library was not built in.
std::unique_ptr<Communicator> make_backend_communicator(Device& device, Store& store, int rank,
                                                        int size, std::chrono::milliseconds timeout,
                                                        const std::string& prefix);

}  // namespace hyserve::parallel
