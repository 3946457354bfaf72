// Model: a loaded checkpoint and the decoder forward pass (MODEL.md §0-§5), written
// once as the flat sequence of layer calls the math is, against a Backend (the CPU
// reference ops or the CUDA kernels). No device code lives here.
//
// forward() takes a batch of sequences, each with its own new tokens (a prefill
// chunk or one decode token): projections, norms and MLPs run over all tokens of
// the batch at once; attention runs per sequence over its own pages of the cache.
//
// State lives in the packed block cache (KvCache, kv/cache_plan.h): each sequence
// brings its token blocks (MLA latents and index keys of every full-attention layer,
// written at their slots) and, with KDA layers, its KDA state row. The engine takes
// both from its block pool; SequenceState is a standalone sequence with a private,
// growing cache for tests, `hyserve generate` and benchmarks.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/attention_backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora_table.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace hyserve {

struct ModelOptions {
  // DSA indexer scores on FP8 index keys with the Hadamard rotation (the cache
  // format of the GPU path). Off: exact fp32 scores, as the golden references use.
  bool indexer_fp8 = false;
  // How the MLA latents are cached: kFp32 (the exact reference) or kFp8 (576 e4m3 codes
  // per token with a per-layer scale, MODEL.md §6; DSA models only: attention then runs
  // on the DSA kernels, kernels/attention/dsa/params.h).
  LatentCacheDtype latent_cache = LatentCacheDtype::kFp32;
  // How MLA layers attend (model/attention_backend.h; serve --attention-backend): auto
  // picks from the config and the cache formats, with the FP8 latent and FP8 index keys the
  // fused DSA decode step (Backend::dsa_decode) where its shapes allow; kDsaFp8 keeps the
  // generic chunked indexer path for decode (the same selection; for tests and comparisons).
  AttentionBackend attention_backend = AttentionBackend::kAuto;
  // Batch-invariant mode (serve --batch-invariant): a request's logits are bitwise the
  // same whatever else is in its batch, however its prompt is chunked (64-token aligned
  // chunks, as the scheduler makes them) and whether its prefix came from the cache.
  // The backend runs fixed-order kernels (Backend::set_batch_invariant); a batch that
  // mixes prefill chunks with decode tokens runs as two forward passes (prefill chunks
  // always take the prefill path, decode tokens the batched decode path). Prefill runs each
  // token in decode's order (KDA by the fused kda_decode, MLA in the absorbed form), so a token
  // scored in a prompt (prompt_logprobs) gets the bits it got when it was decoded or
  // verified: an RL rollout's log-probs equal the scored ones (issue 48).
  bool batch_invariant = false;
  // How the CPU backend multiplies by weight matrices outside batch-invariant mode
  // (serve / generate --cpu-gemm): kReference, the fp32 reference's fixed-order dot products,
  // under which every exact equality of the CPU backend holds on the default paths too (a
  // prefix hit equals the miss, a mixed batch each sequence alone: the unit tests' setting);
  // kBlas, OpenBLAS's sgemm for calls of many tokens (the CLI's default: the speed of the
  // machine, within 1e-5 relative of the reference, its bits may depend on the batch).
  // The CUDA backend ignores it.
  cpu::CpuGemm cpu_gemm = cpu::CpuGemm::kReference;
  // Where this process sits in the parallel schemes (parallel/parallel_layout.h), validated
  // once when the model loads:
  //   tp   this rank of a tensor-parallel group (model/tensor_parallel.h): the model loads
  //        the full checkpoint's names and shapes, keeps its share of the weights and runs
  //        with the local config (config()); each layer's partial output is summed over the
  //        group by tp.comm (in rank order in batch-invariant mode). size 1: the whole model.
  //   dcp  decode context parallelism within the TP group: size 1 off.
  //   expert_parallel  (vLLM's --enable-expert-parallel) each rank keeps E / tp whole routed
  //        experts instead of 1 / tp of every one; the MoE's partial sums meet in the same
  //        all-reduce.
  ParallelLayout parallel;
  // Token-sharded prefill (DESIGN.md "Parallelism"), TP > 1: a forward of at least this many
  // tokens (prefill, not a batched decode) runs each MLA layer's indexer and attention with
  // every head on 1 / N of the tokens (each sequence cut into 2N pieces, rank r taking pieces
  // r and 2N - 1 - r), two all-to-alls turning (all tokens, h heads) into (its tokens, all
  // heads) and back; kv_b_proj is kept whole. 0: off (heads split in every forward).
  // With decode context parallelism (parallel.dcp.size W > 1) such a forward attends over the
  // gathered context instead: each layer, every sequence's latents and index keys (written
  // by their owners first) are all-gathered within the DCP group into one contiguous
  // workspace buffer in position order (model_token_sharded.cpp), so the indexer and the
  // attention see the whole context as without DCP: no top-k or log-sum-exp merge, the same
  // bits as W = 1. Decode steps and shorter prefills keep DCP's merged form.
  int64_t token_sharded_prefill = 0;
};

// One sequence's part of a batch.
struct SequenceInput {
  KvCache* cache = nullptr;
  std::span<const int32_t> blocks;  // token blocks: blocks[i] holds positions [i*bs, (i+1)*bs)
  int32_t state_block = -1;         // KDA state row (models with KDA layers)
  int64_t num_computed = 0;         // past tokens in the cache: the first new position
  std::span<const int32_t> tokens;  // new tokens
  bool all_logits = false;          // logits of every new position, else of the last
  // The tokens are a prefill chunk (prompt, or a recompute after preemption). Read in
  // batch-invariant mode only, where prefill chunks never take the decode path.
  bool prefill = false;
  // [tokens] the cache slot of each new token (the scheduler's slot mapping); empty: taken
  // from blocks (core/paged.h slot_index).
  std::span<const int64_t> slots = {};
  // The slot of the LoRA adapter its tokens run with (Model::set_lora), -1: none.
  int32_t lora_slot = -1;
};

// A sequence with its own cache: row 0 is its KDA state, token blocks follow. Its forwards
// run in its own workspace (made by the first one).
struct SequenceState {
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> blocks;
  int32_t state_block = -1;
  int64_t num_tokens = 0;  // tokens already processed (the next position)
  std::unique_ptr<Workspace> workspace;
};

// One sequence's tokens within a DeviceBatch: rows [offset, offset + n) of every [T, ...]
// activation; positions start at num_computed; blocks: its block table in backend memory.
struct SequenceSlice {
  int64_t offset = 0;
  int64_t n = 0;
  int64_t num_computed = 0;
  KvCache* cache = nullptr;
  const int32_t* blocks = nullptr;
  int32_t state_block = -1;
  bool all_logits = false;  // logits of every token, else of the last
  int32_t lora_slot = -1;   // LoRA adapter slot of its tokens (-1: none)
};

// A verification forward's KDA inputs, kept for the commit of the accepted tokens: per KDA
// layer (in layer order) five planes of `capacity` token rows, q, k, v and f [capacity, H*K]
// (the raw projections, f before dt_bias) and b [capacity, H] (before the sigmoid), in
// backend memory of Model::kda_stash_floats(capacity) floats.
struct KdaStash {
  float* data = nullptr;
  int64_t capacity = 0;  // token rows per plane (a forward's tokens at most)
};

// A batch of single-token sequences that share one cache runs each attention op once for
// the whole batch, every query reading its own block-table row and KDA state row (cache
// null: attention per sequence).
struct BatchedDecode {
  KvCache* cache = nullptr;
  const int32_t* tables = nullptr;  // [B, table_stride] block tables
  int64_t table_stride = 0;
  const int32_t* state_rows = nullptr;  // [B] KDA state rows
  const int32_t* seq_lens = nullptr;    // [B] num_computed + 1 (padding rows: 1)
  int64_t max_keys = 0;                 // the largest num_computed + 1 (or a bound of it)
  // Speculative verification (model/model.h KdaStash): every query row above is one token
  // (its table row, its causal bound), and the KDA layers take the tokens as the sequences'
  // runs: sequence s's tokens [token_offsets[s], token_offsets[s + 1]) of num_sequences,
  // state_rows [num_sequences]. null: one token per sequence (state_rows [B]).
  const int32_t* token_offsets = nullptr;
  int64_t num_sequences = 0;
  // With token_offsets: the KDA layers read their states without writing them and keep
  // each token's raw inputs here for Model::commit_kda.
  const KdaStash* kda_stash = nullptr;
};

// Model::commit_kda: the states of a verification forward's sequences advanced by their
// accepted tokens, token_counts [num_sequences] (backend memory) of each sequence's run;
// the rest as the forward's BatchedDecode had them.
struct KdaCommit {
  KvCache* cache = nullptr;
  const KdaStash* stash = nullptr;
  const int32_t* state_rows = nullptr;     // [num_sequences]
  const int32_t* token_offsets = nullptr;  // [num_sequences + 1]
  const int32_t* token_counts = nullptr;   // [num_sequences]
  int64_t num_sequences = 0;
  int64_t num_tokens = 0;  // the forward's tokens (token_offsets[num_sequences])
};

// The inputs of one forward, in backend memory (Model::forward_device): the model runner
// keeps them in persistent buffers, forward_logits builds them in the workspace.
struct DeviceBatch {
  const int32_t* ids = nullptr;    // [T] token ids
  const int64_t* pos = nullptr;    // [T] positions
  const int64_t* slots = nullptr;  // [T] cache slots (-1: not written)
  int64_t num_tokens = 0;
  std::span<const SequenceSlice> seqs;  // host
  BatchedDecode decode;
  // [T] each token's LoRA adapter slot (-1: none) in backend memory, read instead of the
  // slices' slots (a decode step's persistent inputs, so a CUDA graph replays them); null:
  // from the slices. A batch given them must not need per-sequence kv_b (Model::lora_merges).
  const int32_t* lora_slots = nullptr;
};

// Receives named intermediates ("layers.3.attn_out", shape [rows, cols]) when set.
using DumpFn =
    std::function<void(std::string_view name, const float* data, int64_t rows, int64_t cols)>;

class Model {
 public:
  // Reads config.json and the safetensors of a checkpoint folder (every tensor is
  // checked before this returns) and places the weights on the backend (the CPU
  // when none is given; the model then owns it).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, ModelOptions options = {},
                                     std::unique_ptr<Backend> backend = nullptr);
  // A model whose tensors come from any source (e.g. RandomWeights for benchmarks).
  static std::unique_ptr<Model> create(ModelConfig config, std::unique_ptr<TensorSource> source,
                                       ModelOptions options = {},
                                       std::unique_ptr<Backend> backend = nullptr);
  ~Model();

  // The config this rank runs: the checkpoint's, with heads and MLP widths divided by the
  // tensor-parallel size (the checkpoint's own: full_config()).
  const ModelConfig& config() const { return config_; }
  const ModelConfig& full_config() const { return full_config_; }
  const ModelOptions& options() const { return options_; }
  Backend& backend() const { return *backend_; }

  // The row layout of this model's cache: latents as options().latent_cache, index keys
  // in FP8 (indexer_fp8) or fp32, KDA states in fp32 (this rank's heads under TP; latents
  // and index keys are replicated);
  // min_block_size as in CachePlanOptions.
  CachePlan cache_plan(int64_t min_block_size = 64) const;
  std::unique_ptr<KvCache> new_cache(int64_t num_blocks, int64_t min_block_size = 64) const;
  // Bytes of the transient buffers of a forward whose size grows with the context rather
  // than the step's tokens: the indexer's score chunk, [256 queries, max_context] fp32 (0
  // without indexer), and with token-sharded prefill under decode context parallelism the
  // gathered context of one sequence (latents and index keys of max_context positions, with
  // the all-gather's buffers). Memory planning adds it to a profiled step.
  int64_t context_transient_bytes(int64_t max_context) const;
  // Grows the backend's op scratch memory to what a DSA decode step of up to max_batch
  // sequences of up to max_context tokens takes (FP8 latent and keys: the indexer scores
  // [B, max_context], the top-k workspace and the sparse MLA splits), so that no decode
  // step allocates (or, after freeze, fails). MLA over an fp32 / bf16 latent: what a decode
  // batch of max_batch rows takes and, with LoRA enabled, an MLA call of max_step_tokens
  // tokens with kv_b adapters (the backends size each MLA call's scratch by the call, and a
  // warm-up prefill takes neither shape). No-op on the CPU.
  void reserve_decode_scratch(int64_t max_batch, int64_t max_context,
                              int64_t max_step_tokens = 0) const;

  // A standalone sequence with room for `capacity` tokens (grown on demand).
  SequenceState new_sequence(int64_t capacity = 0) const;
  // Makes room for `tokens` tokens in the sequence's cache (keeps its contents).
  void reserve(SequenceState& state, int64_t tokens) const;
  // The batch input for `tokens` after the state's past tokens (reserves room); the
  // caller advances state.num_tokens after the forward.
  SequenceInput prepare(SequenceState& state, std::span<const int32_t> tokens,
                        bool all_logits) const;

  // Runs each input's tokens after its past ones, writing their cache entries (and
  // advancing KDA states in place), in `ws` (reset first; the inputs are uploaded into it).
  // Returns the logits in backend memory, the rows of every input in order (all its
  // positions or its last one), [rows, vocab]; they stay valid until ws is reset. In
  // batch-invariant mode a batch must not mix prefill chunks and decode tokens (the caller
  // runs them as two forwards; forward() below does).
  const float* forward_logits(std::span<const SequenceInput> batch, Workspace& ws) const;
  // The forward over inputs already in backend memory, its scratch taken from `ws` (not
  // reset: the caller's inputs may live there). The logits go to logits_out when given
  // (fixed addresses for CUDA graphs), else to ws. The model keeps no state of its own: the
  // same model may run any number of forwards over different workspaces and caches.
  const float* forward_device(const DeviceBatch& batch, Workspace& ws,
                              float* logits_out = nullptr) const;
  // Floats of a KdaStash of `capacity` tokens (0 without KDA layers).
  int64_t kda_stash_floats(int64_t capacity) const;
  // After a verification forward (BatchedDecode::kda_stash): runs each sequence's accepted
  // tokens through every KDA layer again from the stash, writing the conv and recurrent
  // states (the outputs are not computed). The states then equal those of decoding the
  // accepted tokens one by one. Nothing without KDA layers.
  void commit_kda(const KdaCommit& commit) const;
  // Whether a decode forward can be captured in a CUDA graph: not when it reads a value
  // back mid-forward (the DSA top-k merge of decode context parallelism).
  bool decode_capturable() const;
  // The same as forward_logits, with the logits copied to the host (in batch-invariant mode
  // a mixed batch runs as two forwards).
  void forward(std::span<const SequenceInput> batch, std::vector<float>& logits,
               Workspace& ws) const;
  // Batch-invariant mode and a batch with both prefill chunks and decode tokens (which
  // forward_logits refuses).
  bool mixes_prefill_and_decode(std::span<const SequenceInput> batch) const;
  // Single-token sequences sharing one cache (and, in batch-invariant mode, no prefill
  // chunk): the batch runs as a batched decode.
  bool is_batched_decode(std::span<const SequenceInput> batch) const;
  // Refuses an input the forward cannot run (tokens, blocks, state row, cache format),
  // naming sequence i and the field.
  void check_input(const SequenceInput& in, size_t i) const;
  // Logit rows forward_logits returns for this batch.
  static int64_t num_logit_rows(std::span<const SequenceInput> batch);
  // Prefill chunks KDA prefill computes in (prompt chunks align to it so that a prefix
  // hit and a miss compute the same chunks); 1 without KDA layers.
  int64_t prefill_chunk_alignment() const;
  // One standalone sequence, in its own workspace; advances state.num_tokens.
  void forward(std::span<const int32_t> tokens, SequenceState& state, std::vector<float>& logits,
               bool all_positions = false) const;

  // Which ops each layer runs on, for the log at start: lines "layers 0-2, 4: <ops>", layers
  // with the same ops grouped. Every choice the forward makes from the config and options
  // (cache dtypes, DSA decode or the generic indexer path and why) is named here, so none is
  // a silent fallback.
  std::vector<std::string> kernel_plan() const;
  // How the MLA layers attend, chosen at load (ModelOptions::attention_backend).
  const AttentionChoice& attention() const { return attention_; }

  // LoRA adapters (issue 48; model/model_lora.cpp): enable_lora makes num_slots adapter
  // slots (serve --max-loras; each rank its share, LoraTargets); read_lora reads and checks a PEFT
  // folder against this model; set_lora puts an adapter in a slot (null: empties it) between
  // forwards. A sequence runs with the adapter of its SequenceInput::lora_slot; sequences
  // without one are computed exactly as without LoRA (bitwise).
  // max_rank: the largest rank a slot takes (serve --max-lora-rank); on a GPU every slot's
  // room is allocated here for it, lora_device_bytes before (the KV pool is planned after).
  void enable_lora(int64_t num_slots, int64_t max_rank = kMaxLoraRank);
  int64_t lora_device_bytes(int64_t num_slots, int64_t max_rank) const;
  bool lora_enabled() const { return lora_ != nullptr; }
  std::shared_ptr<const LoraAdapter> read_lora(const std::filesystem::path& dir,
                                               const std::string& name, int64_t max_rank) const;
  // This rank's share of a whole adapter (read on rank 0 and relayed: tensor parallelism),
  // checked as read_lora checks; the adapter itself on one rank.
  std::shared_ptr<const LoraAdapter> share_lora(std::shared_ptr<const LoraAdapter> whole) const;
  void set_lora(int64_t slot, std::shared_ptr<const LoraAdapter> adapter);
  // The adaptable projections (null until enable_lora).
  const LoraTargets* lora_targets() const { return lora_targets_.get(); }
  // Whether any sequence of a batch runs with a resident adapter (the LoRA ops run); checks
  // the slots' range.
  bool lora_applies(std::span<const SequenceInput> batch) const;
  // Whether slot's adapter has a merged kv_b (its sequences attend in calls of their own).
  bool lora_merges(int32_t slot) const;
  // Changes whenever an adapted projection gains or loses its last adapter (LoraTable's
  // layout_generation): a CUDA graph with LoRA ops is valid for one generation.
  int64_t lora_generation() const;

  // Weight updates and sleep mode (issue 48; model/model_weights_update.cpp), between
  // forwards. reload_weights reads and checks every tensor of `source` first (a missing or
  // misshapen one, or one whose format differs from the running weights', throws naming it
  // and changes nothing), then writes the new values over the running weights in place (the
  // same addresses: captured graphs stay valid) and re-merges the resident LoRA adapters.
  void reload_weights(std::unique_ptr<TensorSource> source);
  // Sleep: frees the weights' backend memory (a copy kept in host memory when keep_host_copy,
  // level 1); restore_weights brings them back from that copy or, without one, from the
  // source (level 2), at new addresses. On the CPU backend level 1 keeps the weights where
  // they are (host memory) and level 2 frees the copies made at load.
  void release_weights(bool keep_host_copy);
  void restore_weights();
  bool weights_resident() const { return weights_resident_; }
  // Where the running weights came from (a weight update reads the tensors it is not given
  // here).
  const TensorSource& weights_source() const { return *source_; }

  void set_dump(DumpFn fn) { dump_ = std::move(fn); }
  // Called with the name of each section as it starts ("embed", "layers.3.attention",
  // "layers.3.mlp", "lm_head"): profilers attribute the ops that follow to it.
  void set_trace(std::function<void(std::string_view section)> fn) { trace_ = std::move(fn); }

 private:
  Model(ModelConfig config, std::unique_ptr<TensorSource> source, ModelOptions options,
        std::unique_ptr<Backend> backend);

  // Queries per indexer scoring pass: bounds the score buffer to kIndexerQueryChunk x S.
  static constexpr int64_t kIndexerQueryChunk = 256;
  // The FP8 latent's scale (value = e4m3 code * scale), the same for every layer: the
  // checkpoints carry no per-layer kv scale (docs/DECISIONS.md).
  static constexpr float kLatentScale = 1.0f;
  // Queries per sparse-MLA call (the DSA kernel's grid takes at most 65535 requests).
  static constexpr int64_t kDsaQueryChunk = 16384;
  // "layers.<layer>.<what>": the names of dumped intermediates and trace sections.
  static std::string layer_name(int64_t layer, const char* what);

  // A forward in progress: its scratch and its batched-decode view (the model's only
  // per-forward state, passed along, never kept).
  struct Pass {
    Workspace& ws;
    BatchedDecode decode;
    // Decode context parallelism: [T] each token's causal bound among this rank's keys
    // (kernels/elementwise/params.h DcpLocalizeParams); null without it.
    const int64_t* dcp_pos = nullptr;
    // [T] each token's LoRA adapter slot (-1: none) in backend memory; null when no token of
    // the forward has an adapter.
    const int32_t* lora_slots = nullptr;
  };
  // LoRA (model_lora.cpp): the forward's token slots (null when none has an adapter);
  // y += the adapters' term of projection w for x [T, w.cols] -> y [T, w.rows]; the
  // adapters of an MLP's projections (false when none applies); the kv_b_proj a sequence
  // of slot `slot` attends with (base: the model's).
  const int32_t* lora_token_slots(Workspace& ws, std::span<const SequenceSlice> seqs,
                                  int64_t t) const;
  void add_lora(const Pass& pass, const Weight& w, const float* x, int64_t t, float* y) const;
  bool mlp_lora(const Pass& pass, const MlpWeights& w, MlpLora& out) const;
  const Weight& lora_kv_b(const MlaWeights& w, int32_t slot, const Weight& base) const;
  // The kv_b adapters a device's attention op applies in low-rank form for this forward's
  // tokens (Pass::lora_slots); empty on the host (merged copies) or when none applies.
  LoraModule lora_kv_b_module(const Pass& pass, const MlaWeights& w) const;
  // Whether a decode batch's sequences attend with different kv_b (LoRA on kv_b).
  bool lora_splits_kv_b(const MlaWeights& w, std::span<const SequenceSlice> seqs) const;
  void linear_into(const Pass& pass, const float* x, int64_t num_tokens, const Weight& w,
                   float* y) const;

  // Attention of one layer over the whole batch: x = rms(h) [T, D] -> out [T, D].
  // Projections, norms and gates run over all T tokens at once; only what reads or
  // writes a sequence's own state (conv, recurrence, cache writes, attention) runs per
  // sequence, or once for the whole batch in a batched decode. pos: [T] positions.

  // The residual stream after the last layer: h [T, D] and, for AttnRes models, the
  // snapshot bank [num_snapshots, T, D] (workspace).
  struct Hidden {
    float* h;
    const float* snapshots;
    int64_t num_snapshots;
  };
  // Embedding and every decoder layer over the batch's T tokens (the cache written as
  // they go).
  Hidden run_layers(Pass& pass, const int32_t* ids_dev, const int64_t* pos_dev,
                    const int64_t* slots_dev, std::span<const SequenceSlice> slices,
                    int64_t t) const;
  // y = rms(mix(snapshots, h)) with one AttnRes query and the norm after it (K3.md §3.2).
  void attn_res_norm(const Hidden& hs, const Vec& query, const Vec& norm, int64_t t,
                     float* y) const;
  // The last norm before lm_head: model.norm of h, or of the output AttnRes mix.
  void final_norm(const Hidden& hs, int64_t t, float* y) const;

  // slots: [T] each token's cache slot (block * block_size + offset).
  void mla_attention(Pass& pass, int64_t layer, const float* x, int64_t num_tokens,
                     const int64_t* pos, const int64_t* slots, std::span<const SequenceSlice> seqs,
                     float* out) const;
  void kda_attention(Pass& pass, int64_t layer, const float* x, int64_t num_tokens,
                     std::span<const SequenceSlice> seqs, float* out) const;
  // kda_decode's fields that depend on the layer and the cache (the caller sets the inputs,
  // rows and tokens).
  KdaDecodeParams kda_decode_params(int64_t layer, const KvCache& cache,
                                    const int32_t* state_rows) const;
  // A KDA layer's planes of a stash.
  struct KdaStashPlanes {
    float *q, *k, *v, *f, *b;
  };
  KdaStashPlanes kda_stash_planes(const KdaStash& stash, int64_t layer) const;
  // Over all tokens of the batch.
  void feed_forward(Pass& pass, int64_t layer, const float* x, int64_t num_tokens,
                    float* out) const;
  // DSA indexer, part 1: the rotated index query qi [T, Hi, di] and head weights [T, Hi]
  // of every token; writes the tokens' index keys into the cache. q_in is the normalized
  // q latent [T, q_lora] (or x when q_lora_rank is 0).
  struct IndexQuery {
    float* q;
    float* head_weights;
  };
  IndexQuery index_query(Pass& pass, int64_t layer, const float* x, const float* q_in,
                         int64_t num_tokens, const int64_t* pos, const int64_t* slots,
                         std::span<const SequenceSlice> seqs) const;
  // Part 2, the generic path: the selected past positions [T, index_topk] (-1 padded).
  // Decode context parallelism (model/tensor_parallel.h): this rank's keys among
  // num_positions positions; the merge of the partial attention results of the group's
  // heads [T, W * h, dv] (with their lse) into this rank's heads' o [T, h, dv]; the exact
  // global top-k of the indexer's local selections (host memory).
  int64_t local_keys(int64_t num_positions) const;
  // kv_b_proj for the heads of the `ranks` consecutive TP ranks this rank is one of (1: its
  // own heads; the DCP size: its DCP group's), a view of what the rank keeps: its heads, the
  // DCP group's, or with token-sharded prefill all of them.
  Weight own_kv_b(const MlaWeights& w, int ranks = 1) const;
  // The same view of `held` (kv_b_proj as the rank keeps it, or a LoRA adapter's merged copy
  // of it), and the first row of the view in it.
  Weight own_kv_b(const Weight& held, int ranks) const;
  int64_t own_kv_b_row0(const Weight& held, int ranks) const;
  // The ranks whose heads kv_b_proj is kept for: 1, the DCP group, or the TP group.
  int kv_b_ranks() const;
  bool token_sharded(const Pass& pass, int64_t t) const;
  // The fields of MLA attention over `cache`'s latents that depend on the layer alone (the
  // caller sets the queries, positions, pages, selection and outputs); kv_b must outlive it.
  MlaAttentionParams mla_params(int64_t layer, const KvCache& cache, const Weight& kv_b,
                                int64_t heads) const;
  // Attention of a token-sharded prefill forward (latent_attention's other form;
  // model_token_sharded.cpp).
  void token_sharded_attention(Pass& pass, int64_t layer, const float* x, const float* q_in,
                               const float* q, int64_t t, const int64_t* pos, const int64_t* slots,
                               std::span<const SequenceSlice> seqs, float* o) const;
  // Where a token-sharded prefill reads one sequence's rows of a layer (positions in their
  // global order): its cache pages, or with decode context parallelism the group's rows
  // gathered into the workspace, contiguous [num_computed + n (rounded up to W), row].
  struct ContextRows {
    const void* latent = nullptr;         // fp32 or bf16, as the cache's latent
    const void* index_keys = nullptr;     // fp32 keys or FP8 codes (models with an indexer)
    const float* index_scales = nullptr;  // FP8 keys' scales
    PagedRows pages;                      // the sequence's block table, or contiguous
  };
  // A layer's rows of `cache` through `pages` (a sequence's table, or a decode batch's).
  ContextRows cache_context(const KvCache& cache, PagedRows pages, int64_t layer) const;
  // Each rank's local rows [0, ceil(S / W)) of every kind (Backend::gather_rows), all-gathered
  // over the DCP group, interleaved into position order (rank d's local row j is position
  // j * W + d). A collective: every rank of the group calls it for the same sequences.
  ContextRows gather_context(Pass& pass, int64_t layer, const SequenceSlice& sq) const;
  // Bytes per position of each kind the gathered context holds (latent, index keys, FP8
  // index scales; 0: none), and its peak workspace bytes for a context of num_positions.
  std::array<int64_t, 3> context_row_bytes() const;
  int64_t gathered_context_bytes(int64_t num_positions) const;
  // The phases of token_sharded_attention (model_token_sharded.cpp). TokenShards: every
  // rank's pieces of the batch's tokens, this rank's as slices of its m tokens and their
  // positions; ShardedQueries: this rank's tokens' queries with every head (N * h) and their
  // outputs.
  struct TokenShards;
  struct ShardedQueries;
  TokenShards shard_tokens(Pass& pass, const int64_t* pos,
                           std::span<const SequenceSlice> seqs) const;
  // Rows [m, width] of this rank's tokens from src [T, width].
  float* own_token_rows(Pass& pass, const TokenShards& s, const float* src, int64_t width) const;
  // The all-to-all: x [T, width] (every token, this rank's heads) -> [m, N * width] (this
  // rank's tokens, every rank's heads), and back into x [T, width].
  float* tokens_to_own(Pass& pass, const TokenShards& s, const float* x, int64_t width) const;
  void own_to_tokens(Pass& pass, const TokenShards& s, const float* xa, int64_t width,
                     float* x) const;
  // The FP8 latent: qs.sparse, the queries qs.q absorbed with the whole kv_b_proj, with the
  // DSA kernels' outputs and scratch.
  void absorb_queries(Pass& pass, int64_t layer, const TokenShards& s, ShardedQueries& qs) const;
  // Sequence seqs[i]'s context (gathered under DCP) and, piece by piece, the indexer's top-k
  // and the attention of this rank's tokens of it.
  void attend_sequence(Pass& pass, int64_t layer, const TokenShards& s, const ShardedQueries& qs,
                       std::span<const SequenceSlice> seqs, size_t i) const;
  // One piece sq (rows of qs) over the FP8 latent gathered under DCP, on the DSA kernels.
  void gathered_dsa_sparse(Pass& pass, int64_t layer, const ContextRows& ctx,
                           const SequenceSlice& sq, const ShardedQueries& qs) const;
  // One piece sq (rows of qs) over the fp32 or bf16 latent of ctx (mla_attention).
  void context_mla(int64_t layer, const ContextRows& ctx, const SequenceSlice& sq,
                   const ShardedQueries& qs, const int64_t* pos, bool absorbed) const;
  // The indexer's causal top-k [n, index_topk] of queries iq rows [offset, offset + n) over
  // num_keys keys of ctx (its pages per query with table_stride > 0), scored in chunks of
  // kIndexerQueryChunk queries (a bounded buffer); merge: DCP's exact merge of each chunk
  // (ctx is the rank's share), not when ctx is the whole context.
  void select_in_context(Pass& pass, const IndexQuery& iq, int64_t offset, int64_t n,
                         const int64_t* pos, int64_t num_keys, const ContextRows& ctx,
                         int64_t table_stride, bool merge, int32_t* selected) const;
  void merge_partials(Pass& pass, const float* oa, const float* lse, int64_t t, int64_t h,
                      int64_t dv, float* o) const;
  // Decode context parallelism: the DCP group's queries [T, W * h, dq], rank r's heads at
  // [r * h, (r + 1) * h), from this rank's [T, h, dq].
  const float* group_queries(Pass& pass, const float* q, int64_t t, int64_t h, int64_t dq) const;
  // Decode context parallelism: replaces each row's local top-k by this rank's share of
  // the group's exact top-k (kernels/attention/topk_merge/params.h), in backend memory. When a row
  // needs round 2 it reads a count back (a host sync: no decode graphs with DCP + DSA).
  void merge_selection(Pass& pass, const float* scores, int64_t num_keys, int64_t rows, int64_t k,
                       int32_t* selected) const;
  int32_t* index_select(Pass& pass, int64_t layer, const IndexQuery& iq, int64_t num_tokens,
                        const int64_t* pos, std::span<const SequenceSlice> seqs) const;
  // MLA over the fp32 or bf16 latent (kernels/attention/mla): dense, or over the indexer's top-k.
  void latent_attention(Pass& pass, int64_t layer, const float* x, const float* q_in,
                        const float* q, int64_t num_tokens, const int64_t* pos,
                        const int64_t* slots, std::span<const SequenceSlice> seqs, float* o) const;
  // MLA over the FP8 latent on the DSA kernels (sparse; absorbed form): q [T, H, dn+dr]
  // -> o [T, H, dv]. Decode batches with FP8 keys run the whole DSA decode step.
  void dsa_attention(Pass& pass, int64_t layer, const float* x, const float* q_in, const float* q,
                     int64_t num_tokens, const int64_t* pos, const int64_t* slots,
                     std::span<const SequenceSlice> seqs, float* o) const;
  // Queries of the DSA kernels' sparse attention: rows [T] of each array (heads per row).
  struct SparseQueries {
    const int32_t* topk;   // [T, index_topk] positions (-1 padded)
    const int64_t* q_pos;  // [T] causal bounds among the cache's positions
    const float* q_lat;    // [T, heads, kv_lora] absorbed queries
    const float* q_pe;     // [T, heads, dr]
    float* o_lat;          // [T, heads, kv_lora] out
    float* lse;            // [T, heads] out
    int64_t heads;
    int32_t* slots;     // [T, index_topk] scratch
    int32_t* seq_lens;  // [T] scratch
  };
  // Rows [offset, offset + n) of q over a layer's FP8 latent pages `cache` through `table`
  // (per row with table_stride > 0): the top-k positions turned into slots, then the sparse
  // MLA.
  void dsa_sparse(const DsaCache& cache, const SparseQueries& q, int64_t offset, int64_t n,
                  const int32_t* table, int64_t table_stride, int64_t max_blocks,
                  int64_t max_context) const;
  // Whether decode batches run Backend::dsa_decode (the dsa_fp8_fused attention backend).
  bool use_dsa_decode() const { return attention_.fused_decode(); }
  // Whether a sequence's n new tokens attend in MLA's absorbed form (decode's) rather than the
  // expanded one: one token, or any number in batch-invariant mode (a prompt's token then
  // attends as it did when it was decoded).
  bool attends_absorbed(int64_t n) const { return n == 1 || options_.batch_invariant; }
  // One layer's view of a cache for the DSA kernels.
  DsaCache dsa_cache(const KvCache& cache, int64_t layer) const;
  // Writes rows [T, row_bytes] of the batch into their slots of one kind of page.
  enum class CacheRows { kLatent, kIndexKeys, kIndexScales };
  void write_cache(CacheRows kind, int64_t layer, const void* rows, int64_t row_bytes,
                   const int64_t* slots, std::span<const SequenceSlice> seqs) const;
  float* linear(Pass& pass, const float* x, int64_t num_tokens, const Weight& w) const;
  // The projections of one input (Backend::linears: x shared, e.g. rounded to bf16 once):
  // one workspace output per weight, in order.
  std::vector<float*> project(Pass& pass, const float* x, int64_t num_tokens,
                              std::initializer_list<const Weight*> weights) const;
  void linear_into(const float* x, int64_t num_tokens, const Weight& w, float* y) const;
  // h [T, D] = embed_tokens(ids [T]). Under TP each rank looks up the ids of its vocabulary
  // rows (-0.0f rows for the others) and the rows are summed over the group: exact, one
  // rank's term is the row, the others add nothing.
  void embed(Pass& pass, const int32_t* ids, int64_t num_tokens, float* h) const;
  // logits [rows, V] = lm_head(x [rows, D]). Under TP each rank computes the columns of its
  // vocabulary rows, [rows, shard] in a block of rows * stride floats (the last rank's
  // padded); the blocks are gathered [N][rows * stride] and placed at their columns of every
  // row, so every rank holds the same logits.
  void lm_head(Pass& pass, const float* x, int64_t rows, float* logits) const;
  // data[0..n) = its sum over the tensor-parallel ranks (a layer's partial output);
  // nothing on one rank. Batch-invariant: gathered and added in rank order.
  void tp_reduce(Pass& pass, float* data, int64_t n) const;
  void rms_norm(const float* x, const Vec& w, int64_t rows, int64_t dim, double eps,
                float* y) const;
  void dump(std::string_view name, const float* data, int64_t rows, int64_t cols) const;
  void trace(std::string_view section) const {
    if (trace_) trace_(section);
  }

  ModelConfig full_config_;               // the checkpoint's
  ModelConfig config_;                    // this rank's share (full_config_ on one rank)
  VocabShard vocab_;                      // this rank's rows of embed_tokens and lm_head
  std::unique_ptr<TensorSource> source_;  // keeps the host tensors (mmaps) alive
  ModelOptions options_;
  std::unique_ptr<Backend> backend_;
  LoadedWeights host_weights_;
  ModelWeights weights_;                          // views in backend memory
  std::vector<DeviceAllocation> weight_buffers_;  // backend copies (non-CPU backends)
  RopeTable rope_;              // deepseek_v32's (YaRN) rotary table; unused for NoPE
  GatedActivation activation_;  // of every MLP and expert (SiLU or SiTU)
  CachePlanOptions cache_options_;
  AttentionChoice attention_;                  // chosen once in the constructor
  std::unique_ptr<LoraTargets> lora_targets_;  // enable_lora: the adaptable projections
  std::unique_ptr<LoraTable> lora_;            // and the resident adapters

  // Batch-invariant mode: a batch of prefill chunks and decode tokens as two forwards.
  void forward_split(std::span<const SequenceInput> batch, std::vector<float>& logits,
                     Workspace& ws) const;
  DumpFn dump_;
  std::function<void(std::string_view)> trace_;

  // Copies the views' tensors into backend memory and points them there (non-CPU backends),
  // from backup (the buffers in placement order, as release_weights downloads them) when
  // given, else from where the views point.
  void place_weights(std::vector<std::vector<uint8_t>>* backup);
  // The resident LoRA adapters merged again (their kv_b copies follow the base weights).
  void refresh_lora();
  // The source's tensors, checked, as this rank runs them (its tensor-parallel shard).
  LoadedWeights load_rank_weights(const TensorSource& source) const;
  // The running views take next's values (same tensors, same order): the Weight objects stay
  // where they are, so the LoRA targets that point at them stay valid.
  void adopt_views(ModelWeights& next);
  std::vector<std::vector<uint8_t>> weights_backup_;  // sleep level 1 (non-CPU backends)
  bool weights_resident_ = true;
};

}  // namespace hyserve
