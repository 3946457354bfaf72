// Model's token-sharded prefill (DESIGN.md "Parallelism", docs/DECISIONS.md): each MLA
// layer's indexer and attention run with every head on this rank's pieces of the tokens,
// over the whole context of each sequence. Without decode context parallelism that context
// is the (replicated) cache; with it, each sequence's rows are gathered from the DCP group
// into the workspace first (gather_context), so the arithmetic and its bits are those of
// W = 1. Member functions of Model (model.h), kept apart from the head-sharded attention
// in model_attention.cpp.
//
// The gathered context of a sequence of S = num_computed + n positions, W ranks, c =
// ceil(S / W) local rows each (rank d's local row j is position j * W + d; rows of
// positions >= S are never read):
//
//   send (rank d)   | local rows 0 .. c-1 of its pages |                  [c, row]
//   all-gathered    | rank 0's c rows | rank 1's | ... | rank W-1's |     [W, c, row]
//   context         | pos 0 | pos 1 | ... | pos W-1 | pos W | ...   |     [c * W, row]
#include <algorithm>
#include <vector>

#include "core/dcp_position.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "util/error.h"

namespace hyserve {

bool Model::token_sharded(const Pass& pass, int64_t t) const {
  return options_.parallel.tp.size > 1 && options_.token_sharded_prefill > 0 &&
         pass.decode.cache == nullptr && t >= options_.token_sharded_prefill;
}

namespace {

// A run of consecutive tokens of one sequence: batch rows [row, row + n), the sequence's
// tokens [begin, begin + n) of its slice.
struct TokenPiece {
  size_t seq = 0;
  int64_t begin = 0;
  int64_t n = 0;
  int64_t row = 0;
};

// Rank r's pieces: each sequence cut into 2N near-equal pieces, r taking pieces r and
// 2N - 1 - r (causal balance: an early and a late one), in batch order.
std::vector<TokenPiece> token_pieces(std::span<const SequenceSlice> seqs, int rank, int size) {
  std::vector<TokenPiece> out;
  const int64_t parts = 2 * static_cast<int64_t>(size);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceSlice& sq = seqs[i];
    for (const int64_t k : {static_cast<int64_t>(rank), parts - 1 - rank}) {
      const int64_t begin = sq.n * k / parts, end = sq.n * (k + 1) / parts;
      if (end > begin) out.push_back({i, begin, end - begin, sq.offset + begin});
    }
  }
  return out;
}

int64_t count_tokens(const std::vector<TokenPiece>& pieces) {
  int64_t n = 0;
  for (const TokenPiece& p : pieces) n += p.n;
  return n;
}

}  // namespace

// A layer's token-sharded layout: every rank's pieces (the same on every rank), the
// all-to-all blocks of the largest share, this rank's pieces as slices of its m tokens.
struct Model::TokenShards {
  std::vector<std::vector<TokenPiece>> pieces;  // [rank] its pieces, in batch order
  int64_t block = 1;                            // tokens per all-to-all block
  int64_t m = 0;                                // this rank's tokens
  size_t rank = 0;
  std::vector<SequenceSlice> local;  // one per piece of mine: offset into the m rows
  int64_t* pos = nullptr;            // [m] positions of this rank's tokens (workspace)
  int64_t rows() const { return std::max<int64_t>(m, 1); }
  const std::vector<TokenPiece>& mine() const { return pieces[rank]; }
};

// The queries of this rank's tokens with every head and where their outputs go.
struct Model::ShardedQueries {
  IndexQuery iq{nullptr, nullptr};  // the indexer's, [m] rows (sparse backends)
  int32_t* topk = nullptr;          // [m, index_topk] out; null without an indexer
  const float* q = nullptr;         // [m, N * h, dn + dr]
  float* o = nullptr;               // [m, N * h, dv] out (fp32 / bf16 latent)
  bool fp8 = false;                 // the FP8 latent: the DSA kernels' absorbed form
  SparseQueries sparse{};           // its queries and outputs
  // kv_b's LoRA adapters in low-rank form (a device; Model::lora_kv_b_module): this rank's
  // tokens' slots [m]; empty / null otherwise (the host attends with merged copies).
  LoraModule kv_b_lora{};
  const int32_t* lora_slots = nullptr;
};

Model::TokenShards Model::shard_tokens(Pass& pass, const int64_t* pos,
                                       std::span<const SequenceSlice> seqs) const {
  const TensorParallel& tp = options_.parallel.tp;
  TokenShards s;
  s.pieces.resize(static_cast<size_t>(tp.size));
  for (int r = 0; r < tp.size; ++r) {
    s.pieces[static_cast<size_t>(r)] = token_pieces(seqs, r, tp.size);
    s.block = std::max(s.block, count_tokens(s.pieces[static_cast<size_t>(r)]));
  }
  s.rank = static_cast<size_t>(tp.rank);
  s.m = count_tokens(s.mine());
  s.pos = pass.ws.longs(s.rows());
  int64_t at = 0;
  for (const TokenPiece& p : s.mine()) {
    SequenceSlice sq = seqs[p.seq];
    sq.offset = at;
    sq.n = p.n;
    sq.num_computed = seqs[p.seq].num_computed + p.begin;
    s.local.push_back(sq);
    backend_->copy(s.pos + at, pos + p.row, static_cast<size_t>(p.n) * 8);
    at += p.n;
  }
  return s;
}

float* Model::own_token_rows(Pass& pass, const TokenShards& s, const float* src,
                             int64_t width) const {
  float* dst = pass.ws.floats(s.rows() * width);
  int64_t at = 0;
  for (const TokenPiece& p : s.mine()) {
    backend_->copy(dst + at * width, src + p.row * width, static_cast<size_t>(p.n * width) * 4);
    at += p.n;
  }
  return dst;
}

float* Model::tokens_to_own(Pass& pass, const TokenShards& s, const float* x, int64_t width) const {
  const TensorParallel& tp = options_.parallel.tp;
  const int64_t n_ranks = tp.size;
  // Block j of the send buffer is rank j's tokens with this rank's heads.
  float* send = pass.ws.floats(n_ranks * s.block * width);
  float* recv = pass.ws.floats(n_ranks * s.block * width);
  for (int64_t j = 0; j < n_ranks; ++j) {
    int64_t at = 0;
    for (const TokenPiece& p : s.pieces[static_cast<size_t>(j)]) {
      backend_->copy(send + (j * s.block + at) * width, x + p.row * width,
                     static_cast<size_t>(p.n * width) * 4);
      at += p.n;
    }
  }
  tp.comm->all_to_all(send, recv, static_cast<size_t>(s.block * width) * 4);
  float* xa = pass.ws.floats(s.rows() * n_ranks * width);
  for (int64_t i = 0; i < n_ranks; ++i) {
    backend_->copy_2d(
        {xa + i * width, n_ranks * width, recv + i * s.block * width, width, s.m, width});
  }
  return xa;
}

void Model::own_to_tokens(Pass& pass, const TokenShards& s, const float* xa, int64_t width,
                          float* x) const {
  const TensorParallel& tp = options_.parallel.tp;
  const int64_t n_ranks = tp.size;
  // Block j of the send buffer is this rank's tokens with rank j's heads; block i received
  // is rank i's tokens with this rank's heads, placed at their rows of x.
  float* send = pass.ws.floats(n_ranks * s.block * width);
  float* recv = pass.ws.floats(n_ranks * s.block * width);
  for (int64_t j = 0; j < n_ranks; ++j) {
    backend_->copy_2d(
        {send + j * s.block * width, width, xa + j * width, n_ranks * width, s.m, width});
  }
  tp.comm->all_to_all(send, recv, static_cast<size_t>(s.block * width) * 4);
  for (int64_t i = 0; i < n_ranks; ++i) {
    int64_t at = 0;
    for (const TokenPiece& p : s.pieces[static_cast<size_t>(i)]) {
      backend_->copy(x + p.row * width, recv + (i * s.block + at) * width,
                     static_cast<size_t>(p.n * width) * 4);
      at += p.n;
    }
  }
}

void Model::absorb_queries(Pass& pass, int64_t layer, const TokenShards& s,
                           ShardedQueries& qs) const {
  const ModelConfig& c = config_;
  const int64_t kv = c.kv_lora_rank, rows = s.rows();
  const int64_t ha = c.num_attention_heads * options_.parallel.tp.size;
  float* q_lat = pass.ws.floats(rows * ha * kv);
  float* q_pe = pass.ws.floats(rows * ha * c.qk_rope_head_dim);
  backend_->mla_absorb_q({qs.q, &weights_.layers[layer].mla.kv_b_proj, q_lat, q_pe, s.m, ha,
                          c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, kv});
  qs.sparse = {qs.topk,
               s.pos,
               q_lat,
               q_pe,
               pass.ws.floats(rows * ha * kv),
               pass.ws.floats(rows * ha),
               ha,
               pass.ws.ints(rows * c.index_topk),
               pass.ws.ints(rows)};
}

void Model::gathered_dsa_sparse(Pass& pass, int64_t layer, const ContextRows& ctx,
                                const SequenceSlice& sq, const ShardedQueries& qs) const {
  // The gathered latent as pages of the DSA kernels' form: blocks of the cache's block
  // size, one 576-byte row per position, an identity block table.
  CHECK(context_row_bytes()[0] == kDsaLatentDim, "gathered FP8 latent rows of ",
        context_row_bytes()[0], " bytes");
  const int64_t num_keys = sq.num_computed + sq.n;
  DsaCache view = dsa_cache(*sq.cache, layer);
  const int64_t bs = view.block_size, blocks = (num_keys + bs - 1) / bs;
  view.pool = static_cast<const uint8_t*>(ctx.latent);
  view.row_bytes = bs * kDsaLatentDim;
  view.latent_offset = 0;
  view.index_offset = 0;
  view.num_blocks = blocks;
  std::vector<int32_t> identity(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) identity[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  int32_t* table = pass.ws.ints(blocks);
  backend_->upload(table, identity.data(), identity.size() * 4);
  dsa_sparse(view, qs.sparse, sq.offset, sq.n, table, 0, blocks, num_keys);
}

void Model::context_mla(int64_t layer, const ContextRows& ctx, const SequenceSlice& sq,
                        const ShardedQueries& qs, const int64_t* pos, bool absorbed) const {
  const ModelConfig& c = config_;
  const int64_t ha = c.num_attention_heads * options_.parallel.tp.size;
  const int64_t dqk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  // kv_b whole (or a LoRA adapter's merged copy of it); on a device, its adapters in
  // low-rank form.
  const MlaWeights& w = weights_.layers[layer].mla;
  MlaAttentionParams p = mla_params(layer, *sq.cache, lora_kv_b(w, sq.lora_slot, w.kv_b_proj), ha);
  if (!qs.kv_b_lora.empty()) {
    p.lora_slots = qs.lora_slots + sq.offset;
    p.kv_b_lora = qs.kv_b_lora;
  }
  if (p.latent_bf16 != nullptr) {
    p.latent_bf16 = static_cast<const uint16_t*>(ctx.latent);
  } else {
    p.latent = static_cast<const float*>(ctx.latent);
  }
  p.latent_pages = ctx.pages;
  p.q = qs.q + sq.offset * ha * dqk;
  p.q_pos = pos + sq.offset;
  p.topk = qs.topk ? qs.topk + sq.offset * c.index_topk : nullptr;
  p.topk_width = qs.topk ? c.index_topk : 0;
  p.out = qs.o + sq.offset * ha * c.v_head_dim;
  p.num_tokens = sq.n;
  p.num_keys = sq.num_computed + sq.n;
  backend_->mla_attention({p, absorbed});
}

void Model::attend_sequence(Pass& pass, int64_t layer, const TokenShards& s,
                            const ShardedQueries& qs, std::span<const SequenceSlice> seqs,
                            size_t i) const {
  const int64_t k_width = config_.index_topk;
  const bool dcp = options_.parallel.dcp.size > 1;
  const Workspace::Mark mark = pass.ws.mark();
  const ContextRows ctx =
      dcp ? gather_context(pass, layer, seqs[i])
          : cache_context(*seqs[i].cache, seqs[i].cache->pages(seqs[i].blocks), layer);
  for (size_t k = 0; k < s.local.size(); ++k) {
    if (s.mine()[k].seq != i) continue;
    const SequenceSlice& sq = s.local[k];
    const int64_t num_keys = sq.num_computed + sq.n;
    if (qs.topk != nullptr) {
      select_in_context(pass, qs.iq, sq.offset, sq.n, s.pos, num_keys, ctx, 0,
                        /*merge=*/false, qs.topk + sq.offset * k_width);
    }
    if (qs.fp8 && !dcp) {
      dsa_sparse(dsa_cache(*sq.cache, layer), qs.sparse, sq.offset, sq.n, sq.blocks, 0,
                 sq.cache->plan().blocks_for_tokens(num_keys), num_keys);
    } else if (qs.fp8) {
      gathered_dsa_sparse(pass, layer, ctx, sq, qs);
    } else {
      context_mla(layer, ctx, sq, qs, s.pos, attends_absorbed(seqs[i].n));
    }
  }
  pass.ws.rewind(mark);
}

void Model::token_sharded_attention(Pass& pass, int64_t layer, const float* x, const float* q_in,
                                    const float* q, int64_t t, const int64_t* pos,
                                    const int64_t* slots, std::span<const SequenceSlice> seqs,
                                    float* o) const {
  const ModelConfig& c = config_;
  const int64_t h = c.num_attention_heads, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dqk = c.qk_nope_head_dim + dr;
  const int64_t ha = h * options_.parallel.tp.size;
  const TokenShards s = shard_tokens(pass, pos, seqs);

  // The index keys of every token go to the cache (the positions this rank stores); the
  // indexer's queries of this rank's tokens.
  ShardedQueries qs;
  if (attention_.sparse()) {
    const IndexQuery iq = index_query(pass, layer, x, q_in, t, pos, slots, seqs);
    qs.iq = {own_token_rows(pass, s, iq.q, c.index_n_heads * c.index_head_dim),
             own_token_rows(pass, s, iq.head_weights, c.index_n_heads)};
    qs.topk = pass.ws.ints(s.rows() * c.index_topk);
  }

  // (all tokens, h heads) -> (this rank's tokens, all heads).
  qs.q = tokens_to_own(pass, s, q, h * dqk);
  qs.o = pass.ws.floats(s.rows() * ha * dv);
  // The FP8 latent: the DSA kernels' absorbed form over the cache (every head's queries
  // absorbed with the whole kv_b_proj; W_UV after the last piece).
  qs.fp8 = attention_.fp8_latent();
  if (qs.fp8) absorb_queries(pass, layer, s, qs);
  qs.kv_b_lora = lora_kv_b_module(pass, weights_.layers[layer].mla);
  if (!qs.kv_b_lora.empty()) {
    int32_t* own = pass.ws.ints(s.rows());
    int64_t at = 0;
    for (const TokenPiece& p : s.mine()) {
      backend_->copy(own + at, pass.lora_slots + p.row, static_cast<size_t>(p.n) * 4);
      at += p.n;
    }
    qs.lora_slots = own;
  }

  // Sequence by sequence (its context, gathered under DCP, is live for its pieces only):
  // the indexer's top-k and the attention of this rank's tokens with every head, piece by
  // piece, in the form the head-sharded forward gives each sequence (attends_absorbed).
  for (size_t i = 0; i < seqs.size(); ++i) attend_sequence(pass, layer, s, qs, seqs, i);

  if (qs.fp8) {
    backend_->mla_project_uv({qs.sparse.o_lat, &weights_.layers[layer].mla.kv_b_proj, qs.o, s.m, ha,
                              c.qk_nope_head_dim, dv, c.kv_lora_rank});
  }

  // Back: (this rank's tokens, all heads) -> (all tokens, h heads) at their rows of o.
  own_to_tokens(pass, s, qs.o, h * dv, o);
}

Model::ContextRows Model::cache_context(const KvCache& cache, PagedRows pages,
                                        int64_t layer) const {
  ContextRows ctx;
  ctx.latent = cache.latent_page(layer);
  if (config_.has_indexer()) {
    ctx.index_keys = cache.index_page(layer);
    if (options_.indexer_fp8) ctx.index_scales = cache.index_scale_page(layer);
  }
  ctx.pages = pages;
  return ctx;
}

Model::ContextRows Model::gather_context(Pass& pass, int64_t layer, const SequenceSlice& sq) const {
  const ContextParallel& dcp = options_.parallel.dcp;
  const int64_t world = dcp.size;
  // Rows per rank: the most any rank caches (rank 0's), the others' padded to it.
  const int64_t local_rows = dcp_local_count(sq.num_computed + sq.n, 0, world);
  const ContextRows own = cache_context(*sq.cache, sq.cache->pages(sq.blocks), layer);
  const CachePlan& plan = sq.cache->plan();
  const CachePage& page = plan.page(layer);
  const int64_t row_bytes[3] = {page.latent_bytes / plan.block_size, page.index_code_bytes,
                                page.index_scale_bytes};
  const void* pages[3] = {own.latent, own.index_keys, own.index_scales};
  void* out[3] = {nullptr, nullptr, nullptr};
  for (int kind = 0; kind < 3; ++kind) {
    if (pages[kind] != nullptr) out[kind] = pass.ws.bytes(local_rows * world * row_bytes[kind]);
  }
  for (int kind = 0; kind < 3; ++kind) {
    if (pages[kind] == nullptr) continue;
    const int64_t rb = row_bytes[kind];
    const Workspace::Mark mark = pass.ws.mark();
    uint8_t* send = pass.ws.bytes(local_rows * rb);
    uint8_t* recv = pass.ws.bytes(world * local_rows * rb);
    GatherRowsParams g;
    g.src = pages[kind];
    g.src_pages = own.pages;
    g.dst = send;
    g.num_rows = local_rows;
    g.row_bytes = rb;
    g.dst_stride_bytes = rb;
    backend_->gather_rows(g);
    dcp.comm->all_gather(send, recv, static_cast<size_t>(local_rows * rb));
    // Rank r's local row j is position dcp_position(j, r, W): every W-th row of the context
    // from r.
    for (int64_t r = 0; r < world; ++r) {
      g.src = recv + r * local_rows * rb;
      g.src_pages = {};
      g.dst = static_cast<uint8_t*>(out[kind]) + r * rb;
      g.dst_stride_bytes = world * rb;
      backend_->gather_rows(g);
    }
    pass.ws.rewind(mark);
  }
  return {out[0], out[1], static_cast<const float*>(out[2]), PagedRows{}};
}

std::array<int64_t, 3> Model::context_row_bytes() const {
  const CachePlan plan = cache_plan();
  if (plan.pages.empty()) return {0, 0, 0};
  const CachePage& page = plan.pages.front();
  return {page.latent_bytes / plan.block_size, page.index_code_bytes, page.index_scale_bytes};
}

int64_t Model::gathered_context_bytes(int64_t num_positions) const {
  const int64_t world = options_.parallel.dcp.size;
  if (world == 1 || options_.token_sharded_prefill == 0 || options_.parallel.tp.size == 1) return 0;
  // The context of every kind, live through the layer's attention, and the send and receive
  // buffers of one kind at a time; each take may be rounded up to the workspace's alignment.
  const int64_t local_rows = dcp_local_count(num_positions, 0, world);
  constexpr auto kAlign = static_cast<int64_t>(Workspace::kAlignBytes);
  int64_t live = 0, transient = 0;
  for (const int64_t rb : context_row_bytes()) {
    if (rb == 0) continue;
    live += local_rows * world * rb + kAlign;
    transient = std::max(transient, (local_rows + world * local_rows) * rb + 2 * kAlign);
  }
  return live + transient;
}

void Model::select_in_context(Pass& pass, const IndexQuery& iq, int64_t offset, int64_t n,
                              const int64_t* pos, int64_t num_keys, const ContextRows& ctx,
                              int64_t table_stride, bool merge, int32_t* selected) const {
  const ModelConfig& c = config_;
  const int64_t hi = c.index_n_heads, di = c.index_head_dim, k = c.index_topk;
  const Workspace::Mark mark = pass.ws.mark();
  const int64_t chunk = std::min(n, kIndexerQueryChunk);
  float* scores = pass.ws.floats(chunk * num_keys);
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t m = std::min(chunk, n - b);
    const int64_t row = offset + b;
    // The fields both scorers share: queries row .. row + m against the context's keys.
    const auto fill = [&](auto& p) {
      p.q = iq.q + row * hi * di;
      p.k_pages = ctx.pages.for_query(b, table_stride);
      p.table_stride = table_stride;
      p.head_weights = iq.head_weights + row * hi;
      p.q_pos = pos + row;
      p.scores = scores;
      p.num_tokens = m;
      p.num_keys = num_keys;
      p.num_heads = hi;
      p.head_dim = di;
    };
    if (options_.indexer_fp8) {
      IndexerFp8CacheScoreParams p;
      fill(p);
      p.k_fp8 = static_cast<const uint8_t*>(ctx.index_keys);
      p.k_scales = ctx.index_scales;
      backend_->indexer_scores_fp8_cache(p);
    } else {
      IndexerScoreParams p;
      fill(p);
      p.k = static_cast<const float*>(ctx.index_keys);
      backend_->indexer_scores(p);
    }
    backend_->causal_topk({scores, pos + row, m, num_keys, k, selected + b * k});
    if (merge) merge_selection(pass, scores, num_keys, m, k, selected + b * k);
  }
  pass.ws.rewind(mark);
}

}  // namespace hyserve
