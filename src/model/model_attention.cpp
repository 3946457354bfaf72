// Model's full-attention layers (MODEL.md §2, §3): MLA over the latent cache and the DSA
// lightning indexer, and the cache writes they make. Member functions of Model (model.h),
// kept apart from the decoder's sequence of layers in model.cpp.
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/topk_merge.h"
#include "util/error.h"

namespace hyserve {

void Model::write_cache(CacheRows kind, int64_t layer, const void* rows, int64_t row_bytes,
                        const int64_t* slots, std::span<const SequenceSlice> seqs) const {
  // One scatter per run of consecutive sequences that share a cache (the engine's
  // batches: one).
  for (size_t i = 0; i < seqs.size();) {
    size_t j = i + 1;
    while (j < seqs.size() && seqs[j].cache == seqs[i].cache) ++j;
    const KvCache& cache = *seqs[i].cache;
    ScatterRowsParams p;
    p.src = static_cast<const uint8_t*>(rows) + seqs[i].offset * row_bytes;
    p.slots = slots + seqs[i].offset;
    switch (kind) {
      case CacheRows::kLatent:
        p.dst = cache.latent_page(layer);
        break;
      case CacheRows::kIndexKeys:
        p.dst = cache.index_page(layer);
        break;
      case CacheRows::kIndexScales:
        p.dst = cache.index_scale_page(layer);
        break;
    }
    p.num_rows = seqs[j - 1].offset + seqs[j - 1].n - seqs[i].offset;
    p.row_bytes = row_bytes;
    p.block_size = cache.block_size();
    p.block_stride_bytes = cache.plan().row_bytes;
    backend_->scatter_rows(p);
    i = j;
  }
}

void Model::mla_attention(Pass& pass, int64_t layer, const float* x, int64_t t, const int64_t* pos,
                          const int64_t* slots, std::span<const SequenceSlice> seqs,
                          float* out) const {
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t h = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, kv = c.kv_lora_rank, dqk = dn + dr, width = kv + dr;

  // The projections of x, in one call: q_a (or q), kv_a and, kimi_k3, the output gate.
  const Weight& q_in_proj = c.q_lora_rank > 0 ? w.q_a_proj : w.q_proj;
  const std::vector<float*> px = c.mla_output_gate
                                     ? project(pass, x, t, {&q_in_proj, &w.kv_a_proj, &w.g_proj})
                                     : project(pass, x, t, {&q_in_proj, &w.kv_a_proj});

  // 1. q = q_b_proj(rms(q_a_proj(x))) or q_proj(x): [T, H, dn+dr]
  const float* q_lat = x;  // the indexer's query input: [T, q_lora] (or x)
  float* q;
  if (c.q_lora_rank > 0) {
    float* qa = px[0];
    rms_norm(qa, w.q_a_norm, t, c.q_lora_rank, c.kv_norm_eps, qa);
    q_lat = qa;
    q = linear(pass, qa, t, w.q_b_proj);
  } else {
    q = px[0];
  }

  // 2. [c | k_pe] = kv_a_proj_with_mqa(x): [T, kv + dr]; c = rms(c).
  float* ckv = px[1];
  {
    float* cn = pass.ws.floats(t * kv);
    backend_->copy_2d({cn, kv, ckv, width, t, kv});
    rms_norm(cn, w.kv_a_norm, t, kv, c.kv_norm_eps, cn);
    backend_->copy_2d({ckv, width, cn, kv, t, kv});
  }

  // 3. RoPE on q_pe and k_pe (deepseek_v32, interleaved pairs); kimi_* are NoPE.
  if (c.rope.enabled) {
    RopeParams rq{q, pos, t, h, dqk, dn};
    backend_->rope({&rope_, rq, /*neox=*/false});
    RopeParams rk{ckv, pos, t, 1, width, kv};
    backend_->rope({&rope_, rk, /*neox=*/false});
  }
  dump(layer_name(layer, "q"), q, t, h * dqk);
  dump(layer_name(layer, "latent"), ckv, t, width);

  // 5. Write the new latents [c | k_pe] into their cache slots: fp32, bf16, or e4m3 codes
  //    of value / latent_scale.
  float* o = pass.ws.floats(t * h * dv);
  if (options_.latent_cache == LatentCacheDtype::kFp8) {
    uint8_t* codes = pass.ws.bytes(t * width);
    backend_->quantize_e4m3({ckv, t * width, 1.0f / kLatentScale, codes});
    write_cache(CacheRows::kLatent, layer, codes, width, slots, seqs);
  } else if (options_.latent_cache == LatentCacheDtype::kBf16) {
    auto* bits = reinterpret_cast<uint16_t*>(pass.ws.bytes(t * width * 2));
    backend_->round_bf16({ckv, t * width, bits});
    write_cache(CacheRows::kLatent, layer, bits, width * 2, slots, seqs);
  } else {
    write_cache(CacheRows::kLatent, layer, ckv, width * 4, slots, seqs);
  }
  // 6. Attention, by the backend chosen at load: over the FP8 latent on the DSA kernels
  //    (dsa_fp8, dsa_fp8_fused), else MLA over the fp32 / bf16 latent (mla, mla_sparse).
  if (attention_.fp8_latent()) {
    dsa_attention(pass, layer, x, q_lat, q, t, pos, slots, seqs, o);
  } else {
    latent_attention(pass, layer, x, q_lat, q, t, pos, slots, seqs, o);
  }
  dump(layer_name(layer, "attn"), o, t, h * dv);

  // 7. kimi_k3: o *= sigmoid(g_proj(x)).
  if (c.mla_output_gate) backend_->sigmoid_gate({o, px[2], t * h * dv});
  linear_into(pass, o, t, w.o_proj, out);
}

void Model::latent_attention(Pass& pass, int64_t layer, const float* x, const float* q_in,
                             const float* q, int64_t t, const int64_t* pos, const int64_t* slots,
                             std::span<const SequenceSlice> seqs, float* o) const {
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t h = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dqk = dn + dr;
  // Decode context parallelism: this rank attends with its group's heads (ha) over its own
  // positions; causal bounds among them (cpos), key counts local_keys().
  const ContextParallel& dcp = options_.parallel.dcp;
  const int64_t world = dcp.size;
  const int64_t ha = h * world;
  const int64_t* cpos = world > 1 ? pass.dcp_pos : pos;
  if (token_sharded(pass, t)) {
    token_sharded_attention(pass, layer, x, q_in, q, t, pos, slots, seqs, o);
    return;
  }
  // The kv_b rows of the heads this rank attends with: its own, or its DCP group's (a view
  // of the rank's kv_b_proj, or of a LoRA adapter's merged copy of it).
  const int kv_b_share = static_cast<int>(world);

  // mla_sparse: the DSA indexer's top-k past positions per token.
  const int32_t* topk = nullptr;
  if (attention_.sparse()) {
    const IndexQuery iq = index_query(pass, layer, x, q_in, t, pos, slots, seqs);
    topk = index_select(pass, layer, iq, t, cpos, seqs);
  }

  // The group's queries [T, ha, dqk] (rank r's heads at [r * h, (r + 1) * h)), and room for
  // the partial outputs and their log-sum-exp.
  const float* qa = q;
  float* oa = o;
  float* lse = nullptr;
  if (world > 1) {
    qa = group_queries(pass, q, t, h, dqk);
    oa = pass.ws.floats(t * ha * dv);
    lse = pass.ws.floats(t * ha);
  }

  // 6. Attention of each sequence over its cached latents (expanded for prefill,
  //    absorbed for decode and, batch-invariant, for prefill too: attends_absorbed).
  // Queries [offset, offset + n) over num_keys keys of `cache` through `pages`.
  // A sequence with a LoRA adapter on kv_b attends with its adapter's merged kv_b (host), or
  // the op applies each token's adapter in low-rank form (a device: kv_b_lora).
  const LoraModule kv_b_lora = lora_kv_b_module(pass, w);
  // first_pos: the first query's position when the queries are a sequence's consecutive
  // positions (a prefill slice without DCP), else -1 (MlaAttentionParams::q_pos_first).
  auto attend = [&](int64_t offset, int64_t n, int64_t num_keys, const KvCache& cache,
                    PagedRows pages, int64_t table_stride, bool absorbed, int32_t lora_slot,
                    int64_t first_pos) {
    const Weight own = own_kv_b(lora_kv_b(w, lora_slot, w.kv_b_proj), kv_b_share);
    MlaAttentionParams p = mla_params(layer, cache, own, ha);
    if (!kv_b_lora.empty()) {
      p.lora_slots = pass.lora_slots + offset;
      p.kv_b_lora = kv_b_lora;
      p.kv_b_lora_row0 = own_kv_b_row0(w.kv_b_proj, kv_b_share);
    }
    p.q = qa + offset * ha * dqk;
    p.latent_pages = pages;
    p.table_stride = table_stride;
    p.q_pos = cpos + offset;
    p.q_pos_first = first_pos;
    p.topk = topk ? topk + offset * c.index_topk : nullptr;
    p.topk_width = topk ? c.index_topk : 0;
    p.out = oa + offset * ha * dv;
    p.lse = lse ? lse + offset * ha : nullptr;
    p.num_tokens = n;
    p.num_keys = num_keys;
    backend_->mla_attention({p, absorbed});
  };
  const BatchedDecode& bd = pass.decode;
  if (bd.cache != nullptr && !lora_splits_kv_b(w, seqs)) {
    attend(0, t, local_keys(bd.max_keys), *bd.cache, bd.cache->pages(bd.tables), bd.table_stride,
           /*absorbed=*/true, -1, -1);
  } else if (bd.cache != nullptr) {
    // Decode rows of sequences whose kv_b differ (LoRA on kv_b): one call per sequence, each
    // query row (a token) still reading its own row of the batch's tables.
    for (const SequenceSlice& sq : seqs) {
      attend(sq.offset, sq.n, local_keys(bd.max_keys), *bd.cache,
             bd.cache->pages(bd.tables + sq.offset * bd.table_stride), bd.table_stride,
             /*absorbed=*/true, sq.lora_slot, -1);
    }
  } else {
    for (const SequenceSlice& sq : seqs) {
      attend(sq.offset, sq.n, local_keys(sq.num_computed + sq.n), *sq.cache,
             sq.cache->pages(sq.blocks), 0, attends_absorbed(sq.n), sq.lora_slot,
             world > 1 ? -1 : sq.num_computed);
    }
  }
  if (world > 1) merge_partials(pass, oa, lse, t, h, dv, o);
}

int64_t Model::local_keys(int64_t num_positions) const {
  return options_.parallel.dcp.local_count(num_positions);
}

void Model::merge_partials(Pass& pass, const float* oa, const float* lse, int64_t t, int64_t h,
                           int64_t dv, float* o) const {
  // Rank r's heads of every rank's partial results go to rank r (all-to-all), which merges
  // them in rank order: [T, W * h, dv] -> W blocks [T, h, dv] -> [W, T, h, dv] received.
  const ContextParallel& dcp = options_.parallel.dcp;
  const int64_t world = dcp.size, ha = h * world;
  float* send_o = pass.ws.floats(world * t * h * dv);
  float* send_l = pass.ws.floats(world * t * h);
  for (int64_t r = 0; r < world; ++r) {
    backend_->copy_2d({send_o + r * t * h * dv, h * dv, oa + r * h * dv, ha * dv, t, h * dv});
    backend_->copy_2d({send_l + r * t * h, h, lse + r * h, ha, t, h});
  }
  float* parts = pass.ws.floats(world * t * h * dv);
  float* lses = pass.ws.floats(world * t * h);
  dcp.comm->all_to_all(send_o, parts, static_cast<size_t>(t * h * dv) * 4);
  dcp.comm->all_to_all(send_l, lses, static_cast<size_t>(t * h) * 4);
  AttentionMergeParams m;
  m.parts = parts;
  m.lses = lses;
  m.num_parts = world;
  m.rows = t * h;
  m.width = dv;
  m.out = o;
  backend_->attention_merge(m);
}

MlaAttentionParams Model::mla_params(int64_t layer, const KvCache& cache, const Weight& kv_b,
                                     int64_t heads) const {
  const ModelConfig& c = config_;
  MlaAttentionParams p;
  if (options_.latent_cache == LatentCacheDtype::kBf16) {
    p.latent_bf16 = reinterpret_cast<const uint16_t*>(cache.latent_page(layer));
  } else {
    p.latent = cache.latent_page(layer);
  }
  p.kv_b = &kv_b;
  p.num_heads = heads;
  p.dn = c.qk_nope_head_dim;
  p.dr = c.qk_rope_head_dim;
  p.dv = c.v_head_dim;
  p.kv_lora = c.kv_lora_rank;
  p.softmax_scale = static_cast<float>(c.mla_softmax_scale());
  return p;
}

int Model::kv_b_ranks() const {
  if (options_.token_sharded_prefill > 0 && options_.parallel.tp.size > 1)
    return options_.parallel.tp.size;
  return options_.parallel.dcp.size;
}

Weight Model::own_kv_b(const MlaWeights& w, int ranks) const {
  return own_kv_b(w.kv_b_proj, ranks);
}

Weight Model::own_kv_b(const Weight& held, int ranks) const {
  // The rank keeps the heads of the `held` ranks around it; this rank's `ranks` of them are
  // share (rank % held) / ranks.
  const int kept = kv_b_ranks();
  if (ranks == kept) return held;
  return row_shard(held, options_.parallel.tp.rank % kept / ranks, kept / ranks, "kv_b_proj");
}

int64_t Model::own_kv_b_row0(const Weight& held, int ranks) const {
  const int kept = kv_b_ranks();
  if (ranks == kept) return 0;
  return (options_.parallel.tp.rank % kept / ranks) * (held.rows / (kept / ranks));
}

Model::IndexQuery Model::index_query(Pass& pass, int64_t layer, const float* x, const float* q_in,
                                     int64_t t, const int64_t* pos, const int64_t* slots,
                                     std::span<const SequenceSlice> seqs) const {
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t hi = c.index_n_heads, di = c.index_head_dim;

  // 1. qi = wq_b(q latent) [T, Hi, di]; ki = k_norm(wk(x)) [T, di]
  float* qi = linear(pass, q_in, t, w.idx_wq_b);
  // wk and weights_proj of x in one call.
  const std::vector<float*> px = project(pass, x, t, {&w.idx_wk, &w.idx_weights_proj});
  float* ki = px[0];
  LayerNormParams ln;
  ln.x = ki;
  ln.weight = w.idx_k_norm_w.data;
  ln.bias = w.idx_k_norm_b.data;
  ln.y = ki;
  ln.num_rows = t;
  ln.dim = di;
  ln.eps = static_cast<float>(c.index_k_norm_eps);
  backend_->layer_norm(ln);
  // 2. deepseek_v32: half-split RoPE on the first dims, layout [pe | nope].
  if (c.index_rope_dims > 0) {
    RopeParams rq{qi, pos, t, hi, di, 0};
    backend_->rope({&rope_, rq, /*neox=*/true});
    RopeParams rk{ki, pos, t, 1, di, 0};
    backend_->rope({&rope_, rk, /*neox=*/true});
  }
  // 5. w_h = weights_proj(x)_h * Hi^-0.5 * di^-0.5
  float* hw = px[1];
  backend_->scale({hw, t * hi, 1.0f / std::sqrt(static_cast<float>(hi * di))});
  // 3. FP8 path: Hadamard on both sides (keys are cached quantized below).
  if (options_.indexer_fp8) {
    backend_->hadamard_rotate({qi, t * hi, di});
    backend_->hadamard_rotate({ki, t, di});
  }
  dump(layer_name(layer, "indexer.q"), qi, t, hi * di);
  dump(layer_name(layer, "indexer.k"), ki, t, di);

  // 4. Write the new index keys into their cache slots (quantized on the FP8 path).
  if (options_.indexer_fp8) {
    uint8_t* codes = pass.ws.bytes(t * di);
    float* scales = pass.ws.floats(t);
    backend_->quantize_fp8_ue8m0({ki, t, di, codes, scales});
    write_cache(CacheRows::kIndexKeys, layer, codes, di, slots, seqs);
    write_cache(CacheRows::kIndexScales, layer, scales, 4, slots, seqs);
  } else {
    write_cache(CacheRows::kIndexKeys, layer, ki, di * 4, slots, seqs);
  }
  return {qi, hw};
}

int32_t* Model::index_select(Pass& pass, int64_t layer, const IndexQuery& iq, int64_t t,
                             const int64_t* pos, std::span<const SequenceSlice> seqs) const {
  const int64_t k = config_.index_topk;
  int32_t* selected = pass.ws.ints(t * k);
  const bool merge = options_.parallel.dcp.size > 1;
  if (pass.decode.cache != nullptr) {
    const KvCache& cache = *pass.decode.cache;
    select_in_context(pass, iq, 0, t, pos, local_keys(pass.decode.max_keys),
                      cache_context(cache, cache.pages(pass.decode.tables), layer),
                      pass.decode.table_stride, merge, selected);
  } else {
    for (const SequenceSlice& sq : seqs) {
      select_in_context(pass, iq, sq.offset, sq.n, pos, local_keys(sq.num_computed + sq.n),
                        cache_context(*sq.cache, sq.cache->pages(sq.blocks), layer), 0, merge,
                        selected + sq.offset * k);
    }
  }
  return selected;
}

void Model::merge_selection(Pass& pass, const float* scores, int64_t num_keys, int64_t rows,
                            int64_t k, int32_t* selected) const {
  const Workspace::Mark mark = pass.ws.mark();
  TopkMergeParams p = parallel::topk_merge_params(
      scores, num_keys, selected, rows, k, options_.parallel.dcp.rank, options_.parallel.dcp.size);
  const parallel::MergeScratch scratch = parallel::bind_merge_scratch(
      p, pass.ws.bytes(static_cast<int64_t>(parallel::merge_scratch_bytes(p))));
  parallel::merge_topk_steps(*backend_, *options_.parallel.dcp.comm, p, scratch);
  pass.ws.rewind(mark);
}

std::vector<std::string> Model::kernel_plan() const {
  const ModelConfig& c = config_;
  const char* experts = c.expert_format == ExpertFormat::kInt4       ? "INT4"
                        : c.expert_format == ExpertFormat::kMxfp4    ? "MXFP4"
                        : c.expert_format == ExpertFormat::kFp8Block ? "FP8 block"
                                                                     : "bf16";
  const std::string act = config_.situ ? "SiTU" : "SiLU";
  const auto attention = [&](int64_t layer) -> std::string {
    if (c.is_kda(layer)) {
      return str_cat("KDA (", c.linear_num_heads, " heads; ",
                     options_.batch_invariant ? "recurrent prefill and decode, "
                                              : "chunked prefill, recurrent decode, ",
                     c.kda_gate_lower_bound > 0 ? "bounded" : "softplus", " gate)");
    }
    std::string s = str_cat("MLA (", c.num_attention_heads, " heads, ",
                            latent_cache_dtype_name(options_.latent_cache), " latent");
    if (c.has_indexer()) {
      s += str_cat("; DSA top-", c.index_topk, " over ", options_.indexer_fp8 ? "FP8" : "fp32",
                   " index keys");
    }
    return str_cat(s, "; attention backend ", attention_.describe(), ")");
  };
  const auto mlp = [&](int64_t layer) -> std::string {
    if (!c.is_moe(layer)) return "dense " + act + " MLP";
    return str_cat("MoE ", c.num_experts, " experts top-", c.num_experts_per_tok, " (", experts,
                   c.moe_latent_size > 0 ? str_cat(", latent ", c.moe_latent_size) : "", ", ", act,
                   ")");
  };
  std::vector<std::pair<std::string, std::vector<int64_t>>> groups;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string ops = attention(layer) + " + " + mlp(layer);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == ops; });
    if (it == groups.end()) {
      groups.push_back({ops, {layer}});
    } else {
      it->second.push_back(layer);
    }
  }
  std::vector<std::string> lines;
  for (const auto& [ops, layers] : groups) {
    std::string list;
    for (size_t i = 0; i < layers.size();) {
      size_t j = i;
      while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
      if (!list.empty()) list += ", ";
      list += j == i ? std::to_string(layers[i]) : str_cat(layers[i], "-", layers[j]);
      i = j + 1;
    }
    lines.push_back(str_cat(layers.size() == 1 ? "layer " : "layers ", list, ": ", ops));
  }
  // Parallelism, when there is any: how the MLA layers split their work.
  const TensorParallel& tp = options_.parallel.tp;
  if (tp.size > 1) {
    std::string s = str_cat("parallel: TP rank ", tp.rank, " of ", tp.size,
                            options_.parallel.expert_parallel ? ", whole experts per rank" : "");
    if (options_.parallel.dcp.size > 1) {
      s += str_cat("; DCP ", options_.parallel.dcp.size, " (position p on rank p % ",
                   options_.parallel.dcp.size, ", log-sum-exp merge",
                   c.has_indexer() ? ", exact top-k merge, decode without graphs" : "", ")");
    }
    if (options_.token_sharded_prefill > 0) {
      s +=
          str_cat("; prefill steps of >= ", options_.token_sharded_prefill, " tokens token-sharded",
                  options_.parallel.dcp.size > 1 ? " over the gathered context" : "");
    }
    lines.push_back(s);
  }
  return lines;
}

bool Model::decode_capturable() const {
  return options_.parallel.dcp.size == 1 || !config_.has_indexer();
}

DsaCache Model::dsa_cache(const KvCache& cache, int64_t layer) const {
  const CachePlan& plan = cache.plan();
  const CachePage& page = plan.page(layer);
  DsaCache d;
  d.pool = cache.base();
  d.row_bytes = plan.row_bytes;
  d.latent_offset = page.latent_offset;
  d.index_offset = page.index_offset;
  d.num_blocks = cache.num_blocks() + 1;  // the scratch row too (padding rows read it)
  d.block_size = static_cast<int32_t>(plan.block_size);
  d.latent_scale = kLatentScale;
  return d;
}

void Model::dsa_attention(Pass& pass, int64_t layer, const float* x, const float* q_in,
                          const float* q, int64_t t, const int64_t* pos, const int64_t* slots,
                          std::span<const SequenceSlice> seqs, float* o) const {
  if (token_sharded(pass, t)) {
    token_sharded_attention(pass, layer, x, q_in, q, t, pos, slots, seqs, o);
    return;
  }
  const ModelConfig& c = config_;
  const MlaWeights& w = weights_.layers[layer].mla;
  const int64_t h = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, kv = c.kv_lora_rank, k = c.index_topk;
  const auto softmax_scale = static_cast<float>(c.mla_softmax_scale());
  // Decode context parallelism, as in latent_attention: the group's heads (ha) over this
  // rank's positions (causal bounds cpos, key counts local_keys), merged by log-sum-exp in
  // the latent space (W_UV is linear) before this rank's heads go through W_UV.
  const int64_t world = options_.parallel.dcp.size, ha = h * world;
  const int64_t* cpos = world > 1 ? pass.dcp_pos : pos;
  const float* qa = world > 1 ? group_queries(pass, q, t, h, dn + dr) : q;

  // Absorbed form (MODEL.md §2.6): q_lat = q_nope W_UK [T, Ha, kv], q_pe [T, Ha, dr].
  float* q_lat = pass.ws.floats(t * ha * kv);
  float* q_pe = pass.ws.floats(t * ha * dr);
  const Weight kv_b_group = own_kv_b(w, static_cast<int>(world));
  backend_->mla_absorb_q({qa, &kv_b_group, q_lat, q_pe, t, ha, dn, dr, dv, kv});
  float* o_lat = pass.ws.floats(t * ha * kv);  // [T, Ha, kv] softmax(logit) @ c
  float* lse = pass.ws.floats(t * ha);

  const IndexQuery iq = index_query(pass, layer, x, q_in, t, pos, slots, seqs);
  if (pass.decode.cache != nullptr && use_dsa_decode()) {
    // A decode batch: indexer (FP8 query, MODEL.md §3.4-3.6) -> top-k -> sparse MLA as
    // one DSA step, each sequence a request with its own block-table row.
    const int64_t hi = c.index_n_heads;
    uint8_t* q8 = pass.ws.bytes(t * hi * kDsaIndexDim);
    float* q_scales = pass.ws.floats(t * hi);
    backend_->quantize_fp8_ue8m0({iq.q, t * hi, kDsaIndexDim, q8, q_scales});
    backend_->mul({iq.head_weights, q_scales, t * hi});  // weights * q scale
    DsaDecodeParams p;
    p.cache = dsa_cache(*pass.decode.cache, layer);
    p.batch = {pass.decode.tables,  pass.decode.seq_lens, t, pass.decode.table_stride, 1,
               pass.decode.max_keys};
    p.index_q8 = q8;
    p.index_weights = iq.head_weights;
    p.index_num_heads = hi;
    p.topk = k;
    p.q_lat = q_lat;
    p.q_pe = q_pe;
    p.num_heads = h;
    p.softmax_scale = softmax_scale;
    p.o_lat = o_lat;
    p.lse = lse;
    backend_->dsa_decode(p);
  } else {
    // The generic indexer's positions (this rank's share of the group's top-k under DCP),
    // turned into slots; every token a sparse-MLA request of one query (seq_lens =
    // position + 1, local). The sparse kernel reads the slots and seq_lens only;
    // block_tables is the sequence's own table, for the checks.
    const int32_t* topk = index_select(pass, layer, iq, t, cpos, seqs);
    const SparseQueries sparse{
        topk, cpos, q_lat, q_pe, o_lat, lse, ha, pass.ws.ints(t * k), pass.ws.ints(t)};
    auto attend = [&](int64_t offset, int64_t n, const KvCache& cache, const int32_t* table,
                      int64_t table_stride, int64_t max_blocks, int64_t max_context) {
      dsa_sparse(dsa_cache(cache, layer), sparse, offset, n, table, table_stride, max_blocks,
                 max_context);
    };
    if (pass.decode.cache != nullptr) {
      attend(0, t, *pass.decode.cache, pass.decode.tables, pass.decode.table_stride,
             pass.decode.table_stride, local_keys(pass.decode.max_keys));
    } else {
      for (const SequenceSlice& sq : seqs) {
        const int64_t keys = sq.num_computed + sq.n;
        attend(sq.offset, sq.n, *sq.cache, sq.blocks, 0, sq.cache->plan().blocks_for_tokens(keys),
               local_keys(keys));
      }
    }
  }
  float* o_own = o_lat;
  if (world > 1) {
    o_own = pass.ws.floats(t * h * kv);
    merge_partials(pass, o_lat, lse, t, h, kv, o_own);
  }
  dump(layer_name(layer, "attn_latent"), o_own, t, h * kv);
  // o = W_UV o_lat per head (this rank's).
  const Weight kv_b = own_kv_b(w);
  backend_->mla_project_uv({o_own, &kv_b, o, t, h, dn, dv, kv});
}

void Model::dsa_sparse(const DsaCache& cache, const SparseQueries& q, int64_t offset, int64_t n,
                       const int32_t* table, int64_t table_stride, int64_t max_blocks,
                       int64_t max_context) const {
  const ModelConfig& c = config_;
  const int64_t kv = c.kv_lora_rank, dr = c.qk_rope_head_dim, k = c.index_topk, ha = q.heads;
  DsaQuerySlotsParams s;
  s.positions = q.topk + offset * k;
  s.q_pos = q.q_pos + offset;
  s.block_table = table;
  s.table_stride = table_stride;
  s.block_size = cache.block_size;
  s.num_tokens = n;
  s.topk = k;
  s.slots = q.slots + offset * k;
  s.seq_lens = q.seq_lens + offset;
  backend_->dsa_query_slots(s);
  for (int64_t b = offset; b < offset + n; b += kDsaQueryChunk) {
    const int64_t m = std::min(kDsaQueryChunk, offset + n - b);
    const int32_t* rows = table + (table_stride > 0 ? (b - offset) * table_stride : 0);
    DsaMlaParams p;
    p.cache = cache;
    p.batch = {rows, q.seq_lens + b, m, max_blocks, 1, max_context};
    p.q_lat = q.q_lat + b * ha * kv;
    p.q_pe = q.q_pe + b * ha * dr;
    p.slots = q.slots + b * k;
    p.topk_width = k;
    p.num_heads = ha;
    p.softmax_scale = static_cast<float>(c.mla_softmax_scale());
    p.o_lat = q.o_lat + b * ha * kv;
    p.lse = q.lse + b * ha;
    backend_->dsa_mla_decode(p);
  }
}

const float* Model::group_queries(Pass& pass, const float* q, int64_t t, int64_t h,
                                  int64_t dq) const {
  const ContextParallel& dcp = options_.parallel.dcp;
  const int64_t world = dcp.size, ha = h * world;
  float* gathered = pass.ws.floats(world * t * h * dq);
  dcp.comm->all_gather(q, gathered, static_cast<size_t>(t * h * dq) * 4);
  float* all = pass.ws.floats(t * ha * dq);
  for (int64_t r = 0; r < world; ++r) {
    backend_->copy_2d({all + r * h * dq, ha * dq, gathered + r * t * h * dq, h * dq, t, h * dq});
  }
  return all;
}

}  // namespace hyserve
