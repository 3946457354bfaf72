// CPU attention merge; see cpu.h and params.h.
#include "kernels/attention/merge/cpu.h"

#include <cmath>
#include <limits>

#include "kernels/attention/merge/check.h"
#include "util/parallel.h"

namespace hyserve::cpu {

void attention_merge(const AttentionMergeParams& p) {
  validate(p);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto merge_row = [&](int64_t r) {
    float m = neg_inf;
    for (int64_t j = 0; j < p.num_parts; ++j) m = std::fmax(m, p.lses[j * p.rows + r]);
    float* out = p.out + r * p.width;
    if (m == neg_inf) {
      for (int64_t c = 0; c < p.width; ++c) out[c] = 0.0f;
      if (p.lse) p.lse[r] = neg_inf;
      return;
    }
    float sum = 0.0f;
    for (int64_t c = 0; c < p.width; ++c) out[c] = 0.0f;
    for (int64_t j = 0; j < p.num_parts; ++j) {
      const float w = std::exp(p.lses[j * p.rows + r] - m);
      sum += w;
      const float* part = p.parts + (j * p.rows + r) * p.width;
      for (int64_t c = 0; c < p.width; ++c) out[c] += w * part[c];
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < p.width; ++c) out[c] *= inv;
    if (p.lse) p.lse[r] = m + std::log(sum);
  };
  parallel_for(
      p.rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) merge_row(r);
      },
      16);
}

}  // namespace hyserve::cpu
