// CPU reference for the gated MLP: three linear calls around the elementwise gated
// activation (silu(gate) * up or SiTU), each with its LoRA adapters when given. Batch invariant
// when linear is (CpuGemm::kReference).
#include <cmath>
#include <vector>

#include "kernels/linear/params.h"
#include "kernels/lora/params.h"
#include "kernels/mlp/params.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {

void check_mlp_weights(const MlpWeights& w, int64_t hidden) {
  CHECK(!w.gate.empty() && !w.up.empty() && !w.down.empty(), "mlp: missing weight");
  const int64_t inter = w.gate.rows;
  CHECK(w.gate.cols == hidden && w.up.rows == inter && w.up.cols == hidden, "mlp: gate [",
        w.gate.rows, ", ", w.gate.cols, "] and up [", w.up.rows, ", ", w.up.cols,
        "] must both be [I, ", hidden, "]");
  CHECK(w.down.rows == hidden && w.down.cols == inter, "mlp: down [", w.down.rows, ", ",
        w.down.cols, "] must be [", hidden, ", ", inter, "]");
}

void check_gated_activation(const GatedActivation& a) {
  if (a.kind == GatedActivation::Kind::kSilu) return;
  CHECK(a.beta > 0.0f && std::isfinite(a.beta) && a.linear_beta >= 0.0f &&
            std::isfinite(a.linear_beta),
        "mlp: SiTU needs beta > 0 and linear_beta >= 0, got ", a.beta, " and ", a.linear_beta);
}

void mlp(const MlpParams& p, CpuGemm gemm) {
  CHECK(p.x != nullptr && p.w != nullptr && p.y != nullptr, "mlp: null pointer");
  CHECK(p.num_tokens >= 0, "mlp: num_tokens ", p.num_tokens);
  const int64_t hidden = p.w->down.rows;
  check_mlp_weights(*p.w, hidden);
  check_gated_activation(p.act);
  if (p.num_tokens == 0) return;
  const int64_t inter = p.w->gate.rows;
  const int64_t n = p.num_tokens * inter;
  std::vector<float> gate(n);  // [T, I]
  std::vector<float> up(n);    // [T, I]
  linear({.x = p.x, .w = &p.w->gate, .y = gate.data(), .num_tokens = p.num_tokens}, gemm);
  linear({.x = p.x, .w = &p.w->up, .y = up.data(), .num_tokens = p.num_tokens}, gemm);
  const int64_t t = p.num_tokens;
  auto add_lora = [&](const LoraModule& m, const float* x, float* y, int64_t in, int64_t out) {
    if (p.lora != nullptr && !m.empty()) lora_add({x, y, t, in, out, p.lora->token_slots, m});
  };
  if (p.lora != nullptr) {
    add_lora(p.lora->gate, p.x, gate.data(), hidden, inter);
    add_lora(p.lora->up, p.x, up.data(), hidden, inter);
  }
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          gate[i] = gated_activation(gate[i], up[i], p.act);
        }
      },
      4096);
  linear({.x = gate.data(), .w = &p.w->down, .y = p.y, .num_tokens = p.num_tokens}, gemm);
  if (p.lora != nullptr) add_lora(p.lora->down, gate.data(), p.y, inter, hidden);
}

}  // namespace hyserve::cpu
