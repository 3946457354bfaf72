#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/indexer/cpu.h"
#include "kernels/kda/cpu.h"
#include "kernels/linear/params.h"
#include "kernels/mla/cpu.h"
#include "kernels/mlp/params.h"
#include "kernels/moe/params.h"
#include "kernels/norm/params.h"
#include "kernels/rope/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

// Queries per indexer scoring pass: bounds the score buffer to kIndexerQueryChunk x S.
constexpr int64_t kIndexerQueryChunk = 256;

using Buffer = std::vector<float>;

void linear(const float* x, int64_t num_tokens, const Weight& w, float* y) {
  LinearParams p;
  p.x = x;
  p.w = &w;
  p.y = y;
  p.num_tokens = num_tokens;
  cpu::linear(p);
}

Buffer linear(const float* x, int64_t num_tokens, const Weight& w) {
  Buffer y(static_cast<size_t>(num_tokens * w.rows));
  linear(x, num_tokens, w, y.data());
  return y;
}

void rms_norm(const float* x, const std::vector<float>& w, int64_t rows, int64_t dim, double eps,
              float* y) {
  RmsNormParams p;
  p.x = x;
  p.weight = w.data();
  p.y = y;
  p.num_rows = rows;
  p.dim = dim;
  p.eps = static_cast<float>(eps);
  cpu::rms_norm(p);
}

float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}

// In-place rotation of dims [offset, offset + rotary_dim) of each of `heads` heads.
void rope(const RopeTable& table, bool neox, float* x, const std::vector<int64_t>& pos,
          int64_t heads, int64_t head_stride, int64_t offset) {
  RopeParams p;
  p.x = x;
  p.positions = pos.data();
  p.num_tokens = static_cast<int64_t>(pos.size());
  p.num_heads = heads;
  p.head_stride = head_stride;
  p.offset = offset;
  if (neox) {
    cpu::apply_rope_neox(table, p);
  } else {
    cpu::apply_rope_interleaved(table, p);
  }
}

RopeTable make_rope_table(const ModelConfig& c) {
  if (!c.rope.enabled) return {};
  if (!c.rope.yarn) return RopeTable::plain(c.qk_rope_head_dim, c.rope.theta);
  YarnParams y;
  y.factor = c.rope.factor;
  y.original_max_position_embeddings = c.rope.original_max_position_embeddings;
  y.beta_fast = c.rope.beta_fast;
  y.beta_slow = c.rope.beta_slow;
  y.mscale = c.rope.mscale;
  y.mscale_all_dim = c.rope.mscale_all_dim;
  return RopeTable::yarn(c.qk_rope_head_dim, c.rope.theta, y);
}

}  // namespace

Model::Model(ModelConfig config, Checkpoint checkpoint, ModelOptions options)
    : config_(std::move(config)), checkpoint_(std::move(checkpoint)), options_(options) {
  weights_ = load_weights(config_, checkpoint_);
  rope_ = make_rope_table(config_);
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, ModelOptions options) {
  ModelConfig config = ModelConfig::load(dir);
  Checkpoint checkpoint = Checkpoint::open(dir);
  return std::unique_ptr<Model>(new Model(std::move(config), std::move(checkpoint), options));
}

SequenceState Model::new_sequence() const {
  const ModelConfig& c = config_;
  SequenceState s;
  s.kda.resize(c.num_hidden_layers);
  s.mla.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_kda(i)) continue;
    const size_t width = static_cast<size_t>(c.linear_num_heads * c.linear_head_dim);
    const size_t conv = static_cast<size_t>(c.linear_conv_kernel - 1) * width;
    KdaLayerState& k = s.kda[i];
    k.conv_q.assign(conv, 0.0f);
    k.conv_k.assign(conv, 0.0f);
    k.conv_v.assign(conv, 0.0f);
    k.recurrent.assign(width * static_cast<size_t>(c.linear_head_dim), 0.0f);
  }
  return s;
}

void Model::dump(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
  if (dump_) dump_(name, data, rows, cols);
}

void Model::forward(std::span<const int32_t> tokens, SequenceState& state,
                    std::vector<float>& logits, bool all_positions) const {
  const ModelConfig& c = config_;
  const int64_t t = static_cast<int64_t>(tokens.size());
  const int64_t d = c.hidden_size;
  CHECK(t > 0, "forward needs at least one token");
  CHECK(static_cast<int64_t>(state.kda.size()) == c.num_hidden_layers,
        "sequence state was made for another model");
  for (int64_t i = 0; i < t; ++i) {
    CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, "token id ", tokens[i], " at position ", i,
          " is outside the vocabulary [0, ", c.vocab_size, ")");
  }
  const int64_t start = state.num_tokens;

  // h = embed_tokens(ids)
  Buffer h(static_cast<size_t>(t * d));
  cpu::embedding_lookup(weights_.embed, tokens.data(), t, h.data());
  dump("embed", h.data(), t, d);

  Buffer x(h.size()), out(h.size());
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const LayerWeights& lw = weights_.layers[layer];
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    // h = h + attn(rms(h))
    rms_norm(h.data(), lw.input_norm, t, d, c.rms_norm_eps, x.data());
    if (c.is_kda(layer)) {
      kda_attention(layer, x.data(), t, state.kda[layer], out.data());
    } else {
      mla_attention(layer, x.data(), t, start, state.mla[layer], out.data());
    }
    dump(prefix + "attn_out", out.data(), t, d);
    for (size_t j = 0; j < h.size(); ++j) h[j] += out[j];
    // h = h + mlp(rms(h))
    rms_norm(h.data(), lw.post_norm, t, d, c.rms_norm_eps, x.data());
    feed_forward(layer, x.data(), t, out.data());
    dump(prefix + "mlp_out", out.data(), t, d);
    for (size_t j = 0; j < h.size(); ++j) h[j] += out[j];
    dump(prefix + "hidden", h.data(), t, d);
  }
  state.num_tokens += t;

  // logits = lm_head(rms(h)), for every position or the last.
  const int64_t first = all_positions ? 0 : t - 1;
  const int64_t n = t - first;
  rms_norm(h.data() + first * d, weights_.final_norm, n, d, c.rms_norm_eps, x.data());
  logits.resize(static_cast<size_t>(n * c.vocab_size));
  linear(x.data(), n, weights_.lm_head, logits.data());
  dump("logits", logits.data(), n, c.vocab_size);
}

void Model::mla_attention(int64_t layer, const float* x, int64_t t, int64_t start,
                          MlaLayerCache& cache, float* out) const {
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t h = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, kv = c.kv_lora_rank, dqk = dn + dr;
  const std::string prefix = "layers." + std::to_string(layer) + ".";

  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos[i] = start + i;

  // 1. q = q_b_proj(rms(q_a_proj(x))) or q_proj(x): [T, H, dn+dr]
  Buffer q_lat;  // [T, q_lora], the indexer's query input
  Buffer q;
  if (c.q_lora_rank > 0) {
    q_lat = linear(x, t, w.q_a_proj);
    rms_norm(q_lat.data(), w.q_a_norm, t, c.q_lora_rank, c.kv_norm_eps, q_lat.data());
    q = linear(q_lat.data(), t, w.q_b_proj);
  } else {
    q = linear(x, t, w.q_proj);
  }

  // 2. [c | k_pe] = kv_a_proj_with_mqa(x); c = rms(c)
  Buffer ckv = linear(x, t, w.kv_a_proj);  // [T, kv + dr]
  for (int64_t i = 0; i < t; ++i) {
    float* row = ckv.data() + i * (kv + dr);
    rms_norm(row, w.kv_a_norm, 1, kv, c.kv_norm_eps, row);
  }

  // 3. RoPE on q_pe and k_pe (deepseek_v32); kimi_* are NoPE.
  if (c.rope.enabled) {
    rope(rope_, /*neox=*/false, q.data(), pos, h, dqk, dn);
    rope(rope_, /*neox=*/false, ckv.data(), pos, 1, kv + dr, kv);
  }
  dump(prefix + "q", q.data(), t, h * dqk);
  dump(prefix + "latent", ckv.data(), t, kv + dr);

  // 5. Append the latent [c | k_pe] of the new tokens.
  cache.latent.insert(cache.latent.end(), ckv.begin(), ckv.end());
  const int64_t s = start + t;

  // DSA indexer: top-k past positions per query.
  std::vector<int32_t> topk;
  if (c.has_indexer())
    topk = index_select(layer, x, q_lat.empty() ? x : q_lat.data(), t, start, cache);

  // 6. Attention over the cached latents (expanded for prefill, absorbed for decode).
  Buffer o(static_cast<size_t>(t * h * dv));
  MlaAttentionParams p;
  p.q = q.data();
  p.latent = cache.latent.data();
  p.kv_b = &w.kv_b_proj;
  p.q_pos = pos.data();
  p.topk = topk.empty() ? nullptr : topk.data();
  p.topk_width = topk.empty() ? 0 : c.index_topk;
  p.out = o.data();
  p.lse = nullptr;
  p.num_tokens = t;
  p.num_keys = s;
  p.num_heads = h;
  p.dn = dn;
  p.dr = dr;
  p.dv = dv;
  p.kv_lora = kv;
  p.softmax_scale = static_cast<float>(c.mla_softmax_scale());
  if (t > 1) {
    cpu::mla_attention_expanded(p);
  } else {
    cpu::mla_attention_absorbed(p);
  }
  dump(prefix + "attn", o.data(), t, h * dv);

  // 7. kimi_k3: o *= sigmoid(g_proj(x)).
  if (c.mla_output_gate) {
    const Buffer g = linear(x, t, w.g_proj);
    for (size_t j = 0; j < o.size(); ++j) o[j] *= sigmoid(g[j]);
  }
  linear(o.data(), t, w.o_proj, out);
}

std::vector<int32_t> Model::index_select(int64_t layer, const float* x, const float* q_in,
                                         int64_t t, int64_t start, MlaLayerCache& cache) const {
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t hi = c.index_n_heads, di = c.index_head_dim;
  const std::string prefix = "layers." + std::to_string(layer) + ".indexer.";
  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos[i] = start + i;

  // 1. qi = wq_b(q latent) [T, Hi, di]; ki = k_norm(wk(x)) [T, di]
  Buffer qi = linear(q_in, t, w.idx_wq_b);
  Buffer ki = linear(x, t, w.idx_wk);
  LayerNormParams ln;
  ln.x = ki.data();
  ln.weight = w.idx_k_norm_w.data();
  ln.bias = w.idx_k_norm_b.data();
  ln.y = ki.data();
  ln.num_rows = t;
  ln.dim = di;
  ln.eps = 1e-6f;
  cpu::layer_norm(ln);
  // 2. deepseek_v32: half-split RoPE on the first dims, layout [pe | nope].
  if (c.index_rope_dims > 0) {
    rope(rope_, /*neox=*/true, qi.data(), pos, hi, di, 0);
    rope(rope_, /*neox=*/true, ki.data(), pos, 1, di, 0);
  }
  // 5. w_h = weights_proj(x)_h * Hi^-0.5 * di^-0.5
  Buffer hw = linear(x, t, w.idx_weights_proj);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(hi * di));
  for (float& v : hw) v *= wscale;

  // 3./4. FP8 path: Hadamard on both sides, keys cached quantized. Else fp32 keys.
  if (options_.indexer_fp8) {
    cpu::hadamard_rotate(qi.data(), t * hi, di);
    cpu::hadamard_rotate(ki.data(), t, di);
    const size_t old = cache.index_key_scales.size();
    cache.index_keys_fp8.resize((old + t) * di);
    cache.index_key_scales.resize(old + t);
    cpu::quantize_fp8_ue8m0(ki.data(), t, di, cache.index_keys_fp8.data() + old * di,
                            cache.index_key_scales.data() + old);
  } else {
    cache.index_keys.insert(cache.index_keys.end(), ki.begin(), ki.end());
  }
  dump(prefix + "q", qi.data(), t, hi * di);
  dump(prefix + "k", ki.data(), t, di);

  // 6./7. Score the queries in chunks (bounded buffer), keep the causal top-k.
  const int64_t s = start + t;
  const int64_t k = c.index_topk;
  std::vector<int32_t> selected(static_cast<size_t>(t * k));
  const int64_t chunk = std::min(t, kIndexerQueryChunk);
  Buffer scores(static_cast<size_t>(chunk * s));
  for (int64_t b = 0; b < t; b += chunk) {
    const int64_t n = std::min(chunk, t - b);
    if (options_.indexer_fp8) {
      IndexerFp8CacheScoreParams p;
      p.q = qi.data() + b * hi * di;
      p.k_fp8 = cache.index_keys_fp8.data();
      p.k_scales = cache.index_key_scales.data();
      p.head_weights = hw.data() + b * hi;
      p.q_pos = pos.data() + b;
      p.scores = scores.data();
      p.num_tokens = n;
      p.num_keys = s;
      p.num_heads = hi;
      p.head_dim = di;
      cpu::indexer_scores_fp8_cache(p);
    } else {
      IndexerScoreParams p;
      p.q = qi.data() + b * hi * di;
      p.k = cache.index_keys.data();
      p.head_weights = hw.data() + b * hi;
      p.q_pos = pos.data() + b;
      p.scores = scores.data();
      p.num_tokens = n;
      p.num_keys = s;
      p.num_heads = hi;
      p.head_dim = di;
      cpu::indexer_scores(p);
    }
    cpu::causal_topk(scores.data(), pos.data() + b, n, s, k, selected.data() + b * k);
  }
  return selected;
}

void Model::kda_attention(int64_t layer, const float* x, int64_t t, KdaLayerState& st,
                          float* out) const {
  const ModelConfig& c = config_;
  const KdaWeights& w = weights_.layers[layer].kda;
  const int64_t h = c.linear_num_heads, k = c.linear_head_dim, width = h * k;
  const std::string prefix = "layers." + std::to_string(layer) + ".";

  // 1. q, k, v = silu(causal_conv(proj(x))), carrying the conv states.
  auto conv = [&](const Weight& proj, const std::vector<float>& weight,
                  std::vector<float>& conv_state) {
    const Buffer raw = linear(x, t, proj);
    Buffer y(raw.size());
    ShortConvParams p;
    p.x = raw.data();
    p.weight = weight.data();
    p.conv_state = conv_state.data();
    p.y = y.data();
    p.num_tokens = t;
    p.channels = width;
    p.kernel_size = c.linear_conv_kernel;
    cpu::short_conv_silu(p);
    return y;
  };
  Buffer q = conv(w.q_proj, w.q_conv, st.conv_q);
  Buffer kk = conv(w.k_proj, w.k_conv, st.conv_k);
  Buffer v = conv(w.v_proj, w.v_conv, st.conv_v);

  // 2. g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)
  const Buffer fa = linear(x, t, w.f_a_proj);
  Buffer g = linear(fa.data(), t, w.f_b_proj);
  KdaGateParams gp;
  gp.f = g.data();
  gp.dt_bias = w.dt_bias.data();
  gp.a_log = w.a_log.data();
  gp.g = g.data();
  gp.num_tokens = t;
  gp.num_heads = h;
  gp.head_dim = k;
  cpu::kda_gate(gp);

  // 3. beta = sigmoid(b_proj(x))
  Buffer beta = linear(x, t, w.b_proj);
  for (float& b : beta) b = sigmoid(b);

  // 4. q = l2norm(q) * K^-0.5, k = l2norm(k)
  cpu::l2norm_rows(q.data(), t * h, k, 1.0f / std::sqrt(static_cast<float>(k)));
  cpu::l2norm_rows(kk.data(), t * h, k, 1.0f);

  // 5./6. The delta-rule recurrence: chunked for prefill, recurrent for decode.
  Buffer o(static_cast<size_t>(t * width));
  KdaParams p;
  p.q = q.data();
  p.k = kk.data();
  p.v = v.data();
  p.g = g.data();
  p.beta = beta.data();
  p.state = st.recurrent.data();
  p.o = o.data();
  p.num_tokens = t;
  p.num_heads = h;
  p.head_dim = k;
  if (t > 1) {
    cpu::kda_chunked(p);
  } else {
    cpu::kda_recurrent(p);
  }
  dump(prefix + "kda_core", o.data(), t, width);

  // 7. o = rmsnorm(o) * o_norm * sigmoid(g_b(g_a(x))); o_proj
  const Buffer ga = linear(x, t, w.g_a_proj);
  const Buffer gate = linear(ga.data(), t, w.g_b_proj);
  GatedRmsNormParams np;
  np.o = o.data();
  np.weight = w.o_norm.data();
  np.gate = gate.data();
  np.y = o.data();
  np.eps = static_cast<float>(c.rms_norm_eps);
  np.num_tokens = t;
  np.num_heads = h;
  np.head_dim = k;
  cpu::gated_rms_norm(np);
  linear(o.data(), t, w.o_proj, out);
}

void Model::feed_forward(int64_t layer, const float* x, int64_t t, float* out) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  if (!c.is_moe(layer)) {
    MlpParams p;
    p.x = x;
    p.w = &lw.dense;
    p.y = out;
    p.num_tokens = t;
    cpu::mlp(p);
    return;
  }
  const int64_t k = c.num_experts_per_tok;
  std::vector<int32_t> ids(static_cast<size_t>(t * k));
  Buffer weights(static_cast<size_t>(t * k));
  RouterParams r;
  r.x = x;
  r.gate = &lw.moe.gate;
  r.bias = lw.moe.score_bias.empty() ? nullptr : lw.moe.score_bias.data();
  r.num_tokens = t;
  r.num_experts = c.num_experts;
  r.top_k = k;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.renormalize = c.norm_topk_prob;
  r.scaling_factor = static_cast<float>(c.routed_scaling_factor);
  r.expert_ids = ids.data();
  r.expert_weights = weights.data();
  cpu::route_experts(r);

  MoeParams m;
  m.x = x;
  m.num_tokens = t;
  m.hidden = c.hidden_size;
  m.experts = lw.moe.experts.data();
  m.num_experts = c.num_experts;
  m.expert_ids = ids.data();
  m.expert_weights = weights.data();
  m.top_k = k;
  m.shared = lw.moe.has_shared ? &lw.moe.shared : nullptr;
  m.y = out;
  cpu::moe(m);
}

}  // namespace hyserve
