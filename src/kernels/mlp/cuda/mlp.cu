// CUDA gated MLP: workspace = [gate | up | linear workspace], each 256-byte aligned.
// SiLU runs cuda::silu_mul; SiTU runs gated_activation (params.h) elementwise here.
#include <algorithm>

#include "kernels/elementwise/cuda.h"
#include "kernels/lora/cuda.h"
#include "kernels/mlp/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr int kThreads = 256;

// gate[i] = act(gate[i], up[i])
__global__ void gated_activation_kernel(float* __restrict__ gate, const float* __restrict__ up,
                                        int64_t n, GatedActivation act) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    gate[i] = gated_activation(gate[i], up[i], act);
  }
}

void apply_gated_activation(float* gate, const float* up, int64_t n, const GatedActivation& act,
                            cudaStream_t stream) {
  if (act.kind == GatedActivation::Kind::kSilu) {
    silu_mul({.gate = gate, .up = up, .out = gate, .n = n}, stream);
    return;
  }
  const auto blocks =
      static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65536));
  gated_activation_kernel<<<blocks, kThreads, 0, stream>>>(gate, up, n, act);
  CUDA_CHECK_LAUNCH();
}

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

size_t activation_bytes(const MlpWeights& w, int64_t max_tokens) {
  return align_up(static_cast<size_t>(max_tokens * w.gate.rows) * sizeof(float));
}

}  // namespace

size_t mlp_workspace_bytes(const MlpWeights& w, int64_t max_tokens) {
  CHECK(max_tokens >= 0, "mlp_workspace_bytes: max_tokens ", max_tokens);
  cpu::check_mlp_weights(w, w.down.rows);
  return 2 * activation_bytes(w, max_tokens) +
         std::max({linear_workspace_bytes(w.gate, max_tokens),
                   linear_workspace_bytes(w.up, max_tokens),
                   linear_workspace_bytes(w.down, max_tokens)});
}

void mlp(const MlpParams& p, const Blas& blas, void* workspace, size_t workspace_bytes,
         cudaStream_t stream, LinearKernel kernel) {
  CHECK(p.x != nullptr && p.w != nullptr && p.y != nullptr, "mlp: null pointer");
  CHECK(p.num_tokens >= 0, "mlp: num_tokens ", p.num_tokens);
  cpu::check_mlp_weights(*p.w, p.w->down.rows);
  cpu::check_gated_activation(p.act);
  if (p.num_tokens == 0) return;
  const size_t need = mlp_workspace_bytes(*p.w, p.num_tokens);
  CHECK(workspace != nullptr && workspace_bytes >= need, "mlp: workspace of ", workspace_bytes,
        " bytes, ", p.num_tokens, " tokens need ", need);
  const size_t act = activation_bytes(*p.w, p.num_tokens);
  auto* base = static_cast<char*>(workspace);
  auto* gate = reinterpret_cast<float*>(base);      // [T, I]
  auto* up = reinterpret_cast<float*>(base + act);  // [T, I]
  void* lin = base + 2 * act;
  const size_t lin_bytes = workspace_bytes - 2 * act;
  const int64_t t = p.num_tokens;
  const int64_t hidden = p.w->down.rows;
  const int64_t inter = p.w->gate.rows;
  // LoRA (kernels/lora/cuda.h) on each projection's output, gate and up before the
  // activation, as the CPU op adds them.
  const auto add_lora = [&](const LoraModule& m, const float* in_x, float* out_y, int64_t in,
                            int64_t out) {
    if (p.lora != nullptr && !m.empty()) {
      lora_add({in_x, out_y, t, in, out, p.lora->token_slots, m}, stream);
    }
  };
  linear({.x = p.x, .w = &p.w->gate, .y = gate, .num_tokens = t}, blas, lin, lin_bytes, stream,
         kernel);
  linear({.x = p.x, .w = &p.w->up, .y = up, .num_tokens = t}, blas, lin, lin_bytes, stream, kernel);
  if (p.lora != nullptr) {
    add_lora(p.lora->gate, p.x, gate, hidden, inter);
    add_lora(p.lora->up, p.x, up, hidden, inter);
  }
  apply_gated_activation(gate, up, t * inter, p.act, stream);
  linear({.x = gate, .w = &p.w->down, .y = p.y, .num_tokens = t}, blas, lin, lin_bytes, stream,
         kernel);
  if (p.lora != nullptr) add_lora(p.lora->down, gate, p.y, inter, hidden);
}

}  // namespace hyserve::cuda
