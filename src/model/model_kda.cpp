// Model's KDA layers (MODEL.md §4, K3.md §3.3): the projections, the short convs, the gate,
// the delta-rule recurrence (chunked for prefill; the fused kda_decode for decode batches,
// speculative verification and, batch-invariant, prefill too) and the gated output norm; and the
// commit of a verification's accepted tokens into the KDA states. Member functions of Model
// (model.h), kept apart from the decoder's sequence of layers in model.cpp.
#include <cmath>
#include <vector>

#include "model/model.h"
#include "util/error.h"

namespace hyserve {

KdaDecodeParams Model::kda_decode_params(int64_t layer, const KvCache& cache,
                                         const int32_t* state_rows) const {
  const ModelConfig& c = config_;
  const KdaWeights& w = weights_.layers[layer].kda;
  KdaDecodeParams p;
  p.conv_weight[0] = w.q_conv.data;
  p.conv_weight[1] = w.k_conv.data;
  p.conv_weight[2] = w.v_conv.data;
  p.dt_bias = w.dt_bias.data;
  p.a_log = w.a_log.data;
  p.o_norm = w.o_norm.data;
  p.lower_bound = static_cast<float>(c.kda_gate_lower_bound);
  p.eps = static_cast<float>(c.rms_norm_eps);
  for (int which = 0; which < 3; ++which) {
    p.conv_state[which] = cache.kda_conv_state(0, layer, which);
  }
  p.state = cache.kda_recurrent_state(0, layer);
  p.state_rows = state_rows;
  p.state_row_bytes = cache.plan().row_bytes;
  p.num_heads = c.linear_num_heads;
  p.head_dim = c.linear_head_dim;
  p.kernel_size = c.linear_conv_kernel;
  return p;
}

int64_t Model::kda_stash_floats(int64_t capacity) const {
  const ModelConfig& c = config_;
  return c.num_kda_layers() * capacity * c.linear_num_heads * (4 * c.linear_head_dim + 1);
}

Model::KdaStashPlanes Model::kda_stash_planes(const KdaStash& stash, int64_t layer) const {
  const ModelConfig& c = config_;
  int64_t ordinal = 0;  // KDA layers before this one
  for (int64_t l = 0; l < layer; ++l) ordinal += c.is_kda(l) ? 1 : 0;
  const int64_t width = c.linear_num_heads * c.linear_head_dim;
  float* base =
      stash.data + ordinal * stash.capacity * c.linear_num_heads * (4 * c.linear_head_dim + 1);
  const int64_t plane = stash.capacity * width;
  return {base, base + plane, base + 2 * plane, base + 3 * plane, base + 4 * plane};
}

void Model::commit_kda(const KdaCommit& commit) const {
  if (config_.num_kda_layers() == 0 || commit.num_sequences == 0) return;
  CHECK(commit.cache != nullptr && commit.stash != nullptr &&
            commit.num_tokens <= commit.stash->capacity,
        "commit_kda: ", commit.num_tokens, " tokens, a stash of ",
        commit.stash != nullptr ? commit.stash->capacity : 0);
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    if (!config_.is_kda(layer)) continue;
    const KdaStashPlanes planes = kda_stash_planes(*commit.stash, layer);
    KdaDecodeParams p = kda_decode_params(layer, *commit.cache, commit.state_rows);
    p.q = planes.q;
    p.k = planes.k;
    p.v = planes.v;
    p.f = planes.f;
    p.b = planes.b;
    p.num_rows = commit.num_sequences;
    p.token_offsets = commit.token_offsets;
    p.token_counts = commit.token_counts;
    p.num_tokens = commit.num_tokens;
    backend_->kda_decode(p);
  }
}

void Model::kda_attention(Pass& pass, int64_t layer, const float* x, int64_t t,
                          std::span<const SequenceSlice> seqs, float* out) const {
  const ModelConfig& c = config_;
  const KdaWeights& w = weights_.layers[layer].kda;
  const int64_t h = c.linear_num_heads, k = c.linear_head_dim, width = h * k;

  // The projections of x, in one call: q, k, v, f_a, b and the output gate (g_proj, or
  // g_a of the low-rank gate).
  const std::vector<float*> px = project(pass, x, t,
                                         {&w.q_proj, &w.k_proj, &w.v_proj, &w.f_a_proj, &w.b_proj,
                                          c.kda_full_rank_gate ? &w.g_proj : &w.g_a_proj});

  // g's input f_b(f_a(x)), and the output gate: g_proj(x) (full rank) or g_b(g_a(x)).
  float* g = linear(pass, px[3], t, w.f_b_proj);
  const float* gate = c.kda_full_rank_gate ? px[5] : linear(pass, px[5], t, w.g_b_proj);
  float* o = pass.ws.floats(t * width);
  if (pass.decode.cache != nullptr) {
    // The tokens of each sequence (one, or a verification's run), its states in its cache
    // row: the whole core in one op.
    const BatchedDecode& bd = pass.decode;
    KdaDecodeParams p = kda_decode_params(layer, *bd.cache, bd.state_rows);
    p.q = px[0];
    p.k = px[1];
    p.v = px[2];
    p.f = g;
    p.b = px[4];
    p.gate = gate;
    p.num_rows = bd.token_offsets != nullptr ? bd.num_sequences : t;
    p.token_offsets = bd.token_offsets;
    p.num_tokens = t;
    p.y = o;
    if (bd.kda_stash != nullptr) {
      // Verification: the states stay; the raw inputs wait for the commit.
      CHECK(bd.token_offsets != nullptr && t <= bd.kda_stash->capacity, "verification forward of ",
            t, " tokens: the KDA stash holds ", bd.kda_stash->capacity);
      p.write_state = false;
      const KdaStashPlanes planes = kda_stash_planes(*bd.kda_stash, layer);
      const float* from[5] = {px[0], px[1], px[2], g, px[4]};
      float* to[5] = {planes.q, planes.k, planes.v, planes.f, planes.b};
      for (int i = 0; i < 5; ++i) {
        backend_->copy(to[i], from[i], static_cast<size_t>(t * (i < 4 ? width : h)) * 4);
      }
    }
    backend_->kda_decode(p);
    linear_into(pass, o, t, w.o_proj, out);
    return;
  }
  if (options_.batch_invariant) {
    // Batch-invariant prefill: each sequence's tokens as one run of the same fused op (its
    // verification form), so a prompt's token takes the op and order it took when decoded.
    for (const SequenceSlice& sq : seqs) {
      const int32_t run[3] = {sq.state_block, 0, static_cast<int32_t>(sq.n)};  // row, offsets
      int32_t* run_dev = pass.ws.ints(3);
      backend_->upload(run_dev, run, sizeof run);
      KdaDecodeParams p = kda_decode_params(layer, *sq.cache, run_dev);
      p.q = px[0] + sq.offset * width;
      p.k = px[1] + sq.offset * width;
      p.v = px[2] + sq.offset * width;
      p.f = g + sq.offset * width;
      p.b = px[4] + sq.offset * h;
      p.gate = gate + sq.offset * width;
      p.num_rows = 1;
      p.token_offsets = run_dev + 1;
      p.num_tokens = sq.n;
      p.y = o + sq.offset * width;
      backend_->kda_decode(p);
    }
    linear_into(pass, o, t, w.o_proj, out);
    return;
  }

  // Prefill, sequence by sequence:
  // 1. q, k, v = silu(causal_conv(proj(x))), each sequence carrying its conv states.
  auto conv = [&](const float* raw, const Vec& weight, int which) {
    float* y = pass.ws.floats(t * width);
    for (const SequenceSlice& sq : seqs) {
      ShortConvParams p;
      p.x = raw + sq.offset * width;
      p.weight = weight.data;
      p.conv_state = sq.cache->kda_conv_state(sq.state_block, layer, which);
      p.y = y + sq.offset * width;
      p.num_tokens = sq.n;
      p.channels = width;
      p.kernel_size = c.linear_conv_kernel;
      backend_->short_conv_silu(p);
    }
    return y;
  };
  float* q = conv(px[0], w.q_conv, 0);
  float* kk = conv(px[1], w.k_conv, 1);
  float* v = conv(px[2], w.v_conv, 2);

  // 2. g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias), or the bounded gate
  //    lb * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias)) (K3.md §3.3)
  KdaGateParams gp;
  gp.f = g;
  gp.dt_bias = w.dt_bias.data;
  gp.a_log = w.a_log.data;
  gp.g = g;
  gp.num_tokens = t;
  gp.num_heads = h;
  gp.head_dim = k;
  gp.lower_bound = static_cast<float>(c.kda_gate_lower_bound);
  backend_->kda_gate(gp);

  // 3. beta = sigmoid(b_proj(x))
  float* beta = px[4];
  backend_->sigmoid({beta, t * h});

  // 4. q = l2norm(q) * K^-0.5, k = l2norm(k)
  backend_->l2norm_rows({q, t * h, k, 1.0f / std::sqrt(static_cast<float>(k))});
  backend_->l2norm_rows({kk, t * h, k, 1.0f});

  // 5./6. The delta-rule recurrence per sequence, chunked (a one-token chunk recurrent).
  for (const SequenceSlice& sq : seqs) {
    KdaParams p;
    p.q = q + sq.offset * width;
    p.k = kk + sq.offset * width;
    p.v = v + sq.offset * width;
    p.g = g + sq.offset * width;
    p.beta = beta + sq.offset * h;
    p.state = sq.cache->kda_recurrent_state(sq.state_block, layer);
    p.o = o + sq.offset * width;
    p.num_tokens = sq.n;
    p.num_heads = h;
    p.head_dim = k;
    if (sq.n > 1) {
      backend_->kda_chunked(p);
    } else {
      backend_->kda_recurrent(p);
    }
  }
  dump(layer_name(layer, "kda_core"), o, t, width);

  // 7. o = rmsnorm(o) * o_norm * sigmoid(gate); o_proj
  GatedRmsNormParams np;
  np.o = o;
  np.weight = w.o_norm.data;
  np.gate = gate;
  np.y = o;
  np.eps = static_cast<float>(c.rms_norm_eps);
  np.num_tokens = t;
  np.num_heads = h;
  np.head_dim = k;
  backend_->gated_rms_norm(np);
  linear_into(pass, o, t, w.o_proj, out);
}

}  // namespace hyserve
