// The gated MLP, MODEL.md §5: y = down(act(gate(x), up(x))), act SwiGLU's
// silu(gate) * up or Kimi K3's SiTU (K3.md §3.7). Dense layers use it directly; MoE
// experts and the shared experts are one MlpWeights each.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/paged.h"
#include "core/weight.h"
#include "kernels/linear/params.h"
#include "kernels/lora/params.h"

namespace hyserve {

struct MlpWeights {
  Weight gate;  // [I, D]
  Weight up;    // [I, D]
  Weight down;  // [D, I]
};

// The activation between gate/up and down, in fp32:
//   kSilu: silu(g) * u,  silu(v) = v / (1 + exp(-v))
//   kSitu: beta * tanh(g / beta) * sigmoid(g) * u',  u' = linear_beta * tanh(u / linear_beta)
//          (u' = u when linear_beta is 0: the config's activation_situ_linear_beta null)
struct GatedActivation {
  enum class Kind { kSilu, kSitu };
  Kind kind = Kind::kSilu;
  float beta = 0.0f;         // activation_situ_beta (SiTU)
  float linear_beta = 0.0f;  // activation_situ_linear_beta (SiTU); 0: no cap on u
};

HYSERVE_HOST_DEVICE inline float gated_activation(float g, float u, const GatedActivation& a) {
#ifdef __CUDA_ARCH__
  if (a.kind == GatedActivation::Kind::kSilu) return g / (1.0f + expf(-g)) * u;
  const float cap_u = a.linear_beta > 0.0f ? a.linear_beta * tanhf(u / a.linear_beta) : u;
  return a.beta * tanhf(g / a.beta) / (1.0f + expf(-g)) * cap_u;
#else
  if (a.kind == GatedActivation::Kind::kSilu) return g / (1.0f + std::exp(-g)) * u;
  const float cap_u = a.linear_beta > 0.0f ? a.linear_beta * std::tanh(u / a.linear_beta) : u;
  return a.beta * std::tanh(g / a.beta) / (1.0f + std::exp(-g)) * cap_u;
#endif
}

struct MlpParams {
  const float* x = nullptr;  // [num_tokens, D]
  const MlpWeights* w = nullptr;
  float* y = nullptr;  // [num_tokens, D]; may equal x
  int64_t num_tokens = 0;
  GatedActivation act;
  // LoRA adapters on gate / up / down (kernels/lora/params.h), added to each projection's
  // output for the tokens that have one; null: none.
  const MlpLora* lora = nullptr;
};

// Throws unless gate/up are [I, D] and down is [D, I] for one I.
namespace cpu {

// Its three linears as linear(.., gemm) computes them (kernels/linear/params.h).
void mlp(const MlpParams& p, CpuGemm gemm = CpuGemm::kReference);
void check_mlp_weights(const MlpWeights& w, int64_t hidden);
// Throws unless a SiTU activation has beta > 0 and linear_beta >= 0.
void check_gated_activation(const GatedActivation& a);

}  // namespace cpu
}  // namespace hyserve
