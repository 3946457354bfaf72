// CUDA RoPE: one block per token; threads walk (head, pair) and rotate in place with
// the CPU op's float arithmetic (separately rounded products, no fused multiply-add).
#include "kernels/rope/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 128;

template <bool kNeox>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(RopeParams p, const float* __restrict__ inv_freq, int64_t half, float af) {
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(p.positions[t]);
  for (int64_t j = threadIdx.x; j < p.num_heads * half; j += kThreads) {
    const int64_t h = j / half;
    const int64_t i = j % half;
    float* x = p.x + (t * p.num_heads + h) * p.head_stride + p.offset;
    const float angle = __fmul_rn(pos, inv_freq[i]);
    const float c = __fmul_rn(cosf(angle), af);
    const float s = __fmul_rn(sinf(angle), af);
    const int64_t ia = kNeox ? i : 2 * i;
    const int64_t ib = kNeox ? i + half : 2 * i + 1;
    const float a = x[ia];
    const float b = x[ib];
    x[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x[ib] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

template <bool kNeox>
void apply_rope(const DeviceRopeTable& table, const RopeParams& p, cudaStream_t stream) {
  CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 &&
            table.inv_freq.size() == static_cast<size_t>(table.rotary_dim / 2) * sizeof(float),
        "DeviceRopeTable is not uploaded (rotary_dim ", table.rotary_dim, ")");
  CHECK(p.num_tokens >= 0, "num_tokens ", p.num_tokens);
  CHECK(p.num_heads > 0, "num_heads ", p.num_heads);
  CHECK(p.offset >= 0 && p.offset + table.rotary_dim <= p.head_stride, "rotated dims [", p.offset,
        ", ", p.offset + table.rotary_dim, ") do not fit a head of ", p.head_stride);
  if (p.num_tokens == 0) return;
  CHECK(p.x != nullptr && p.positions != nullptr, "null x or positions");
  CHECK(p.num_tokens <= INT32_MAX, "num_tokens ", p.num_tokens, " over 2^31");
  rope_kernel<kNeox><<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(
      p, table.inv_freq.as<float>(), table.rotary_dim / 2, table.attention_factor);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

DeviceRopeTable DeviceRopeTable::upload(const RopeTable& table) {
  CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 &&
            static_cast<int64_t>(table.inv_freq.size()) == table.rotary_dim / 2,
        "RopeTable is not built (rotary_dim ", table.rotary_dim, ")");
  DeviceRopeTable d;
  d.rotary_dim = table.rotary_dim;
  d.attention_factor = table.attention_factor;
  d.inv_freq = to_device(table.inv_freq);
  return d;
}

void apply_rope_interleaved(const DeviceRopeTable& table, const RopeParams& p,
                            cudaStream_t stream) {
  apply_rope<false>(table, p, stream);
}

void apply_rope_neox(const DeviceRopeTable& table, const RopeParams& p, cudaStream_t stream) {
  apply_rope<true>(table, p, stream);
}

}  // namespace hyserve::cuda
