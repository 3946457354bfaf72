// CUDA LoRA add (cuda.h): one 256-thread block per token; shrink into shared memory, then
// expand into y.
#include "kernels/lora/cuda.h"
#include "kernels/lora/cuda/shrink.cuh"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
    lora_add_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t in, int64_t out,
                    const int32_t* __restrict__ token_slots, const LoraMatrices* __restrict__ table,
                    int64_t num_slots) {
  __shared__ float u[kMaxLoraRank];
  const int64_t t = blockIdx.x;
  const int32_t s = token_slots[t];
  if (s < 0 || s >= num_slots) return;
  const LoraMatrices m = table[s];
  if (m.a == nullptr || m.rank <= 0 || m.rank > kMaxLoraRank) return;
  // Shrink: u = x A^T into shared memory.
  lora_shrink<kWarps>(m, x + t * in, in, u);
  __syncthreads();
  // Expand: y[o] += scale * (B[o] . u), rank in order.
  float* yt = y + t * out;
  for (int64_t o = threadIdx.x; o < out; o += kThreads) {
    const float* b = m.b + o * m.rank;
    float acc = 0.0f;
    for (int64_t r = 0; r < m.rank; ++r) acc = fmaf(b[r], u[r], acc);
    yt[o] += m.scale * acc;
  }
}

}  // namespace

void lora_add(const LoraParams& p, cudaStream_t stream) {
  CHECK(p.x != nullptr && p.y != nullptr && p.token_slots != nullptr, "lora_add: null pointer");
  CHECK(!p.module.empty() && p.num_tokens >= 0 && p.in > 0 && p.out > 0, "lora_add: in ", p.in,
        ", out ", p.out, ", tokens ", p.num_tokens);
  CHECK(p.num_tokens <= INT32_MAX, "lora_add: ", p.num_tokens, " tokens");
  if (p.num_tokens == 0) return;
  lora_add_kernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(
      p.x, p.y, p.in, p.out, p.token_slots, p.module.slots, p.module.num_slots);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
