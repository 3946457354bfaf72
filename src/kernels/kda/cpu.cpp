// CPU reference of the KDA ops (MODEL.md §4): fp32, one plain loop nest per op,
// parallel over channels (conv), rows (gate, norms) or heads (recurrence). Every
// output element is computed by one thread in a fixed order, so results do not
// depend on the thread count or on how a request's tokens are split into calls.
#include "kernels/kda/cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kda/check.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

constexpr float kSoftplusThreshold = 20.0f;
constexpr float kL2NormEps = 1e-6f;

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

float silu(float x) {
  return x * sigmoid(x);
}

float softplus(float x) {
  return x > kSoftplusThreshold ? x : std::log1p(std::exp(x));
}

// Row pointers of one head in the [T, H, D] token tensors.
struct HeadView {
  const KdaParams& p;
  int64_t h;
  int64_t row(int64_t t) const { return (t * p.num_heads + h) * p.head_dim; }
  const float* q(int64_t t) const { return p.q + row(t); }
  const float* k(int64_t t) const { return p.k + row(t); }
  const float* v(int64_t t) const { return p.v + row(t); }
  const float* g(int64_t t) const { return p.g + row(t); }
  float beta(int64_t t) const { return p.beta[t * p.num_heads + h]; }
  float* o(int64_t t) const { return p.o + row(t); }
  float* state() const { return p.state + h * p.head_dim * p.head_dim; }
};

// One token of the delta rule on one head's state s [K, V]; kv is scratch [V].
void recurrent_token(float* s, const float* q, const float* k, const float* v, const float* g,
                     float beta, float* o, int64_t dk, int64_t dv, float* kv) {
  for (int64_t d = 0; d < dk; ++d) {
    const float decay = std::exp(g[d]);
    for (int64_t e = 0; e < dv; ++e) s[d * dv + e] *= decay;
  }
  std::fill(kv, kv + dv, 0.0f);
  for (int64_t d = 0; d < dk; ++d) {
    for (int64_t e = 0; e < dv; ++e) kv[e] += k[d] * s[d * dv + e];
  }
  for (int64_t e = 0; e < dv; ++e) kv[e] = beta * (v[e] - kv[e]);
  for (int64_t d = 0; d < dk; ++d) {
    for (int64_t e = 0; e < dv; ++e) s[d * dv + e] += k[d] * kv[e];
  }
  std::fill(o, o + dv, 0.0f);
  for (int64_t d = 0; d < dk; ++d) {
    for (int64_t e = 0; e < dv; ++e) o[e] += q[d] * s[d * dv + e];
  }
}

// One head over all tokens, token by token.
void recurrent_head(const HeadView& hv, std::vector<float>& kv) {
  for (int64_t t = 0; t < hv.p.num_tokens; ++t) {
    recurrent_token(hv.state(), hv.q(t), hv.k(t), hv.v(t), hv.g(t), hv.beta(t), hv.o(t),
                    hv.p.head_dim, hv.p.head_dim, kv.data());
  }
}

// One channel of the conv + SiLU over num_tokens inputs x(t), carrying its conv state
// (state[r * state_stride], r < W-1); y(t) receives the outputs.
template <class Input, class Output>
void conv_channel(const float* w, int64_t width, float* state, int64_t state_stride,
                  int64_t num_tokens, const Input& x, const Output& y) {
  const int64_t num_state = width - 1;
  // Input at time `src` (negative: from the state).
  auto input = [&](int64_t src) {
    return src < 0 ? state[(num_state + src) * state_stride] : x(src);
  };
  for (int64_t t = 0; t < num_tokens; ++t) {
    float acc = 0.0f;
    for (int64_t i = 0; i < width; ++i) acc += w[i] * input(t - num_state + i);
    y(t, silu(acc));
  }
  // Row r becomes the input at time T - (W-1) + r; a state source row (T + r) is never
  // below r, so ascending r reads rows not yet rewritten.
  for (int64_t r = 0; r < num_state; ++r) {
    state[r * state_stride] = input(num_tokens - num_state + r);
  }
}

// The log-decay of one channel from x = f + dt_bias and a = exp(a_log[h]).
float gate_value(float x, float a, float lower_bound) {
  return lower_bound < 0.0f ? lower_bound / (1.0f + std::exp(-a * x)) : -a * softplus(x);
}

void l2norm_row(float* row, int64_t dim, float scale) {
  float sum_sq = 0.0f;
  for (int64_t d = 0; d < dim; ++d) sum_sq += row[d] * row[d];
  const float factor = scale / std::sqrt(sum_sq + kL2NormEps);
  for (int64_t d = 0; d < dim; ++d) row[d] *= factor;
}

void gated_norm_row(const float* o, const float* gate, const float* weight, float* y, int64_t dim,
                    float eps) {
  float sum_sq = 0.0f;
  for (int64_t e = 0; e < dim; ++e) sum_sq += o[e] * o[e];
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t e = 0; e < dim; ++e) y[e] = o[e] * inv_rms * weight[e] * sigmoid(gate[e]);
}

// Scratch of one chunk of n <= chunk_size tokens (row-major, rows = tokens).
struct ChunkScratch {
  std::vector<double> cum_g;  // [n, K] G: inclusive cumsum of g within the chunk
  std::vector<float> a;       // [n, n] L, then A = (I+L)^-1 diag(beta)
  std::vector<float> a_qk;    // [n, n] Aqk, lower triangle with the diagonal
  std::vector<float> w;       // [n, K] W = A (exp(G) * K)
  std::vector<float> u;       // [n, V] U = A V, then V' = U - W S
  std::vector<float> inv;     // [n, n] (I+L)^-1

  ChunkScratch(int64_t chunk_size, int64_t dim)
      : cum_g(chunk_size * dim),
        a(chunk_size * chunk_size),
        a_qk(chunk_size * chunk_size),
        w(chunk_size * dim),
        u(chunk_size * dim),
        inv(chunk_size * chunk_size) {}
};

// One chunk [t0, t0+n) of one head, MODEL.md §4.6. Reads and updates the head's S.
void chunk_step(const HeadView& hv, int64_t t0, int64_t n, ChunkScratch& sc) {
  const int64_t dk = hv.p.head_dim;
  const int64_t dv = hv.p.head_dim;
  float* s = hv.state();
  double* cum_g = sc.cum_g.data();
  float* a = sc.a.data();
  float* a_qk = sc.a_qk.data();
  float* w = sc.w.data();
  float* u = sc.u.data();
  float* inv = sc.inv.data();

  // G is summed in double: in fp32, after a run of strongly decaying gates |G| is large
  // (e.g. 32 x -20 = -640, ulp 6e-5) and the small gates that follow lose their low bits,
  // so G_c - G_j would be off by ~1e-3 where exp(G_c - G_j) is still near 1. Each
  // exponent is rounded to fp32 only after the subtraction.
  for (int64_t c = 0; c < n; ++c) {
    const float* g = hv.g(t0 + c);
    for (int64_t d = 0; d < dk; ++d) {
      cum_g[c * dk + d] = (c == 0 ? 0.0 : cum_g[(c - 1) * dk + d]) + g[d];
    }
  }

  // L[c,j] = beta_c * sum_d k_c k_j exp(G_c - G_j) (c > j) and
  // Aqk[c,j] = sum_d q_c k_j exp(G_c - G_j) (c >= j): both only use exp of <= 0.
  for (int64_t c = 0; c < n; ++c) {
    const float* q = hv.q(t0 + c);
    const float* kc = hv.k(t0 + c);
    const double* gc = cum_g + c * dk;
    for (int64_t j = 0; j <= c; ++j) {
      const float* kj = hv.k(t0 + j);
      const double* gj = cum_g + j * dk;
      float kk = 0.0f;
      float qk = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float decay = std::exp(static_cast<float>(gc[d] - gj[d]));
        kk += kc[d] * kj[d] * decay;
        qk += q[d] * kj[d] * decay;
      }
      a[c * n + j] = j < c ? hv.beta(t0 + c) * kk : 0.0f;
      a_qk[c * n + j] = qk;
    }
  }

  // (I+L)^-1 by forward substitution on the unit lower-triangular system, row by row:
  // inv[c,j] = [c == j] - sum_{j <= i < c} L[c,i] inv[i,j].
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t j = 0; j < c; ++j) {
      float acc = 0.0f;
      for (int64_t i = j; i < c; ++i) acc += a[c * n + i] * inv[i * n + j];
      inv[c * n + j] = -acc;
    }
    inv[c * n + c] = 1.0f;
  }
  // A = (I+L)^-1 diag(beta).
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t j = 0; j <= c; ++j) a[c * n + j] = inv[c * n + j] * hv.beta(t0 + j);
  }

  // W = A (exp(G) * K), U = A V.
  for (int64_t c = 0; c < n; ++c) {
    float* wc = w + c * dk;
    float* uc = u + c * dv;
    std::fill(wc, wc + dk, 0.0f);
    std::fill(uc, uc + dv, 0.0f);
    for (int64_t j = 0; j <= c; ++j) {
      const float acj = a[c * n + j];
      const float* kj = hv.k(t0 + j);
      const float* vj = hv.v(t0 + j);
      const double* gj = cum_g + j * dk;
      for (int64_t d = 0; d < dk; ++d) wc[d] += acj * std::exp(static_cast<float>(gj[d])) * kj[d];
      for (int64_t e = 0; e < dv; ++e) uc[e] += acj * vj[e];
    }
  }

  // V' = U - W S (in place in u).
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t d = 0; d < dk; ++d) {
      const float wcd = w[c * dk + d];
      for (int64_t e = 0; e < dv; ++e) u[c * dv + e] -= wcd * s[d * dv + e];
    }
  }

  // O = (Q * exp(G)) S + Aqk V'.
  for (int64_t c = 0; c < n; ++c) {
    const float* q = hv.q(t0 + c);
    const double* gc = cum_g + c * dk;
    float* o = hv.o(t0 + c);
    std::fill(o, o + dv, 0.0f);
    for (int64_t d = 0; d < dk; ++d) {
      const float qd = q[d] * std::exp(static_cast<float>(gc[d]));
      for (int64_t e = 0; e < dv; ++e) o[e] += qd * s[d * dv + e];
    }
    for (int64_t j = 0; j <= c; ++j) {
      const float aqk = a_qk[c * n + j];
      for (int64_t e = 0; e < dv; ++e) o[e] += aqk * u[j * dv + e];
    }
  }

  // S = diag(exp(G_last)) S + (exp(G_last - G) * K)^T V'.
  const double* g_last = cum_g + (n - 1) * dk;
  for (int64_t d = 0; d < dk; ++d) {
    float* sd = s + d * dv;
    const float decay = std::exp(static_cast<float>(g_last[d]));
    for (int64_t e = 0; e < dv; ++e) sd[e] *= decay;
    for (int64_t j = 0; j < n; ++j) {
      const float kjd =
          hv.k(t0 + j)[d] * std::exp(static_cast<float>(g_last[d] - cum_g[j * dk + d]));
      for (int64_t e = 0; e < dv; ++e) sd[e] += kjd * u[j * dv + e];
    }
  }
}

}  // namespace

void short_conv_silu(const ShortConvParams& p) {
  CHECK(p.num_tokens >= 0, "short_conv_silu: num_tokens = ", p.num_tokens);
  CHECK(p.channels > 0, "short_conv_silu: channels = ", p.channels);
  CHECK(p.kernel_size > 0, "short_conv_silu: kernel_size = ", p.kernel_size);
  CHECK(p.kernel_size == 1 || p.conv_state != nullptr, "short_conv_silu: null conv_state");
  if (p.num_tokens == 0) return;
  CHECK(p.x != nullptr && p.weight != nullptr && p.y != nullptr,
        "short_conv_silu: null x, weight or y");
  CHECK(p.x != p.y, "short_conv_silu: y must not alias x");

  const int64_t num_channels = p.channels;
  parallel_for(
      num_channels,
      [&](int64_t c_begin, int64_t c_end) {
        for (int64_t c = c_begin; c < c_end; ++c) {
          conv_channel(
              p.weight + c * p.kernel_size, p.kernel_size,
              p.conv_state == nullptr ? nullptr : p.conv_state + c, num_channels, p.num_tokens,
              [&](int64_t t) { return p.x[t * num_channels + c]; },
              [&](int64_t t, float y) { p.y[t * num_channels + c] = y; });
        }
      },
      64);
}

void kda_gate(const KdaGateParams& p) {
  CHECK(p.num_tokens >= 0, "kda_gate: num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, "kda_gate: num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, "kda_gate: head_dim = ", p.head_dim);
  if (p.num_tokens == 0) return;
  CHECK(p.f != nullptr && p.dt_bias != nullptr && p.a_log != nullptr && p.g != nullptr,
        "kda_gate: null f, dt_bias, a_log or g");
  CHECK(p.lower_bound <= 0.0f && std::isfinite(p.lower_bound),
        "kda_gate: lower_bound = ", p.lower_bound,
        " (0: the softplus gate; < 0: the bounded gate)");

  const int64_t width = p.num_heads * p.head_dim;
  parallel_for(
      p.num_tokens,
      [&](int64_t t_begin, int64_t t_end) {
        for (int64_t t = t_begin; t < t_end; ++t) {
          for (int64_t h = 0; h < p.num_heads; ++h) {
            const float a = std::exp(p.a_log[h]);
            for (int64_t d = 0; d < p.head_dim; ++d) {
              const int64_t i = h * p.head_dim + d;
              p.g[t * width + i] = gate_value(p.f[t * width + i] + p.dt_bias[i], a, p.lower_bound);
            }
          }
        }
      },
      16);
}

void l2norm_rows(float* x, int64_t rows, int64_t dim, float scale) {
  CHECK(rows >= 0, "l2norm_rows: rows = ", rows);
  CHECK(dim > 0, "l2norm_rows: dim = ", dim);
  if (rows == 0) return;
  CHECK(x != nullptr, "l2norm_rows: null x");

  parallel_for(
      rows,
      [&](int64_t r_begin, int64_t r_end) {
        for (int64_t r = r_begin; r < r_end; ++r) l2norm_row(x + r * dim, dim, scale);
      },
      16);
}

void kda_recurrent(const KdaParams& p) {
  check_kda_params(p, "kda_recurrent");
  if (p.num_tokens == 0) return;
  parallel_for(p.num_heads, [&](int64_t h_begin, int64_t h_end) {
    std::vector<float> kv(p.head_dim);
    for (int64_t h = h_begin; h < h_end; ++h) recurrent_head(HeadView{p, h}, kv);
  });
}

void kda_chunked(const KdaParams& p, int64_t chunk_size) {
  check_kda_params(p, "kda_chunked");
  CHECK(chunk_size > 0, "kda_chunked: chunk_size = ", chunk_size);
  if (p.num_tokens == 0) return;
  parallel_for(p.num_heads, [&](int64_t h_begin, int64_t h_end) {
    ChunkScratch scratch(chunk_size, p.head_dim);
    for (int64_t h = h_begin; h < h_end; ++h) {
      for (int64_t t0 = 0; t0 < p.num_tokens; t0 += chunk_size) {
        chunk_step(HeadView{p, h}, t0, std::min(chunk_size, p.num_tokens - t0), scratch);
      }
    }
  });
}

void gated_rms_norm(const GatedRmsNormParams& p) {
  CHECK(p.num_tokens >= 0, "gated_rms_norm: num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0, "gated_rms_norm: num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0, "gated_rms_norm: head_dim = ", p.head_dim);
  CHECK(p.eps >= 0.0f, "gated_rms_norm: eps = ", p.eps);
  if (p.num_tokens == 0) return;
  CHECK(p.o != nullptr && p.weight != nullptr && p.gate != nullptr && p.y != nullptr,
        "gated_rms_norm: null o, weight, gate or y");

  const int64_t dim = p.head_dim;
  parallel_for(
      p.num_tokens * p.num_heads,
      [&](int64_t r_begin, int64_t r_end) {
        for (int64_t r = r_begin; r < r_end; ++r) {
          gated_norm_row(p.o + r * dim, p.gate + r * dim, p.weight, p.y + r * dim, dim, p.eps);
        }
      },
      16);
}

void kda_decode(const KdaDecodeParams& p) {
  check_kda_decode_params(p);
  if (p.num_rows == 0 || p.num_tokens == 0) return;
  const int64_t heads = p.num_heads, dim = p.head_dim, width = heads * dim;
  const int64_t conv_rows = p.kernel_size - 1;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  parallel_for(p.num_rows * heads, [&](int64_t begin, int64_t end) {
    // One (request, head): its q, k, v after the conv, g, beta and o, token by token.
    // Without write_state the states are copied here and the copies advanced.
    std::vector<float> qkv, g, beta, o(dim), kv(dim), conv_copy, state_copy;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / heads, h = i % heads;
      const int64_t t0 = kda_decode_first_token(p, r), n = kda_decode_row_tokens(p, r);
      if (n == 0) continue;
      qkv.resize(3 * n * dim);
      g.resize(n * dim);
      beta.resize(n);
      const float* raw[3] = {p.q, p.k, p.v};
      for (int which = 0; which < 3; ++which) {
        float* state =
            p.kernel_size == 1
                ? nullptr
                : reinterpret_cast<float*>(kda_decode_row(p, p.conv_state[which], r)) + h * dim;
        int64_t stride = width;
        if (state != nullptr && !p.write_state) {
          conv_copy.resize(conv_rows * dim);
          for (int64_t j = 0; j < conv_rows; ++j) {
            std::copy_n(state + j * width, dim, conv_copy.data() + j * dim);
          }
          state = conv_copy.data();
          stride = dim;
        }
        for (int64_t c = 0; c < dim; ++c) {
          const int64_t ch = h * dim + c;
          float* out = qkv.data() + which * n * dim;
          conv_channel(
              p.conv_weight[which] + ch * p.kernel_size, p.kernel_size,
              state == nullptr ? nullptr : state + c, stride, n,
              [&](int64_t t) { return raw[which][(t0 + t) * width + ch]; },
              [&](int64_t t, float y) { out[t * dim + c] = y; });
        }
      }
      float* q = qkv.data();
      float* k = q + n * dim;
      float* v = k + n * dim;
      const float a = std::exp(p.a_log[h]);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t tok = t0 + t;
        for (int64_t c = 0; c < dim; ++c) {
          const int64_t ch = h * dim + c;
          g[t * dim + c] = gate_value(p.f[tok * width + ch] + p.dt_bias[ch], a, p.lower_bound);
        }
        beta[t] = sigmoid(p.b[tok * heads + h]);
        l2norm_row(q + t * dim, dim, q_scale);
        l2norm_row(k + t * dim, dim, 1.0f);
      }
      float* s = reinterpret_cast<float*>(kda_decode_row(p, p.state, r)) + h * dim * dim;
      if (!p.write_state) {
        state_copy.assign(s, s + dim * dim);
        s = state_copy.data();
      }
      for (int64_t t = 0; t < n; ++t) {
        const int64_t tok = t0 + t;
        recurrent_token(s, q + t * dim, k + t * dim, v + t * dim, g.data() + t * dim, beta[t],
                        o.data(), dim, dim, kv.data());
        if (p.y == nullptr) continue;
        gated_norm_row(o.data(), p.gate + tok * width + h * dim, p.o_norm,
                       p.y + tok * width + h * dim, dim, p.eps);
      }
    }
  });
}

}  // namespace hyserve::cpu
