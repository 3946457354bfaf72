// CUDA elementwise steps: grid-stride loops over n, one functor per step.
#include <algorithm>

#include "kernels/elementwise/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;

struct ResidualAdd {
  ResidualAddParams p;
  __device__ void operator()(int64_t i) const { p.h[i] += p.x[i]; }
};

struct SigmoidGate {
  SigmoidGateParams p;
  __device__ void operator()(int64_t i) const { p.o[i] *= 1.0f / (1.0f + expf(-p.g[i])); }
};

struct SiluMul {
  SiluMulParams p;
  __device__ void operator()(int64_t i) const {
    const float g = p.gate[i];
    p.out[i] = g / (1.0f + expf(-g)) * p.up[i];
  }
};

struct Sigmoid {
  SigmoidParams p;
  __device__ void operator()(int64_t i) const { p.x[i] = 1.0f / (1.0f + expf(-p.x[i])); }
};

struct Scale {
  ScaleParams p;
  __device__ void operator()(int64_t i) const { p.x[i] *= p.scale; }
};

struct Mul {
  MulParams p;
  __device__ void operator()(int64_t i) const { p.y[i] *= p.x[i]; }
};

struct DcpLocalize {
  DcpLocalizeParams p;
  __device__ void operator()(int64_t i) const {
    const int64_t pos = p.pos[i];
    p.local_pos[i] = dcp_causal_bound(pos, p.rank, p.size);
    p.local_slot[i] = dcp_owner(pos, p.size) == p.rank ? p.slots[i] : -1;
  }
};

template <typename Fn>
__global__ void for_each_kernel(int64_t n, Fn fn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    fn(i);
  }
}

template <typename Fn>
void launch(int64_t n, cudaStream_t stream, Fn fn) {
  const auto blocks =
      static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65536));
  for_each_kernel<<<blocks, kThreads, 0, stream>>>(n, fn);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void residual_add(const ResidualAddParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "residual_add: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.h != nullptr && p.x != nullptr, "residual_add: null pointer");
  launch(p.n, stream, ResidualAdd{p});
}

void sigmoid_gate(const SigmoidGateParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "sigmoid_gate: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.o != nullptr && p.g != nullptr, "sigmoid_gate: null pointer");
  launch(p.n, stream, SigmoidGate{p});
}

void silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "silu_mul: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.gate != nullptr && p.up != nullptr && p.out != nullptr, "silu_mul: null pointer");
  launch(p.n, stream, SiluMul{p});
}

void sigmoid(const SigmoidParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "sigmoid: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.x != nullptr, "sigmoid: null pointer");
  launch(p.n, stream, Sigmoid{p});
}

void scale(const ScaleParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "scale: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.x != nullptr, "scale: null pointer");
  launch(p.n, stream, Scale{p});
}

void mul(const MulParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0, "mul: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.y != nullptr && p.x != nullptr, "mul: null pointer");
  launch(p.n, stream, Mul{p});
}

void dcp_localize(const DcpLocalizeParams& p, cudaStream_t stream) {
  CHECK(p.n >= 0 && p.size >= 1 && p.rank >= 0 && p.rank < p.size, "dcp_localize: n ", p.n,
        ", rank ", p.rank, " of ", p.size);
  if (p.n == 0) return;
  launch(p.n, stream, DcpLocalize{p});
}

}  // namespace hyserve::cuda
