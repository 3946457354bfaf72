// CPU reference of the LoRA add: per token, u = x A^T (rank dot products over `in`, in
// order), then y += scale * (u B^T) (out dot products over rank, in order).
#include <vector>

#include "kernels/lora/params.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {

void lora_add(const LoraParams& p) {
  CHECK(p.x != nullptr && p.y != nullptr && p.token_slots != nullptr, "lora_add: null pointer");
  CHECK(!p.module.empty() && p.num_tokens >= 0 && p.in > 0 && p.out > 0, "lora_add: in ", p.in,
        ", out ", p.out, ", tokens ", p.num_tokens);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int32_t s = p.token_slots[t];
    CHECK(s >= -1 && s < p.module.num_slots, "lora_add: token ", t, " has adapter slot ", s, " of ",
          p.module.num_slots);
  }
  parallel_for(p.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> u;
    for (int64_t t = begin; t < end; ++t) {
      const int32_t s = p.token_slots[t];
      if (s < 0 || p.module.slots[s].empty()) continue;
      const LoraMatrices& m = p.module.slots[s];
      const float* x = p.x + t * p.in;
      u.assign(static_cast<size_t>(m.rank), 0.0f);
      for (int64_t r = 0; r < m.rank; ++r) {
        const float* a = m.a + r * p.in;
        float acc = 0.0f;
        for (int64_t i = 0; i < p.in; ++i) acc += x[i] * a[i];
        u[r] = acc;
      }
      float* y = p.y + t * p.out;
      for (int64_t o = 0; o < p.out; ++o) {
        const float* b = m.b + o * m.rank;
        float acc = 0.0f;
        for (int64_t r = 0; r < m.rank; ++r) acc += b[r] * u[r];
        y[o] += m.scale * acc;
      }
    }
  });
}

}  // namespace hyserve::cpu
