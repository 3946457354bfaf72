// DecodeStep: the batched decode steps of one cache (every sequence one new token), run from
// persistent device input buffers and, on backends with graphs, CUDA graphs per batch-size
// bucket. Owned by the model runner; the model itself keeps nothing between forwards.
//
// Persistent inputs, rows [max_batch] (row i: the i-th sequence of the step's batch):
//
//   tables     [max_batch, W] int32  block tables, W = blocks of max_context tokens; entries
//                                    past a sequence's blocks (and padding rows) hold the
//                                    cache's scratch block
//   per token  ids int32, pos int64, slots int64, seq_lens int32, state_rows int32, the
//              rows of ids gathered on the device (TokenSource) and the LoRA adapter
//              slots int32: new every step, uploaded in one copy of rows x 36 bytes
//   logits     [max_batch, vocab] fp32 (a graph writes its output at fixed addresses)
//
// A host mirror of the tables keeps what the device holds: a row is copied only where it
// changed, and a sequence that grew by a block copies that one entry. In steady decode a
// step uploads the per-token inputs and one entry per sequence that crossed a block
// boundary; rows shift (and are copied again) only when the batch's order changes.
//
// Graphs: a batch of B sequences runs as the graph of (rows, context): rows the smallest of
// 1, 2, 4, ... (or graph_max_batch) >= B, context the smallest 4096 * 2^k (or max_context)
// >= its longest sequence. Padding rows read the scratch block and write their KDA state
// there (slot -1: no cache write). A shape's first step runs eagerly and captures the graph;
// later steps upload their inputs and replay it. A cache whose pool moved (grew) is
// recaptured.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/workspace.h"

namespace hyserve {

struct DecodeStepConfig {
  int64_t max_batch = 256;      // sequences of one step at most
  int64_t max_context = 4096;   // tokens of one sequence at most (the table width)
  int64_t graph_max_batch = 0;  // graphs for batches up to this (0: eager only; also 0
                                // when the model cannot be captured: decode_capturable)
  // Tokens of one verification (speculative decoding) at most; 0: no verification.
  int64_t max_verify_tokens = 0;
};

class DecodeStep {
 public:
  // The workspace holds the forward's scratch (it must outlive this; graphs keep its
  // addresses, so it must not shrink or move: Workspace never moves a block it handed out).
  DecodeStep(const Model& model, KvCache& cache, Workspace& ws, DecodeStepConfig config);
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  // Device bytes of the persistent buffers.
  static int64_t device_bytes(int64_t vocab, int64_t max_batch, int64_t table_width);
  // And those of verification (tables, inputs and the stash) for max_verify_tokens.
  static int64_t verify_bytes(const Model& model, int64_t max_batch, int64_t max_verify_tokens,
                              int64_t table_width);

  // Whether the batch runs here: Model::is_batched_decode on this cache, within max_batch
  // and max_context.
  bool accepts(std::span<const SequenceInput> batch) const;
  // Input ids of a run that come from a device array of sampled ids (asynchronous
  // scheduling: the token an earlier step sampled and the host has not seen): rows[i] >= 0
  // takes sequence i's id from tokens[rows[i]] (its SequenceInput token is not read).
  struct TokenSource {
    const int32_t* tokens = nullptr;
    std::span<const int32_t> rows;  // [batch] or empty: every id from the host
  };
  // Runs it; the logits [B, vocab] in backend memory, valid until the next run.
  const float* run(std::span<const SequenceInput> batch, const TokenSource& source);
  const float* run(std::span<const SequenceInput> batch) { return run(batch, TokenSource{}); }

  // Speculative verification: each sequence brings 1 + k tokens, the token it sampled last
  // and its k drafts (any k >= 0, up to max_verify_tokens in all). Every token is a query
  // row of the decode form above (its own table row, its causal bound); the KDA layers run
  // each sequence's tokens in order without writing their states and keep their inputs in
  // the stash (Model's KdaStash). With graphs, a verification of S sequences and T tokens
  // runs as the graph of (rows, tokens, context): rows and tokens the smallest powers of two
  // >= S and >= T (at most graph_max_batch and max_verify_tokens), one more row when the tokens
  // are padded (the padding tokens are its run: position 0, no cache write, the scratch
  // block's keys and state, which no verification writes), context as for decode steps.
  // Returns the logits of every token [T, vocab], the batch's tokens in order, valid until the
  // next run.
  bool accepts_verify(std::span<const SequenceInput> batch) const;
  const float* verify(std::span<const SequenceInput> batch);
  // After verify: advances each of its sequences' KDA states by its first counts[i] tokens
  // (1..its tokens), as decoding them one by one would. The latents and index keys of the
  // tokens after them stay in their slots past the sequence's length, read by nothing
  // until a later token overwrites them.
  void commit(std::span<const int32_t> counts);

  int64_t num_graphs() const;
  // Releases every graph (the weights or the cache moved: sleep mode); the next step of each
  // shape captures again.
  void release_graphs();
  // Host -> device bytes of the last run's inputs, and how many of them were block-table
  // entries (tests: unchanged rows are not copied).
  int64_t bytes_uploaded() const { return bytes_uploaded_; }
  int64_t table_entries_uploaded() const { return table_entries_uploaded_; }

 private:
  struct Graph {
    int64_t id = 0;
    bool captured = false;
    const uint8_t* pool = nullptr;  // the cache's pool when captured
  };
  // Brings table row `row` to `blocks` (pad past them), copying only what differs.
  void set_table_row(int64_t row, std::span<const int32_t> blocks);
  // Replays the shape's graph, or runs `step` and captures it (first use, or the pool moved).
  void replay_or_capture(Graph& g, const std::function<void()>& step);
  // How a batch's LoRA adapters run: none apply; each token's slot from the inputs (one
  // slice, graphs allowed); one slice per sequence (a slot with a merged kv_b: eager). A new
  // LoRA layout (Model::lora_generation) releases the graphs with LoRA ops.
  enum class LoraMode { kNone, kSlots, kSplit };
  LoraMode lora_mode(std::span<const SequenceInput> batch);
  // The graph key's LoRA part: 0 without LoRA ops, else 1 + the layout generation.
  int64_t graph_lora_key(LoraMode mode) const;
  // The checks of one input of a run (row i of the batch) and its position's slot.
  int64_t check_row(const SequenceInput& in, int64_t i, int64_t j) const;

  const Model& model_;
  Backend& backend_;
  KvCache& cache_;
  Workspace& ws_;
  DecodeStepConfig config_;
  int64_t width_ = 0;  // table entries per row
  int32_t pad_ = 0;    // the cache's scratch block
  DeviceAllocation tables_, inputs_, logits_;
  // Verification: its per-token and per-sequence inputs, the KDA stash, and the last
  // verify's sequences (commit() reads them).
  DeviceAllocation verify_inputs_, stash_buffer_, verify_logits_;
  // (rows, tokens, context, LoRA key)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Graph> verify_graphs_;
  KdaStash stash_;
  int64_t verify_sequences_ = 0, verify_tokens_ = 0;
  std::vector<int32_t> verify_lengths_;
  std::vector<int32_t> table_host_;  // [max_batch, width] what tables_ holds
  std::vector<int64_t> row_used_;    // [max_batch] leading entries that are not pad
  std::vector<uint8_t> staging_;     // the per-token inputs, laid out as inputs_
  std::map<std::tuple<int64_t, int64_t, int64_t>, Graph> graphs_;  // (rows, context, LoRA key)
  int64_t lora_generation_ = 0;  // the LoRA layout the graphs with LoRA ops were captured in
  int64_t bytes_uploaded_ = 0;
  int64_t table_entries_uploaded_ = 0;
};

}  // namespace hyserve
