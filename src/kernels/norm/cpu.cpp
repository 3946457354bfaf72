// CPU reference for RMSNorm, LayerNorm and the AttnRes mix + RMSNorm: row statistics
// accumulated in double, the per-element scaling in fp32. Rows run in parallel; each row is
// computed by one thread in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

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

void attn_res_norm(const AttnResNormParams& p) {
  CHECK(p.num_tokens >= 0 && p.num_snapshots >= 0, "attn_res_norm: num_tokens ", p.num_tokens,
        ", num_snapshots ", p.num_snapshots);
  if (p.num_tokens == 0) return;
  CHECK(p.current != nullptr && p.query != nullptr && p.norm_weight != nullptr && p.y != nullptr &&
            (p.num_snapshots == 0 || p.snapshots != nullptr),
        "attn_res_norm: null pointer");
  CHECK(p.dim > 0, "attn_res_norm: dim ", p.dim);
  CHECK(p.num_snapshots == 0 || p.snapshot_stride >= p.num_tokens * p.dim,
        "attn_res_norm: snapshot_stride ", p.snapshot_stride, " < num_tokens * dim");
  CHECK(p.res_eps >= 0.0f && p.norm_eps >= 0.0f, "attn_res_norm: eps ", p.res_eps, ", ",
        p.norm_eps);
  const int64_t dim = p.dim, n = p.num_snapshots + 1;
  parallel_for(
      p.num_tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<const float*> v(static_cast<size_t>(n));
        std::vector<float> score(static_cast<size_t>(n));
        std::vector<float> mix(static_cast<size_t>(dim));
        for (int64_t t = begin; t < end; ++t) {
          for (int64_t i = 0; i < p.num_snapshots; ++i)
            v[i] = p.snapshots + i * p.snapshot_stride + t * dim;
          v[n - 1] = p.current + t * dim;
          // s_i = rmsnorm(v_i) . query
          float max_score = -INFINITY;
          for (int64_t i = 0; i < n; ++i) {
            double sum_sq = 0.0, dot = 0.0;
            for (int64_t d = 0; d < dim; ++d) {
              sum_sq += static_cast<double>(v[i][d]) * v[i][d];
              dot += static_cast<double>(v[i][d]) * p.query[d];
            }
            score[i] = static_cast<float>(dot / std::sqrt(sum_sq / dim + p.res_eps));
            max_score = std::max(max_score, score[i]);
          }
          // softmax over the candidates, then the mix of the raw candidates.
          double total = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            score[i] = std::exp(score[i] - max_score);
            total += score[i];
          }
          std::fill(mix.begin(), mix.end(), 0.0f);
          for (int64_t i = 0; i < n; ++i) {
            const auto alpha = static_cast<float>(score[i] / total);
            for (int64_t d = 0; d < dim; ++d) mix[d] += alpha * v[i][d];
          }
          double sum_sq = 0.0;
          for (int64_t d = 0; d < dim; ++d) sum_sq += static_cast<double>(mix[d]) * mix[d];
          const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + p.norm_eps));
          float* y = p.y + t * dim;
          for (int64_t d = 0; d < dim; ++d) y[d] = mix[d] * inv_rms * p.norm_weight[d];
        }
      },
      4);
}

}  // namespace hyserve::cpu
