#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/dcp_position.h"
#include "parallel/communicator.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {
namespace {

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

// Cache slot of new token j of a sequence on the rank that stores it: the caller's slot
// mapping, or from its blocks (its local slot, core/dcp_position.h, kv/block_table.h).
int64_t slot_of(const SequenceInput& in, size_t j, const CachePlan& plan) {
  if (!in.slots.empty()) return in.slots[j];
  return slot_index(in.blocks.data(), plan.block_size,
                    dcp_local_slot(in.num_computed + static_cast<int64_t>(j), plan.options.dcp));
}

}  // namespace

std::string Model::layer_name(int64_t layer, const char* what) {
  return "layers." + std::to_string(layer) + "." + what;
}

Model::Model(ModelConfig config, std::unique_ptr<TensorSource> source, ModelOptions options,
             std::unique_ptr<Backend> backend)
    : full_config_(std::move(config)),
      config_(
          shard_config(full_config_, options.parallel.tp.size, options.parallel.expert_parallel)),
      vocab_(
          vocab_shard(full_config_.vocab_size, options.parallel.tp.rank, options.parallel.tp.size)),
      source_(std::move(source)),
      options_(options),
      backend_(std::move(backend)) {
  // The cache formats first: a refused one costs no weight loading.
  const LatentCacheDtype latent = options_.latent_cache;
  CHECK(latent == LatentCacheDtype::kFp32 || latent == LatentCacheDtype::kBf16 ||
            latent == LatentCacheDtype::kFp8,
        "--kv-cache-dtype ", latent_cache_dtype_name(latent),
        ": the model caches MLA latents as fp32, bf16 or fp8 only");
  // The attention backend (it refuses the FP8 latent for a model the DSA kernels cannot
  // read), then the layout.
  attention_ = choose_attention_backend(
      config_,
      {latent, options_.indexer_fp8, options_.parallel.dcp.size, options_.attention_backend});
  options_.parallel.validate();
  const TensorParallel& tp = options_.parallel.tp;
  CHECK(options_.token_sharded_prefill >= 0, "token_sharded_prefill ",
        options_.token_sharded_prefill);
  if (options_.token_sharded_prefill > 0 && tp.size > 1) {
    CHECK(latent != LatentCacheDtype::kFp8 || config_.num_attention_heads * tp.size <= 128,
          "token-sharded prefill over the FP8 latent attends with all ",
          config_.num_attention_heads * tp.size,
          " heads on each rank; the DSA kernels take "
          "at most 128");
  }
  host_weights_ = load_rank_weights(*source_);
  weights_ = host_weights_.views;
  place_weights(nullptr);
  rope_ = make_rope_table(config_);
  if (config_.situ) {
    activation_.kind = GatedActivation::Kind::kSitu;
    activation_.beta = static_cast<float>(config_.situ_beta);
    activation_.linear_beta = static_cast<float>(config_.situ_linear_beta);
  }
  cache_options_.latent = latent;
  cache_options_.index = options_.indexer_fp8 ? IndexCacheDtype::kFp8 : IndexCacheDtype::kFp32;
  cache_options_.tp = tp.size;
  cache_options_.dcp = options_.parallel.dcp.size;
  backend_->set_batch_invariant(options_.batch_invariant);
  backend_->set_cpu_gemm(options_.cpu_gemm);
}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, ModelOptions options,
                                   std::unique_ptr<Backend> backend) {
  ModelConfig config = ModelConfig::load(dir);
  if (const std::string w = config.unknown_fields_warning(); !w.empty())
    log::warn("{}: {}", dir.string(), w);
  auto checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  return create(std::move(config), std::move(checkpoint), options, std::move(backend));
}

std::unique_ptr<Model> Model::create(ModelConfig config, std::unique_ptr<TensorSource> source,
                                     ModelOptions options, std::unique_ptr<Backend> backend) {
  if (!backend) backend = make_cpu_backend();
  return std::unique_ptr<Model>(
      new Model(std::move(config), std::move(source), options, std::move(backend)));
}

CachePlan Model::cache_plan(int64_t min_block_size) const {
  CachePlanOptions o = cache_options_;
  o.min_block_size = min_block_size;
  // The whole model's spec at the group's tp and dcp: the rank's KDA heads, its positions.
  return plan_cache(full_config_.cache_spec(), o);
}

std::unique_ptr<KvCache> Model::new_cache(int64_t num_blocks, int64_t min_block_size) const {
  return std::make_unique<KvCache>(*backend_, cache_plan(min_block_size), num_blocks);
}

int64_t Model::context_transient_bytes(int64_t max_context) const {
  const int64_t scores = config_.has_indexer() ? kIndexerQueryChunk * max_context * 4 : 0;
  return scores + gathered_context_bytes(max_context);
}

void Model::reserve_decode_scratch(int64_t max_batch, int64_t max_context,
                                   int64_t max_step_tokens) const {
  if (max_batch < 1 || max_context < 1) return;
  const ModelConfig& c = config_;
  if (!attention_.fp8_latent() && c.kv_lora_rank > 0) {
    // The MLA calls no warm-up prefill makes: a decode batch (every row its own table) and,
    // with LoRA, a step's tokens through the kv_b adapters' path; the group's heads under DCP.
    MlaAttentionParams p;
    p.num_heads = c.num_attention_heads * options_.parallel.dcp.size;
    p.dn = c.qk_nope_head_dim;
    p.dr = c.qk_rope_head_dim;
    p.dv = c.v_head_dim;
    p.kv_lora = c.kv_lora_rank;
    static const int32_t kAnyTopk = 0;
    if (attention_.sparse()) {
      p.topk = &kAnyTopk;
      p.topk_width = c.index_topk;
    }
    p.num_keys = max_context;
    p.table_stride = 1;
    // The split partials do not grow monotonically with B (fewer rows, more splits each):
    // the largest over every B.
    size_t need = 0;
    for (int64_t b = 1; b <= max_batch; ++b) {
      p.num_tokens = b;
      need = std::max(need, backend_->mla_attention_scratch_bytes(p));
    }
    if (lora_ != nullptr && max_step_tokens > 0) {
      // Token-sharded prefill attends with every rank's heads (context_mla).
      if (options_.token_sharded_prefill > 0) {
        p.num_heads = std::max(p.num_heads, c.num_attention_heads * options_.parallel.tp.size);
      }
      static const int32_t kAnySlot = -1;
      p.num_tokens = max_step_tokens;
      p.table_stride = 0;
      p.lora_slots = &kAnySlot;
      need = std::max(need, backend_->mla_attention_scratch_bytes(p));
    }
    backend_->reserve_scratch(need);
  }
  if (!use_dsa_decode()) return;
  // The MLA splits do not grow monotonically with B: take the largest over every B.
  size_t need = 0;
  const CachePlan plan = cache_plan();
  for (int64_t b = 1; b <= max_batch; ++b) {
    DsaDecodeParams p;
    p.cache.block_size = static_cast<int32_t>(plan.block_size);
    p.batch.num_requests = b;
    p.batch.max_blocks = plan.blocks_for_tokens(max_context);
    p.batch.num_q = 1;
    p.batch.max_context = max_context;
    p.index_num_heads = c.index_n_heads;
    p.topk = c.index_topk;
    p.num_heads = c.num_attention_heads;
    p.softmax_scale = static_cast<float>(c.mla_softmax_scale());
    need = std::max(need, backend_->dsa_decode_scratch_bytes(p));
  }
  backend_->reserve_scratch(need);
}

SequenceState Model::new_sequence(int64_t capacity) const {
  SequenceState s;
  const CachePlan plan = cache_plan();
  s.cache = new_cache(1 + plan.blocks_for_tokens(std::max<int64_t>(capacity, 1)));
  if (plan.kda_state_rows > 0) s.state_block = 0;
  reserve(s, capacity);
  return s;
}

void Model::reserve(SequenceState& s, int64_t tokens) const {
  const int64_t need = s.cache->plan().blocks_for_tokens(tokens);
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  if (need <= have) return;
  const int64_t first_row = s.state_block >= 0 ? 1 : 0;
  // Rows are handed out in order: token block i is row first_row + i.
  if (first_row + need > s.cache->num_blocks()) {
    s.cache->grow(std::max(first_row + need, 2 * s.cache->num_blocks()));
  }
  for (int64_t i = have; i < need; ++i) s.blocks.push_back(static_cast<int32_t>(first_row + i));
}

SequenceInput Model::prepare(SequenceState& s, std::span<const int32_t> tokens,
                             bool all_logits) const {
  reserve(s, s.num_tokens + static_cast<int64_t>(tokens.size()));
  return {s.cache.get(), s.blocks, s.state_block, s.num_tokens, tokens, all_logits};
}

void Model::dump(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
  if (!dump_) return;
  if (backend_->kind() == DeviceKind::kCpu) {
    dump_(name, data, rows, cols);
    return;
  }
  std::vector<float> host(static_cast<size_t>(rows * cols));
  backend_->download(host.data(), data, host.size() * 4);
  dump_(name, host.data(), rows, cols);
}

void Model::linear_into(const float* x, int64_t num_tokens, const Weight& w, float* y) const {
  LinearParams p;
  p.x = x;
  p.w = &w;
  p.y = y;
  p.num_tokens = num_tokens;
  backend_->linear(p);
}

float* Model::linear(Pass& pass, const float* x, int64_t num_tokens, const Weight& w) const {
  float* y = pass.ws.floats(num_tokens * w.rows);
  linear_into(pass, x, num_tokens, w, y);
  return y;
}

std::vector<float*> Model::project(Pass& pass, const float* x, int64_t num_tokens,
                                   std::initializer_list<const Weight*> weights) const {
  std::vector<float*> ys;
  std::vector<LinearParams> ps;
  for (const Weight* w : weights) {
    ys.push_back(pass.ws.floats(num_tokens * w->rows));
    LinearParams p;
    p.x = x;
    p.w = w;
    p.y = ys.back();
    p.num_tokens = num_tokens;
    ps.push_back(p);
  }
  backend_->linears({ps});
  for (const LinearParams& p : ps) add_lora(pass, *p.w, x, num_tokens, p.y);
  return ys;
}

void Model::rms_norm(const float* x, const Vec& w, int64_t rows, int64_t dim, double eps,
                     float* y) const {
  RmsNormParams p;
  p.x = x;
  p.weight = w.data;
  p.y = y;
  p.num_rows = rows;
  p.dim = dim;
  p.eps = static_cast<float>(eps);
  backend_->rms_norm(p);
}

void Model::forward(std::span<const int32_t> tokens, SequenceState& state,
                    std::vector<float>& logits, bool all_positions) const {
  if (!state.workspace) state.workspace = std::make_unique<Workspace>(backend_.get());
  const SequenceInput in = prepare(state, tokens, all_positions);
  forward(std::span<const SequenceInput>(&in, 1), logits, *state.workspace);
  state.num_tokens += static_cast<int64_t>(tokens.size());
}

void Model::forward_split(std::span<const SequenceInput> batch, std::vector<float>& logits,
                          Workspace& ws) const {
  std::vector<SequenceInput> part[2];  // 0: prefill chunks, 1: decode tokens
  for (const SequenceInput& in : batch) part[in.prefill ? 0 : 1].push_back(in);
  std::vector<float> part_logits[2];
  for (int i = 0; i < 2; ++i) forward(part[i], part_logits[i], ws);
  // Rows back in batch order.
  const auto vocab = static_cast<size_t>(config_.vocab_size);
  logits.clear();
  size_t next_row[2] = {0, 0};
  for (const SequenceInput& in : batch) {
    const int i = in.prefill ? 0 : 1;
    const size_t n = in.all_logits ? in.tokens.size() : 1;
    const auto first = part_logits[i].begin() + static_cast<std::ptrdiff_t>(next_row[i] * vocab);
    logits.insert(logits.end(), first, first + static_cast<std::ptrdiff_t>(n * vocab));
    next_row[i] += n;
  }
}

int64_t Model::num_logit_rows(std::span<const SequenceInput> batch) {
  int64_t rows = 0;
  for (const SequenceInput& in : batch) rows += in.all_logits ? std::ssize(in.tokens) : 1;
  return rows;
}

int64_t Model::prefill_chunk_alignment() const {
  return config_.num_kda_layers() > 0 ? kKdaChunkSize : 1;
}

bool Model::mixes_prefill_and_decode(std::span<const SequenceInput> batch) const {
  const auto is_prefill = [](const SequenceInput& in) { return in.prefill; };
  return options_.batch_invariant && std::any_of(batch.begin(), batch.end(), is_prefill) &&
         !std::all_of(batch.begin(), batch.end(), is_prefill);
}

bool Model::is_batched_decode(std::span<const SequenceInput> batch) const {
  return !batch.empty() && std::all_of(batch.begin(), batch.end(), [&](const SequenceInput& in) {
    return in.tokens.size() == 1 && in.cache == batch[0].cache &&
           !(options_.batch_invariant && in.prefill);
  });
}

void Model::forward(std::span<const SequenceInput> batch, std::vector<float>& logits,
                    Workspace& ws) const {
  if (mixes_prefill_and_decode(batch)) {
    forward_split(batch, logits, ws);
    return;
  }
  const float* dev = forward_logits(batch, ws);
  logits.resize(static_cast<size_t>(num_logit_rows(batch) * config_.vocab_size));
  backend_->download(logits.data(), dev, logits.size() * 4);
}

void Model::check_input(const SequenceInput& in, size_t i) const {
  const ModelConfig& c = config_;
  CHECK(in.cache != nullptr && !in.tokens.empty(), "sequence ", i, " of the batch has no tokens");
  CHECK(in.slots.empty() || in.slots.size() == in.tokens.size(), "sequence ", i, ": ",
        in.slots.size(), " slots for ", in.tokens.size(), " tokens");
  const CachePlan& plan = in.cache->plan();
  CHECK(plan.options.latent == cache_options_.latent &&
            plan.options.index == cache_options_.index && plan.options.tp == cache_options_.tp &&
            plan.options.dcp == cache_options_.dcp &&
            static_cast<int64_t>(plan.pages.size()) == c.num_mla_layers() &&
            static_cast<int64_t>(plan.kda_pages.size()) == c.num_kda_layers(),
        "sequence ", i, ": its KV cache was made for another model or cache format");
  const int64_t bs = plan.tokens_per_block();
  const int64_t end = in.num_computed + static_cast<int64_t>(in.tokens.size());
  CHECK(in.num_computed >= 0 && static_cast<int64_t>(in.blocks.size()) * bs >= end, "sequence ", i,
        ": ", in.blocks.size(), " blocks of ", bs, " tokens cannot hold ", end, " tokens");
  CHECK(
      plan.kda_state_rows == 0 || (in.state_block >= 0 && in.state_block < in.cache->num_blocks()),
      "sequence ", i, ": KDA state block ", in.state_block, " outside the pool");
  for (int32_t b : in.blocks) {
    CHECK(b >= 0 && b < in.cache->num_blocks(), "sequence ", i, ": block ", b,
          " outside the pool of ", in.cache->num_blocks());
  }
  for (size_t j = 0; j < in.tokens.size(); ++j) {
    CHECK(in.tokens[j] >= 0 && in.tokens[j] < c.vocab_size, "token id ", in.tokens[j],
          " at position ", j, " is outside the vocabulary [0, ", c.vocab_size, ")");
  }
}

const float* Model::forward_logits(std::span<const SequenceInput> batch, Workspace& ws) const {
  CHECK(!mixes_prefill_and_decode(batch),
        "batch-invariant forward: a batch mixes prefill chunks and decode tokens; run them as "
        "two forwards");
  CHECK(!batch.empty(), "forward needs at least one sequence");

  // Host-side layout of the batch: token offsets, ids, positions, cache slots, block tables.
  std::vector<int64_t> offset(batch.size() + 1, 0);
  std::vector<int32_t> ids;
  std::vector<int64_t> pos, slots;
  std::vector<int32_t> tables;
  std::vector<int64_t> table_offset;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    check_input(in, i);
    for (size_t j = 0; j < in.tokens.size(); ++j) {
      ids.push_back(in.tokens[j]);
      pos.push_back(in.num_computed + static_cast<int64_t>(j));
      slots.push_back(slot_of(in, j, in.cache->plan()));
    }
    table_offset.push_back(static_cast<int64_t>(tables.size()));
    tables.insert(tables.end(), in.blocks.begin(), in.blocks.end());
    offset[i + 1] = offset[i] + static_cast<int64_t>(in.tokens.size());
  }
  const int64_t t = offset.back();

  ws.reset();
  int32_t* ids_dev = ws.ints(t);
  int64_t* pos_dev = ws.longs(t);
  int64_t* slots_dev = ws.longs(t);
  int32_t* tables_dev = ws.ints(static_cast<int64_t>(tables.size()));
  backend_->upload(ids_dev, ids.data(), ids.size() * 4);
  backend_->upload(pos_dev, pos.data(), pos.size() * 8);
  backend_->upload(slots_dev, slots.data(), slots.size() * 8);
  backend_->upload(tables_dev, tables.data(), tables.size() * 4);
  std::vector<SequenceSlice> slices;
  for (size_t i = 0; i < batch.size(); ++i) {
    slices.push_back({offset[i], offset[i + 1] - offset[i], batch[i].num_computed, batch[i].cache,
                      tables_dev + table_offset[i], batch[i].state_block, batch[i].all_logits,
                      batch[i].lora_slot});
  }
  DeviceBatch db{ids_dev, pos_dev, slots_dev, t, slices, {}};
  if (is_batched_decode(batch)) {
    // Block tables padded to one width, the KDA state rows and the key counts.
    int64_t width = 0, max_keys = 0;
    for (const SequenceInput& in : batch) {
      width = std::max(width, static_cast<int64_t>(in.blocks.size()));
      max_keys = std::max(max_keys, in.num_computed + 1);
    }
    const auto num_seqs = static_cast<int64_t>(batch.size());
    const int32_t pad = batch[0].cache->scratch_block();
    std::vector<int32_t> padded(static_cast<size_t>(num_seqs * width), pad);
    std::vector<int32_t> state_rows(static_cast<size_t>(num_seqs), pad);
    std::vector<int32_t> seq_lens(static_cast<size_t>(num_seqs), 1);
    for (size_t i = 0; i < batch.size(); ++i) {
      std::copy(batch[i].blocks.begin(), batch[i].blocks.end(), padded.begin() + i * width);
      if (batch[i].state_block >= 0) state_rows[i] = batch[i].state_block;
      seq_lens[i] = static_cast<int32_t>(batch[i].num_computed + 1);
    }
    int32_t* padded_dev = ws.ints(num_seqs * width);
    int32_t* rows_dev = ws.ints(num_seqs);
    int32_t* seq_lens_dev = ws.ints(num_seqs);
    backend_->upload(padded_dev, padded.data(), padded.size() * 4);
    backend_->upload(rows_dev, state_rows.data(), state_rows.size() * 4);
    backend_->upload(seq_lens_dev, seq_lens.data(), seq_lens.size() * 4);
    db.decode = {batch[0].cache, padded_dev, width, rows_dev, seq_lens_dev, max_keys};
  }
  return forward_device(db, ws);
}

const float* Model::forward_device(const DeviceBatch& batch, Workspace& ws,
                                   float* logits_out) const {
  const int64_t d = config_.hidden_size;
  const int64_t t = batch.num_tokens;
  CHECK(!batch.seqs.empty() && t > 0, "forward needs at least one token");
  CHECK(weights_resident_, "forward: the model's weights are released (sleep mode)");
  Pass pass{ws, batch.decode};
  pass.lora_slots = batch.lora_slots != nullptr && lora_ != nullptr
                        ? batch.lora_slots
                        : lora_token_slots(ws, batch.seqs, t);
  const Hidden hidden = run_layers(pass, batch.ids, batch.pos, batch.slots, batch.seqs, t);
  // logits = lm_head(final_norm(h)) for the rows asked for.
  trace("lm_head");
  int64_t num_rows = 0;
  for (const SequenceSlice& s : batch.seqs) num_rows += s.all_logits ? s.n : 1;
  // The last norm of the rows asked for only: every token's (decode steps, all-logits
  // prefill) as they are, else those rows gathered, each AttnRes snapshot's rows with them
  // ([snapshots..., h], each [num_rows, D]; the norm is per token, so the bits are the same).
  Hidden last = hidden;
  if (num_rows != t) {
    const int64_t n = hidden.num_snapshots;
    float* gathered = ws.floats((n + 1) * num_rows * d);
    int64_t r = 0;
    for (const SequenceSlice& s : batch.seqs) {
      const int64_t first = s.all_logits ? s.offset : s.offset + s.n - 1;
      const int64_t count = s.all_logits ? s.n : 1;
      for (int64_t j = 0; j <= n; ++j) {
        const float* src = j < n ? hidden.snapshots + j * t * d : hidden.h;
        backend_->copy(gathered + (j * num_rows + r) * d, src + first * d,
                       static_cast<size_t>(count * d) * 4);
      }
      r += count;
    }
    last = {gathered + n * num_rows * d, gathered, n};
  }
  float* rows = ws.floats(num_rows * d);
  final_norm(last, num_rows, rows);
  float* logits = logits_out != nullptr ? logits_out : ws.floats(num_rows * config_.vocab_size);
  lm_head(pass, rows, num_rows, logits);
  dump("logits", logits, num_rows, config_.vocab_size);
  return logits;
}

void Model::attn_res_norm(const Hidden& hs, const Vec& query, const Vec& norm, int64_t t,
                          float* y) const {
  const ModelConfig& c = config_;
  AttnResNormParams p;
  p.snapshots = hs.snapshots;
  p.snapshot_stride = t * c.hidden_size;
  p.num_snapshots = hs.num_snapshots;
  p.current = hs.h;
  p.query = query.data;
  p.res_eps = static_cast<float>(c.rms_norm_eps);
  p.norm_weight = norm.data;
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  p.y = y;
  p.num_tokens = t;
  p.dim = c.hidden_size;
  backend_->attn_res_norm(p);
}

void Model::final_norm(const Hidden& hs, int64_t t, float* y) const {
  if (config_.has_attn_res()) {
    attn_res_norm(hs, weights_.output_res, weights_.final_norm, t, y);
  } else {
    rms_norm(hs.h, weights_.final_norm, t, config_.hidden_size, config_.rms_norm_eps, y);
  }
}

Model::Hidden Model::run_layers(Pass& pass, const int32_t* ids_dev, const int64_t* pos_dev,
                                const int64_t* slots_dev, std::span<const SequenceSlice> slices,
                                int64_t t) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  // h = embed_tokens(ids)
  float* h = pass.ws.floats(t * d);
  float* x = pass.ws.floats(t * d);
  float* out = pass.ws.floats(t * d);
  // Block AttnRes (K3.md §3.2): h is the running prefix sum P of the current block, the
  // bank holds the snapshots [num_snapshots, T, D].
  Hidden hs{h, nullptr, 0};
  float* bank = c.has_attn_res() ? pass.ws.floats(c.num_attn_res_snapshots() * t * d) : nullptr;
  hs.snapshots = bank;
  trace("embed");
  embed(pass, ids_dev, t, h);
  dump("embed", h, t, d);
  // Decode context parallelism: this rank's causal bounds, and its slots (only the tokens it
  // stores are written).
  if (options_.parallel.dcp.size > 1) {
    int64_t* local_pos = pass.ws.longs(t);
    int64_t* local_slots = pass.ws.longs(t);
    const ContextParallel& dcp = options_.parallel.dcp;
    backend_->dcp_localize({pos_dev, slots_dev, t, dcp.rank, dcp.size, local_pos, local_slots});
    pass.dcp_pos = local_pos;
    slots_dev = local_slots;
  }

  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const LayerWeights& lw = weights_.layers[layer];
    // h = h + attn(rms(h)); AttnRes: x = rms(mix(bank, P)), a snapshot of P at block
    // boundaries, then P = a (boundary) or P + a.
    trace(layer_name(layer, "attention"));
    bool boundary = false;
    if (c.has_attn_res()) {
      if (hs.num_snapshots > 0) {
        attn_res_norm(hs, lw.attn_res, lw.input_norm, t, x);
      } else {
        rms_norm(h, lw.input_norm, t, d, c.rms_norm_eps, x);
      }
      boundary = layer % c.attn_res_block_size == 0;
      if (boundary) {
        backend_->copy(bank + hs.num_snapshots * t * d, h, static_cast<size_t>(t * d) * 4);
        ++hs.num_snapshots;
      }
    } else {
      rms_norm(h, lw.input_norm, t, d, c.rms_norm_eps, x);
    }
    {
      const Workspace::Mark mark = pass.ws.mark();
      if (c.is_kda(layer)) {
        kda_attention(pass, layer, x, t, slices, out);
      } else {
        mla_attention(pass, layer, x, t, pos_dev, slots_dev, slices, out);
      }
      tp_reduce(pass, out, t * d);
      pass.ws.rewind(mark);
    }
    dump(layer_name(layer, "attn_out"), out, t, d);
    if (boundary) {
      backend_->copy(h, out, static_cast<size_t>(t * d) * 4);
    } else {
      backend_->residual_add({h, out, t * d});
    }
    // h = h + mlp(rms(h)) (AttnRes: of rms(mix(bank, P))), over the whole batch.
    trace(layer_name(layer, "mlp"));
    if (c.has_attn_res()) {
      attn_res_norm(hs, lw.mlp_res, lw.post_norm, t, x);
    } else {
      rms_norm(h, lw.post_norm, t, d, c.rms_norm_eps, x);
    }
    const Workspace::Mark mark = pass.ws.mark();
    feed_forward(pass, layer, x, t, out);
    pass.ws.rewind(mark);
    dump(layer_name(layer, "mlp_out"), out, t, d);
    backend_->residual_add({h, out, t * d});
    dump(layer_name(layer, "hidden"), h, t, d);
  }
  return hs;
}

void Model::feed_forward(Pass& pass, int64_t layer, const float* x, int64_t t, float* out) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  if (!c.is_moe(layer)) {
    MlpParams p;
    p.x = x;
    p.w = &lw.dense;
    p.y = out;
    p.num_tokens = t;
    p.act = activation_;
    MlpLora lora;
    if (mlp_lora(pass, lw.dense, lora)) p.lora = &lora;
    backend_->mlp(p);
    tp_reduce(pass, out, t * c.hidden_size);
    return;
  }
  const int64_t k = c.num_experts_per_tok;
  int32_t* ids = pass.ws.ints(t * k);
  float* weights = pass.ws.floats(t * k);
  RouterParams r;
  r.x = x;
  r.gate = &lw.moe.gate;
  r.bias = lw.moe.score_bias.data;
  r.num_tokens = t;
  r.num_experts = c.num_experts;
  r.top_k = k;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.renormalize = c.norm_topk_prob;
  r.scaling_factor = static_cast<float>(c.routed_scaling_factor);
  r.expert_ids = ids;
  r.expert_weights = weights;
  backend_->route_experts(r);

  MoeParams m;
  m.x = x;
  m.num_tokens = t;
  m.hidden = c.hidden_size;
  m.experts = lw.moe.experts.data();
  m.num_experts = static_cast<int64_t>(lw.moe.experts.size());
  if (options_.parallel.expert_parallel && options_.parallel.tp.size > 1) {
    m.local_experts_only = true;
    m.expert_offset =
        expert_shard(c.num_experts, options_.parallel.tp.rank, options_.parallel.tp.size).first;
  }
  m.expert_ids = ids;
  m.expert_weights = weights;
  m.top_k = k;
  m.shared = lw.moe.has_shared ? &lw.moe.shared : nullptr;
  m.y = out;
  m.act = activation_;
  // LoRA on the routed experts (each expert's own adapters) and the shared experts.
  std::vector<MlpLora> expert_lora(pass.lora_slots != nullptr ? lw.moe.experts.size() : 0);
  bool any_expert_lora = false;
  for (size_t e = 0; e < expert_lora.size(); ++e) {
    any_expert_lora = mlp_lora(pass, lw.moe.experts[e], expert_lora[e]) || any_expert_lora;
  }
  if (any_expert_lora) {
    m.expert_lora = expert_lora.data();
    // The device backend's form of the same adapters: the table's block of these experts.
    const int64_t first = lora_targets_->experts_first_target(&lw.moe.experts[0].gate);
    CHECK(first >= 0, "LoRA: layer ", layer, "'s routed experts are not one block of targets");
    m.expert_lora_table = lora_->matrices(first);
    m.lora_num_slots = lora_->num_slots();
    m.lora_token_slots = pass.lora_slots;
  }
  MlpLora shared_lora;
  if (lw.moe.has_shared && mlp_lora(pass, lw.moe.shared, shared_lora)) {
    m.shared_lora = &shared_lora;
  }
  if (c.moe_latent_size == 0) {
    backend_->moe(m);
    tp_reduce(pass, out, t * c.hidden_size);
    return;
  }
  // The latent MoE (K3.md §3.5): routed experts on zl = down(x) [T, De], combined in
  // fp32, RMSNorm, up to [T, D]; the shared MLP on the full-width x.
  const int64_t de = c.moe_latent_size;
  const float* latent_in = linear(pass, x, t, lw.moe.latent_down);
  float* latent = pass.ws.floats(t * de);
  m.x = latent_in;
  m.hidden = de;
  m.shared = nullptr;
  m.y = latent;
  backend_->moe(m);
  // Under TP the combined latent is a partial sum (each rank ran its share of every
  // expert's width): summed before the norm. latent_up is replicated: with shared experts
  // (partial too) rank 0 alone adds it before the layer's sum, without them every rank
  // computes the whole output.
  tp_reduce(pass, latent, t * de);
  if (c.moe_latent_norm) rms_norm(latent, lw.moe.latent_norm, t, de, c.rms_norm_eps, latent);
  if (!lw.moe.has_shared) {
    linear_into(latent, t, lw.moe.latent_up, out);
    return;
  }
  MlpParams p;
  p.x = x;
  p.w = &lw.moe.shared;
  p.num_tokens = t;
  p.act = activation_;
  p.lora = m.shared_lora;
  if (options_.parallel.tp.rank == 0) {
    linear_into(latent, t, lw.moe.latent_up, out);
    p.y = pass.ws.floats(t * c.hidden_size);
    backend_->mlp(p);
    backend_->residual_add({out, p.y, t * c.hidden_size});
  } else {
    p.y = out;
    backend_->mlp(p);
  }
  tp_reduce(pass, out, t * c.hidden_size);
}

}  // namespace hyserve
