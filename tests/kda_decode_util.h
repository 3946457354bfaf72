// A batch for the fused KDA decode (KdaDecodeParams) and its definition: the separate
// KDA ops run on each request, one after the other. Shared by the CPU test
// (kda_decode_test.cpp) and the GPU test (gpu/kda_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/kda/cpu.h"
#include "kernels/kda/params.h"

namespace hyserve::test {

// Requests with the given token counts, their states in cache rows spread over a pool
// of 2B + 1 rows (rows no request names must stay as they were), and every input of
// the layer's core: raw projections, gate inputs with strongly negative decays among
// them, conv weights and a nonzero state in every row.
struct KdaDecodeBatch {
  int64_t heads = 0, dim = 0, taps = 0;
  float lower_bound = 0.0f, eps = 1e-5f;
  std::vector<int32_t> offsets;     // [B + 1]
  std::vector<int32_t> state_rows;  // [B]
  std::vector<float> q, k, v, f, b, gate;
  std::vector<float> conv_weight[3];
  std::vector<float> dt_bias, a_log, o_norm;
  std::vector<float> cache;  // num_cache_rows rows of row_floats()

  int64_t rows() const { return static_cast<int64_t>(state_rows.size()); }
  int64_t tokens() const { return offsets.back(); }
  int64_t width() const { return heads * dim; }
  int64_t conv_floats() const { return (taps - 1) * width(); }
  int64_t row_floats() const { return 3 * conv_floats() + heads * dim * dim; }
  std::string name() const {
    std::string s = "H=" + std::to_string(heads) + " K=" + std::to_string(dim) +
                    " W=" + std::to_string(taps) + " lb=" + std::to_string(lower_bound) +
                    " tokens=";
    for (size_t r = 0; r + 1 < offsets.size(); ++r) {
      s += std::to_string(offsets[r + 1] - offsets[r]) + (r + 2 < offsets.size() ? "," : "");
    }
    return s;
  }
};

inline KdaDecodeBatch make_kda_decode_batch(const std::vector<int32_t>& row_tokens, int64_t heads,
                                            int64_t dim, int64_t taps, float lower_bound,
                                            uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  auto fill = [&](int64_t n, float scale) {
    std::vector<float> x(n);
    for (float& e : x) e = scale * normal(rng);
    return x;
  };
  KdaDecodeBatch in;
  in.heads = heads;
  in.dim = dim;
  in.taps = taps;
  in.lower_bound = lower_bound;
  in.offsets.assign(1, 0);
  for (int32_t n : row_tokens) in.offsets.push_back(in.offsets.back() + n);
  const int64_t b = std::ssize(row_tokens), t = in.tokens(), w = in.width();
  // Rows 2r + 1 of a 2B + 1-row pool, in reverse order.
  for (int64_t r = 0; r < b; ++r) in.state_rows.push_back(static_cast<int32_t>(2 * (b - r) - 1));
  in.q = fill(t * w, 1.0f);
  in.k = fill(t * w, 1.0f);
  in.v = fill(t * w, 1.0f);
  // f + dt_bias spans the gates' whole range: near-zero decays, moderate ones and, a
  // tenth of the time, f = 8: exp(a_log) * softplus(8 + dt_bias) ~ 25 (the softplus
  // form's g ~ -25, past the point where exp(g) is below 1e-10).
  in.f.resize(t * w);
  for (float& e : in.f) e = unit(rng) < 0.1f ? 8.0f : 2.0f * normal(rng) - 2.0f;
  in.b = fill(t * heads, 1.5f);
  in.gate = fill(t * w, 2.0f);
  for (auto& cw : in.conv_weight) cw = fill(w * taps, 0.5f);
  in.dt_bias = fill(w, 0.5f);
  in.a_log.resize(heads);
  for (float& a : in.a_log) a = std::log(0.5f + 3.0f * unit(rng));
  in.o_norm = fill(dim, 1.0f);
  for (float& e : in.o_norm) e += 1.0f;
  in.cache = fill((2 * b + 1) * in.row_floats(), 0.3f);
  return in;
}

// The fused op's params over `in`'s layout, with its tensors at the given pointers (host
// or device copies of `in`'s vectors).
struct KdaDecodePointers {
  const float *q, *k, *v, *f, *b, *gate, *conv_weight[3], *dt_bias, *a_log, *o_norm;
  float* cache;
  const int32_t *offsets, *state_rows;
  float* y;
};

inline KdaDecodeParams kda_decode_params(const KdaDecodeBatch& in, const KdaDecodePointers& ptr,
                                         bool one_token_rows = false) {
  KdaDecodeParams p;
  p.q = ptr.q;
  p.k = ptr.k;
  p.v = ptr.v;
  p.f = ptr.f;
  p.b = ptr.b;
  p.gate = ptr.gate;
  for (int i = 0; i < 3; ++i) {
    p.conv_weight[i] = ptr.conv_weight[i];
    p.conv_state[i] = in.taps > 1 ? ptr.cache + i * in.conv_floats() : nullptr;
  }
  p.dt_bias = ptr.dt_bias;
  p.a_log = ptr.a_log;
  p.o_norm = ptr.o_norm;
  p.lower_bound = in.lower_bound;
  p.eps = in.eps;
  p.state = ptr.cache + 3 * in.conv_floats();
  p.state_rows = ptr.state_rows;
  p.state_row_bytes = in.row_floats() * static_cast<int64_t>(sizeof(float));
  p.token_offsets = one_token_rows ? nullptr : ptr.offsets;
  p.num_rows = in.rows();
  p.num_tokens = in.tokens();
  p.num_heads = in.heads;
  p.head_dim = in.dim;
  p.kernel_size = in.taps;
  p.y = ptr.y;
  return p;
}

struct KdaDecodeResult {
  std::vector<float> y, cache;
};

// The definition: per request, the separate CPU ops in the layer's order over its
// tokens, its states in its cache row.
inline KdaDecodeResult kda_decode_by_ops(const KdaDecodeBatch& in) {
  const int64_t w = in.width(), h = in.heads, k = in.dim;
  KdaDecodeResult out{std::vector<float>(in.tokens() * w), in.cache};
  for (int64_t r = 0; r < in.rows(); ++r) {
    const int64_t t0 = in.offsets[r], n = in.offsets[r + 1] - t0;
    if (n == 0) continue;
    float* row = out.cache.data() + in.state_rows[r] * in.row_floats();
    std::vector<float> qkv[3];
    const std::vector<float>* raw[3] = {&in.q, &in.k, &in.v};
    for (int i = 0; i < 3; ++i) {
      qkv[i].resize(n * w);
      ShortConvParams c;
      c.x = raw[i]->data() + t0 * w;
      c.weight = in.conv_weight[i].data();
      c.conv_state = in.taps > 1 ? row + i * in.conv_floats() : nullptr;
      c.y = qkv[i].data();
      c.num_tokens = n;
      c.channels = w;
      c.kernel_size = in.taps;
      cpu::short_conv_silu(c);
    }
    std::vector<float> g(n * w);
    KdaGateParams gp;
    gp.f = in.f.data() + t0 * w;
    gp.dt_bias = in.dt_bias.data();
    gp.a_log = in.a_log.data();
    gp.g = g.data();
    gp.num_tokens = n;
    gp.num_heads = h;
    gp.head_dim = k;
    gp.lower_bound = in.lower_bound;
    cpu::kda_gate(gp);
    std::vector<float> beta(in.b.begin() + t0 * h, in.b.begin() + (t0 + n) * h);
    for (float& x : beta) x = 1.0f / (1.0f + std::exp(-x));
    cpu::l2norm_rows(qkv[0].data(), n * h, k, 1.0f / std::sqrt(static_cast<float>(k)));
    cpu::l2norm_rows(qkv[1].data(), n * h, k, 1.0f);
    std::vector<float> o(n * w);
    KdaParams kp;
    kp.q = qkv[0].data();
    kp.k = qkv[1].data();
    kp.v = qkv[2].data();
    kp.g = g.data();
    kp.beta = beta.data();
    kp.state = row + 3 * in.conv_floats();
    kp.o = o.data();
    kp.num_tokens = n;
    kp.num_heads = h;
    kp.head_dim = k;
    cpu::kda_recurrent(kp);
    GatedRmsNormParams np;
    np.o = o.data();
    np.weight = in.o_norm.data();
    np.gate = in.gate.data() + t0 * w;
    np.y = out.y.data() + t0 * w;
    np.eps = in.eps;
    np.num_tokens = n;
    np.num_heads = h;
    np.head_dim = k;
    cpu::gated_rms_norm(np);
  }
  return out;
}

// `in`'s own tensors (host memory), the cache and y given.
inline KdaDecodePointers host_pointers(const KdaDecodeBatch& in, float* cache, float* y) {
  return {in.q.data(),
          in.k.data(),
          in.v.data(),
          in.f.data(),
          in.b.data(),
          in.gate.data(),
          {in.conv_weight[0].data(), in.conv_weight[1].data(), in.conv_weight[2].data()},
          in.dt_bias.data(),
          in.a_log.data(),
          in.o_norm.data(),
          cache,
          in.offsets.data(),
          in.state_rows.data(),
          y};
}

// Speculative verification's two uses of the op (KdaDecodeParams): verify (outputs, no state
// written) and commit (each request's first counts[r] tokens, states written, no outputs).
struct KdaDecodeMode {
  bool write_state = true;
  bool outputs = true;
  std::vector<int32_t> counts;  // empty: every token
};

// cpu::kda_decode over host copies of `in` (y stays 0 without outputs).
inline KdaDecodeResult kda_decode_cpu(const KdaDecodeBatch& in, bool one_token_rows = false,
                                      const KdaDecodeMode& mode = {}) {
  KdaDecodeResult out{std::vector<float>(in.tokens() * in.width()), in.cache};
  const KdaDecodePointers ptr = host_pointers(in, out.cache.data(), out.y.data());
  KdaDecodeParams p = kda_decode_params(in, ptr, one_token_rows);
  p.write_state = mode.write_state;
  if (!mode.outputs) p.y = nullptr;
  if (!mode.counts.empty()) p.token_counts = mode.counts.data();
  cpu::kda_decode(p);
  return out;
}

// `in` with each request's first counts[r] tokens only (the same rows and cache).
inline KdaDecodeBatch kept_tokens(const KdaDecodeBatch& in, const std::vector<int32_t>& counts) {
  KdaDecodeBatch out = in;
  out.offsets.assign(1, 0);
  for (auto* x : {&out.q, &out.k, &out.v, &out.f, &out.gate, &out.b}) x->clear();
  const int64_t w = in.width(), h = in.heads;
  for (int64_t r = 0; r < in.rows(); ++r) {
    const int64_t n =
        std::min<int64_t>(counts[static_cast<size_t>(r)], in.offsets[r + 1] - in.offsets[r]);
    out.offsets.push_back(out.offsets.back() + static_cast<int32_t>(n));
    const int64_t t0 = in.offsets[r];
    const std::vector<float>* src[] = {&in.q, &in.k, &in.v, &in.f, &in.gate};
    std::vector<float>* dst[] = {&out.q, &out.k, &out.v, &out.f, &out.gate};
    for (int i = 0; i < 5; ++i) {
      dst[i]->insert(dst[i]->end(), src[i]->begin() + t0 * w, src[i]->begin() + (t0 + n) * w);
    }
    out.b.insert(out.b.end(), in.b.begin() + t0 * h, in.b.begin() + (t0 + n) * h);
  }
  return out;
}

}  // namespace hyserve::test
