// HYSERVE_HOST_DEVICE: marks small inline helpers that both host code and CUDA kernels call.
#pragma once

#if defined(__CUDACC__)
#define HYSERVE_HOST_DEVICE __host__ __device__
#else
#define HYSERVE_HOST_DEVICE
#endif
