#include "model/weights.h"

#include <string>

#include "util/error.h"

namespace hyserve {
namespace {

// Keeps an fp32 copy and returns its view.
Vec keep(std::deque<std::vector<float>>& owned, std::vector<float> v) {
  owned.push_back(std::move(v));
  return Vec{owned.back().data(), static_cast<int64_t>(owned.back().size())};
}

struct LayerLoader {
  const ModelConfig& c;
  const TensorSource& ck;
  std::deque<std::vector<float>>& owned;
  std::string base;  // "[language_model.]model.layers.N."

  std::string name(const std::string& rest) const { return base + rest; }

  Weight weight(const std::string& rest, int64_t rows, int64_t cols) const {
    return ck.load_weight(name(rest), rows, cols);
  }

  Vec vec(const std::string& rest, std::vector<int64_t> shape) const {
    return keep(owned, ck.load_f32(name(rest), std::move(shape)));
  }

  // A small tensor stored under one of several shapes (e.g. A_log [H] or [1,1,H,1]).
  Vec vec_any(const std::string& rest, std::initializer_list<std::vector<int64_t>> shapes) const {
    const TensorInfo* info = ck.find(name(rest));
    if (!info && !ck.contains(name(rest)))
      HYSERVE_THROW(CheckpointError, "checkpoint ", ck.dir().string(), ": missing tensor ",
                    name(rest));
    for (const auto& s : shapes) {
      if (info && info->shape == s) return keep(owned, ck.load_f32(name(rest), s));
    }
    return keep(owned, ck.load_f32(name(rest), *shapes.begin()));  // throws, naming the shape
  }

  bool has(const std::string& rest) const { return ck.contains(name(rest)); }
};

// A_log of h heads: stored [h], [1, 1, h, 1], or (the published Kimi K3: [128] for 96
// heads, K3.md §3.3) a longer [n] whose first h entries are the heads' and the rest
// padding; the padding is not read.
Vec load_a_log(const LayerLoader& l, const std::string& rest, int64_t h) {
  const TensorInfo* info = l.ck.find(l.name(rest));
  if (info && info->shape.size() == 1 && info->shape[0] > h) {
    std::vector<float> all = l.ck.load_f32(l.name(rest), info->shape);
    all.resize(static_cast<size_t>(h));
    return keep(l.owned, std::move(all));
  }
  return l.vec_any(rest, {{1, 1, h, 1}, {h}});
}

// The AttnRes query of one mix: norm.weight [D] * proj.weight [1, D].
AttnResQuery load_attn_res(const LayerLoader& l, const std::string& name, int64_t d) {
  std::vector<float> q = l.ck.load_f32(l.name(name + "_norm.weight"), {d});
  const std::vector<float> proj = l.ck.load_f32(l.name(name + "_proj.weight"), {1, d});
  for (int64_t i = 0; i < d; ++i) q[i] *= proj[i];
  return keep(l.owned, std::move(q));
}

MlpWeights load_mlp(const LayerLoader& l, const std::string& prefix, const char* gate,
                    const char* up, const char* down, int64_t hidden, int64_t width) {
  MlpWeights m;
  m.gate = l.weight(prefix + gate, width, hidden);
  m.up = l.weight(prefix + up, width, hidden);
  m.down = l.weight(prefix + down, hidden, width);
  return m;
}

bool has_weight(const LayerLoader& l, const std::string& prefix) {
  return l.has(prefix + ".weight") || l.has(prefix + ".weight_blocks") ||
         l.has(prefix + ".weight_packed");
}

MlaWeights load_mla(const LayerLoader& l) {
  const ModelConfig& c = l.c;
  const int64_t d = c.hidden_size, h = c.num_attention_heads;
  MlaWeights w;
  const std::string a = "self_attn.";
  if (c.q_lora_rank > 0) {
    w.q_a_proj = l.weight(a + "q_a_proj", c.q_lora_rank, d);
    w.q_a_norm = l.vec(a + "q_a_layernorm.weight", {c.q_lora_rank});
    w.q_b_proj = l.weight(a + "q_b_proj", h * c.qk_head_dim(), c.q_lora_rank);
  } else {
    w.q_proj = l.weight(a + "q_proj", h * c.qk_head_dim(), d);
  }
  w.kv_a_proj = l.weight(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, d);
  w.kv_a_norm = l.vec(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
  w.kv_b_proj = l.weight(a + "kv_b_proj", h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  w.o_proj = l.weight(a + "o_proj", d, h * c.v_head_dim);
  if (c.mla_output_gate) w.g_proj = l.weight(a + "g_proj", h * c.v_head_dim, d);
  if (c.has_indexer()) {
    const int64_t hi = c.index_n_heads, di = c.index_head_dim;
    const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : d;
    const std::string ix = a + "indexer.";
    w.idx_wq_b = l.weight(ix + "wq_b", hi * di, q_in);
    w.idx_wk = l.weight(ix + "wk", di, d);
    w.idx_k_norm_w = l.vec(ix + "k_norm.weight", {di});
    // DeepSeek-V3.2's k_norm is a LayerNorm with bias; whether Kimi K3.1 Pro's has one is
    // not published (K3.md §6): without the tensor the bias is zero.
    if (c.model_type == ModelType::kKimiK3 && !l.has(ix + "k_norm.bias")) {
      w.idx_k_norm_b = keep(l.owned, std::vector<float>(static_cast<size_t>(di), 0.0f));
    } else {
      w.idx_k_norm_b = l.vec(ix + "k_norm.bias", {di});
    }
    w.idx_weights_proj = l.weight(ix + "weights_proj", hi, d);
  }
  return w;
}

KdaWeights load_kda(const LayerLoader& l) {
  const ModelConfig& c = l.c;
  const int64_t d = c.hidden_size, h = c.linear_num_heads, k = c.linear_head_dim, width = h * k;
  const int64_t kw = c.linear_conv_kernel;
  const std::string a = "self_attn.";
  KdaWeights w;
  w.q_proj = l.weight(a + "q_proj", width, d);
  w.k_proj = l.weight(a + "k_proj", width, d);
  w.v_proj = l.weight(a + "v_proj", width, d);
  w.q_conv = l.vec_any(a + "q_conv1d.weight", {{width, 1, kw}, {width, kw}});
  w.k_conv = l.vec_any(a + "k_conv1d.weight", {{width, 1, kw}, {width, kw}});
  w.v_conv = l.vec_any(a + "v_conv1d.weight", {{width, 1, kw}, {width, kw}});
  w.f_a_proj = l.weight(a + "f_a_proj", k, d);
  w.f_b_proj = l.weight(a + "f_b_proj", width, k);
  w.b_proj = l.weight(a + "b_proj", h, d);
  if (c.kda_full_rank_gate) {
    w.g_proj = l.weight(a + "g_proj", width, d);
  } else {
    w.g_a_proj = l.weight(a + "g_a_proj", k, d);
    w.g_b_proj = l.weight(a + "g_b_proj", width, k);
  }
  w.a_log = load_a_log(l, a + "A_log", h);
  w.dt_bias = l.vec_any(a + "dt_bias", {{width}, {h, k}});
  w.o_norm = l.vec(a + "o_norm.weight", {k});
  w.o_proj = l.weight(a + "o_proj", d, width);
  return w;
}

MoeWeights load_moe(const LayerLoader& l) {
  const ModelConfig& c = l.c;
  const int64_t d = c.hidden_size, width = c.moe_intermediate_size;
  const int64_t de = c.expert_hidden_size();
  // kimi_* name the block "block_sparse_moe", deepseek "mlp".
  const std::string p = l.has("block_sparse_moe.gate.weight") ? "block_sparse_moe." : "mlp.";
  MoeWeights m;
  m.gate = l.weight(p + "gate", c.num_experts, d);
  if (l.has(p + "gate.e_score_correction_bias"))
    m.score_bias = l.vec(p + "gate.e_score_correction_bias", {c.num_experts});
  // Experts: experts.E.{w1, w3, w2} (kimi) or experts.E.{gate,up,down}_proj (deepseek).
  const bool kimi_names = has_weight(l, p + "experts.0.w1");
  m.experts.reserve(c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    if (kimi_names) {
      m.experts.push_back(load_mlp(l, ep, "w1", "w3", "w2", de, width));
    } else {
      m.experts.push_back(load_mlp(l, ep, "gate_proj", "up_proj", "down_proj", de, width));
    }
  }
  if (c.moe_latent_size > 0) {
    m.latent_down = l.weight(p + "routed_expert_down_proj", de, d);
    if (c.moe_latent_norm) m.latent_norm = l.vec(p + "routed_expert_norm.weight", {de});
    m.latent_up = l.weight(p + "routed_expert_up_proj", d, de);
  }
  if (c.num_shared_experts > 0) {
    m.shared = load_mlp(l, p + "shared_experts.", "gate_proj", "up_proj", "down_proj", d,
                        width * c.num_shared_experts);
    m.has_shared = true;
  }
  return m;
}

}  // namespace

LoadedWeights load_weights(const ModelConfig& c, const TensorSource& ck) {
  LoadedWeights loaded;
  ModelWeights& w = loaded.views;
  const int64_t d = c.hidden_size;
  // The published Kimi K3 keeps the text model under language_model.; the vision tower
  // and projector beside it are never read (text-only serving).
  const std::string& root = c.tensor_prefix;
  w.embed = ck.load_weight(root + "model.embed_tokens", c.vocab_size, d);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    w.lm_head = ck.load_weight(root + "lm_head", c.vocab_size, d);
  }
  w.final_norm = keep(loaded.owned, ck.load_f32(root + "model.norm.weight", {d}));
  if (c.has_attn_res()) {
    const LayerLoader top{c, ck, loaded.owned, root + "model."};
    w.output_res = load_attn_res(top, "output_attn_res", d);
  }
  w.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerLoader l{c, ck, loaded.owned, root + "model.layers." + std::to_string(i) + "."};
    LayerWeights& lw = w.layers[i];
    lw.input_norm = l.vec("input_layernorm.weight", {d});
    lw.post_norm = l.vec("post_attention_layernorm.weight", {d});
    if (c.has_attn_res()) {
      // Layer 0 stores self_attention_res_* too but never mixes before its attention
      // (K3.md §3.2): the bank is still empty there.
      if (i > 0) lw.attn_res = load_attn_res(l, "self_attention_res", d);
      lw.mlp_res = load_attn_res(l, "mlp_res", d);
    }
    if (c.is_kda(i)) {
      lw.kda = load_kda(l);
    } else {
      lw.mla = load_mla(l);
    }
    if (c.is_moe(i)) {
      lw.moe = load_moe(l);
    } else {
      // Dense MLP: mlp.* (deepseek, most kimi checkpoints) or block_sparse_moe.*.
      const std::string p =
          has_weight(l, "block_sparse_moe.gate_proj") ? "block_sparse_moe." : "mlp.";
      lw.dense = load_mlp(l, p, "gate_proj", "up_proj", "down_proj", d, c.intermediate_size);
    }
  }
  return loaded;
}

}  // namespace hyserve
