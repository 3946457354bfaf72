// CPU reference for RMSNorm and LayerNorm: row statistics accumulated in double,
// the per-element scaling in fp32. Rows run in parallel; each row is computed by
// one thread in a fixed order, so results do not depend on the thread count.
#include <cmath>

#include "kernels/norm/params.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {

void rms_norm(const RmsNormParams& p) {
  CHECK(p.num_rows >= 0, "rms_norm: num_rows ", p.num_rows);
  if (p.num_rows == 0) return;
  CHECK(p.x != nullptr && p.weight != nullptr && p.y != nullptr, "rms_norm: null pointer");
  CHECK(p.dim > 0, "rms_norm: dim ", p.dim);
  CHECK(p.eps >= 0.0f, "rms_norm: eps ", p.eps);
  const int64_t dim = p.dim;
  parallel_for(
      p.num_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* x = p.x + r * dim;
          float* y = p.y + r * dim;
          double sum_sq = 0.0;
          for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
          const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + p.eps));
          for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * inv_rms * p.weight[i];
        }
      },
      16);
}

void layer_norm(const LayerNormParams& p) {
  CHECK(p.num_rows >= 0, "layer_norm: num_rows ", p.num_rows);
  if (p.num_rows == 0) return;
  CHECK(p.x != nullptr && p.weight != nullptr && p.bias != nullptr && p.y != nullptr,
        "layer_norm: null pointer");
  CHECK(p.dim > 0, "layer_norm: dim ", p.dim);
  CHECK(p.eps >= 0.0f, "layer_norm: eps ", p.eps);
  const int64_t dim = p.dim;
  parallel_for(
      p.num_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* x = p.x + r * dim;
          float* y = p.y + r * dim;
          double sum = 0.0;
          for (int64_t i = 0; i < dim; ++i) sum += x[i];
          const double mean = sum / dim;
          double sum_sq = 0.0;
          for (int64_t i = 0; i < dim; ++i) sum_sq += (x[i] - mean) * (x[i] - mean);
          const float inv_std = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + p.eps));
          const float mean_f = static_cast<float>(mean);
          for (int64_t i = 0; i < dim; ++i)
            y[i] = (x[i] - mean_f) * inv_std * p.weight[i] + p.bias[i];
        }
      },
      16);
}

}  // namespace hyserve::cpu
