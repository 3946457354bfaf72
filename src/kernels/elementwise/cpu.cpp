// CPU reference of the elementwise steps: one loop each, parallel over chunks.
#include "kernels/elementwise/cpu.h"

#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

constexpr int64_t kMinChunk = 4096;

template <typename Fn>
void for_each_index(int64_t n, Fn fn) {
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) fn(i);
      },
      kMinChunk);
}

}  // namespace

void residual_add(const ResidualAddParams& p) {
  CHECK(p.n >= 0, "residual_add: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.h != nullptr && p.x != nullptr, "residual_add: null pointer");
  for_each_index(p.n, [&](int64_t i) { p.h[i] += p.x[i]; });
}

void sigmoid_gate(const SigmoidGateParams& p) {
  CHECK(p.n >= 0, "sigmoid_gate: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.o != nullptr && p.g != nullptr, "sigmoid_gate: null pointer");
  for_each_index(p.n, [&](int64_t i) { p.o[i] *= 1.0f / (1.0f + std::exp(-p.g[i])); });
}

void silu_mul(const SiluMulParams& p) {
  CHECK(p.n >= 0, "silu_mul: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.gate != nullptr && p.up != nullptr && p.out != nullptr, "silu_mul: null pointer");
  for_each_index(p.n, [&](int64_t i) {
    const float g = p.gate[i];
    p.out[i] = g / (1.0f + std::exp(-g)) * p.up[i];
  });
}

void sigmoid(const SigmoidParams& p) {
  CHECK(p.n >= 0, "sigmoid: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.x != nullptr, "sigmoid: null pointer");
  for_each_index(p.n, [&](int64_t i) { p.x[i] = 1.0f / (1.0f + std::exp(-p.x[i])); });
}

void scale(const ScaleParams& p) {
  CHECK(p.n >= 0, "scale: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.x != nullptr, "scale: null pointer");
  for_each_index(p.n, [&](int64_t i) { p.x[i] *= p.scale; });
}

void mul(const MulParams& p) {
  CHECK(p.n >= 0, "mul: n ", p.n);
  if (p.n == 0) return;
  CHECK(p.y != nullptr && p.x != nullptr, "mul: null pointer");
  for_each_index(p.n, [&](int64_t i) { p.y[i] *= p.x[i]; });
}

void dcp_localize(const DcpLocalizeParams& p) {
  CHECK(p.n >= 0 && p.size >= 1 && p.rank >= 0 && p.rank < p.size, "dcp_localize: n ", p.n,
        ", rank ", p.rank, " of ", p.size);
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t pos = p.pos[i];
    p.local_pos[i] = dcp_causal_bound(pos, p.rank, p.size);
    p.local_slot[i] = dcp_owner(pos, p.size) == p.rank ? p.slots[i] : -1;
  }
}

void copy_2d(const Copy2dParams& p) {
  for (int64_t r = 0; r < p.rows; ++r)
    std::memmove(p.dst + r * p.dst_stride, p.src + r * p.src_stride,
                 static_cast<size_t>(p.width) * sizeof(float));
}

}  // namespace hyserve::cpu
