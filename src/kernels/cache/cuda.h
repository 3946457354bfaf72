// CUDA cache write and read (params.h); pointers are device pointers. Capturable in a CUDA
// graph: the slots and block tables are read on the device.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cache/params.h"

namespace hyserve::cuda {

void scatter_rows(const ScatterRowsParams& p, cudaStream_t stream);
void gather_rows(const GatherRowsParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
