// CPU reference for the gated MLP: three linear calls around an elementwise
// silu(gate) * up. Batch invariant because linear is.
#include <cmath>
#include <vector>

#include "kernels/linear/params.h"
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

void mlp(const MlpParams& p) {
  CHECK(p.x != nullptr && p.w != nullptr && p.y != nullptr, "mlp: null pointer");
  CHECK(p.num_tokens >= 0, "mlp: num_tokens ", p.num_tokens);
  const int64_t hidden = p.w->down.rows;
  check_mlp_weights(*p.w, hidden);
  if (p.num_tokens == 0) return;
  const int64_t inter = p.w->gate.rows;
  const int64_t n = p.num_tokens * inter;
  std::vector<float> gate(n);  // [T, I]
  std::vector<float> up(n);    // [T, I]
  linear({.x = p.x, .w = &p.w->gate, .y = gate.data(), .num_tokens = p.num_tokens});
  linear({.x = p.x, .w = &p.w->up, .y = up.data(), .num_tokens = p.num_tokens});
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = gate[i];
          gate[i] = g / (1.0f + std::exp(-g)) * up[i];
        }
      },
      4096);
  linear({.x = gate.data(), .w = &p.w->down, .y = p.y, .num_tokens = p.num_tokens});
}

}  // namespace hyserve::cpu
