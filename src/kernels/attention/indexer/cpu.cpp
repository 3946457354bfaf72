// CPU reference of the DSA lightning indexer; see cpu.h and params.h.
#include "kernels/attention/indexer/cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention/indexer/check.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

constexpr float kMinAmax = 1e-4f;

int64_t num_blocks(int64_t dim) {
  return (dim + kIndexerFp8BlockSize - 1) / kIndexerFp8BlockSize;
}

// 2^ceil(log2(v)) for v > 0, exactly (no log2 rounding near powers of two).
float pow2_ceil(float v) {
  int exponent = 0;
  const float mantissa = std::frexp(v, &exponent);  // v = mantissa * 2^exponent, [0.5, 1)
  return std::ldexp(1.0f, mantissa == 0.5f ? exponent - 1 : exponent);
}

// Keys per tile of relu_scores: one tile's transposed keys ([d, kKeyTile] floats) stay in L1.
constexpr int64_t kKeyTile = 64;

// One query's tile of keys: out[j] = scale[j] * sum_h w[h] * max(sum_i q[h, i] * kt[i, j], 0)
// for j < n, every sum a left-to-right fp32 chain from 0.0f (the scalar reference's order:
// q.k over i, then the heads in order). The lanes are independent keys, so the compiler
// vectorizes over j without reordering any sum; the AVX2 clone is bitwise the default one
// (no FMA: every product is rounded before its add, as in the reference).
__attribute__((target_clones("avx2", "default"))) void relu_scores_tile(
    const float* q, const float* w, const float* kt, int64_t key_stride, const float* scale,
    int64_t num_heads, int64_t d, int64_t n, float* out) {
  float acc[kKeyTile];
  float qk[kKeyTile];
  for (int64_t j = 0; j < n; ++j) acc[j] = 0.0f;
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* qh = q + h * d;
    for (int64_t j = 0; j < n; ++j) qk[j] = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      const float qi = qh[i];
      const float* k_row = kt + i * key_stride;
      for (int64_t j = 0; j < n; ++j) qk[j] += qi * k_row[j];
    }
    const float wh = w[h];
    for (int64_t j = 0; j < n; ++j) acc[j] += wh * std::max(qk[j], 0.0f);
  }
  for (int64_t j = 0; j < n; ++j) out[j] = scale == nullptr ? acc[j] : scale[j] * acc[j];
}

// scores[t, s] = (k_scales[s] *) sum_h w[t, h] * relu(q[t, h] . k[s]) for s <= q_pos[t], -inf
// after; kt = the keys transposed, [d, num_keys].
void relu_scores(const float* q, const float* w, const float* kt, const float* k_scales,
                 const int64_t* q_pos, int64_t num_tokens, int64_t num_keys, int64_t num_heads,
                 int64_t d, float* scores) {
  parallel_for(num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = scores + t * num_keys;
      std::fill_n(row, num_keys, -std::numeric_limits<float>::infinity());
      const int64_t visible = std::min(q_pos[t], num_keys - 1) + 1;
      for (int64_t s0 = 0; s0 < visible; s0 += kKeyTile) {
        relu_scores_tile(q + t * num_heads * d, w + t * num_heads, kt + s0, num_keys,
                         k_scales == nullptr ? nullptr : k_scales + s0, num_heads, d,
                         std::min(kKeyTile, visible - s0), row + s0);
      }
    }
  });
}

std::vector<float> decode_e4m3(const uint8_t* codes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(codes[i]);
  return out;
}

}  // namespace

void hadamard_rotate(float* x, int64_t rows, int64_t dim) {
  validate(HadamardParams{.x = x, .rows = rows, .dim = dim});
  if (rows == 0) return;
  const float norm = 1.0f / std::sqrt(static_cast<float>(dim));
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          float* v = x + r * dim;
          for (int64_t half = 1; half < dim; half *= 2) {
            for (int64_t i = 0; i < dim; i += 2 * half) {
              for (int64_t j = i; j < i + half; ++j) {
                const float a = v[j], b = v[j + half];
                v[j] = a + b;
                v[j + half] = a - b;
              }
            }
          }
          for (int64_t j = 0; j < dim; ++j) v[j] *= norm;
        }
      },
      16);
}

void quantize_fp8_ue8m0(const float* x, int64_t rows, int64_t dim, uint8_t* q, float* scales) {
  validate(QuantizeFp8Ue8m0Params{.x = x, .rows = rows, .dim = dim, .q = q, .scales = scales});
  if (rows == 0) return;
  const int64_t blocks = num_blocks(dim);
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          for (int64_t b = 0; b < blocks; ++b) {
            const int64_t lo = b * kIndexerFp8BlockSize;
            const int64_t hi = std::min(dim, lo + kIndexerFp8BlockSize);
            float amax = 0.0f;
            for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[r * dim + i]));
            const float s = pow2_ceil(std::max(amax, kMinAmax) / kE4m3Max);
            scales[r * blocks + b] = s;
            for (int64_t i = lo; i < hi; ++i) {
              q[r * dim + i] = f32_to_e4m3(std::clamp(x[r * dim + i] / s, -kE4m3Max, kE4m3Max));
            }
          }
        }
      },
      16);
}

// Per-query block tables (batched decode): the queries one at a time, each with its table.
template <typename Params, typename Fn>
bool per_query_tables(const Params& p, Fn score) {
  if (p.table_stride == 0 || !p.k_pages.paged()) return false;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    Params one = p;
    one.q += t * p.num_heads * p.head_dim;
    one.head_weights += t * p.num_heads;
    one.q_pos += t;
    one.scores += t * p.num_keys;
    one.num_tokens = 1;
    one.k_pages = p.k_pages.for_query(t, p.table_stride);
    one.table_stride = 0;
    score(one);
  }
  return true;
}

void indexer_scores(const IndexerScoreParams& p) {
  validate(p);
  if (per_query_tables(p, [](const IndexerScoreParams& one) { indexer_scores(one); })) return;
  if (p.num_tokens == 0) return;
  if (p.fp8) {
    std::vector<float> k(static_cast<size_t>(p.num_keys * p.head_dim));
    for (int64_t s = 0; s < p.num_keys; ++s) {
      std::copy_n(p.k_pages.row(p.k, s, p.head_dim), p.head_dim, &k[s * p.head_dim]);
    }
    std::vector<uint8_t> k_fp8(static_cast<size_t>(p.num_keys * p.head_dim));
    std::vector<float> k_scales(static_cast<size_t>(p.num_keys));
    quantize_fp8_ue8m0(k.data(), p.num_keys, p.head_dim, k_fp8.data(), k_scales.data());
    indexer_scores_fp8_cache({.q = p.q,
                              .k_fp8 = k_fp8.data(),
                              .k_scales = k_scales.data(),
                              .k_pages = {},
                              .head_weights = p.head_weights,
                              .q_pos = p.q_pos,
                              .scores = p.scores,
                              .num_tokens = p.num_tokens,
                              .num_keys = p.num_keys,
                              .num_heads = p.num_heads,
                              .head_dim = p.head_dim});
    return;
  }
  const int64_t d = p.head_dim;
  std::vector<float> kt(static_cast<size_t>(d * p.num_keys));  // [d, num_keys]
  parallel_for(
      p.num_keys,
      [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; ++s) {
          const float* k = p.k_pages.row(p.k, s, d);
          for (int64_t i = 0; i < d; ++i) kt[i * p.num_keys + s] = k[i];
        }
      },
      512);
  relu_scores(p.q, p.head_weights, kt.data(), nullptr, p.q_pos, p.num_tokens, p.num_keys,
              p.num_heads, d, p.scores);
}

void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p) {
  validate(p);
  if (per_query_tables(
          p, [](const IndexerFp8CacheScoreParams& one) { indexer_scores_fp8_cache(one); })) {
    return;
  }
  if (p.num_tokens == 0) return;
  const int64_t d = p.head_dim;
  const int64_t num_q_rows = p.num_tokens * p.num_heads;
  std::vector<uint8_t> q_fp8(static_cast<size_t>(num_q_rows * d));
  std::vector<float> q_scales(static_cast<size_t>(num_q_rows));
  quantize_fp8_ue8m0(p.q, num_q_rows, d, q_fp8.data(), q_scales.data());
  const std::vector<float> q8 = decode_e4m3(q_fp8.data(), num_q_rows * d);
  std::vector<float> k8t(static_cast<size_t>(d * p.num_keys));  // [d, num_keys]
  std::vector<float> k_scales(static_cast<size_t>(p.num_keys));
  parallel_for(
      p.num_keys,
      [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; ++s) {
          const uint8_t* codes = p.k_pages.row(p.k_fp8, s, d);
          for (int64_t i = 0; i < d; ++i) k8t[i * p.num_keys + s] = e4m3_to_f32(codes[i]);
          k_scales[s] = *p.k_pages.row(p.k_scales, s, 1);
        }
      },
      512);
  // Head weight with the query's scale folded in, as the reference's fp8_index takes it.
  std::vector<float> wq(static_cast<size_t>(num_q_rows));
  for (int64_t i = 0; i < num_q_rows; ++i) wq[i] = p.head_weights[i] * q_scales[i];
  relu_scores(q8.data(), wq.data(), k8t.data(), k_scales.data(), p.q_pos, p.num_tokens, p.num_keys,
              p.num_heads, d, p.scores);
}

void causal_topk(const float* scores, const int64_t* q_pos, int64_t T, int64_t S, int64_t topk,
                 int32_t* out) {
  validate(CausalTopkParams{
      .scores = scores, .q_pos = q_pos, .num_queries = T, .num_keys = S, .topk = topk, .out = out});
  if (T == 0) return;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t num_visible = std::clamp<int64_t>(q_pos[t] + 1, 0, S);
    for (int64_t s = 0; s < num_visible; ++s) {
      CHECK(!std::isnan(scores[t * S + s]), "causal_topk: NaN score at query ", t, ", key ", s);
    }
  }
  parallel_for(T, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> keys;
    for (int64_t t = begin; t < end; ++t) {
      const float* row = scores + t * S;
      const int64_t num_visible = std::clamp<int64_t>(q_pos[t] + 1, 0, S);
      const int64_t keep = std::min(topk, num_visible);
      keys.resize(static_cast<size_t>(num_visible));
      for (int64_t s = 0; s < num_visible; ++s) keys[s] = static_cast<int32_t>(s);
      std::partial_sort(keys.begin(), keys.begin() + keep, keys.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      std::sort(keys.begin(), keys.begin() + keep);
      int32_t* dst = out + t * topk;
      std::copy_n(keys.begin(), keep, dst);
      std::fill(dst + keep, dst + topk, -1);
    }
  });
}

}  // namespace hyserve::cpu
