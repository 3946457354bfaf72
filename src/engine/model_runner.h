// ModelRunner: one scheduled step from the scheduler's output to sampled tokens (the role
// of vLLM v1's GPU model runner). It owns what lives on the device between steps:
//
//   raw     [max_num_seqs, vocab] fp32  the logits rows of the requests that sample
//   work    [max_num_seqs, vocab] fp32  the rows the logits processors change (raw when
//                                       no row of the step asks for logprobs)
//   weights [max_num_seqs, vocab] u32   the sampler's fixed-point token weights
//   penalty state, per persistent row (one row per running request with penalties, plus a
//   neutral row, max_num_seqs + 1 in all): repetition / presence / frequency, the output
//   token counts [rows, vocab] int32 (advanced on the device by each sampled token) and the
//   prompt's token mask [rows, ceil(vocab / 32)] (uploaded once when the row is taken)
//   sampling options, sampled ids, logprob outputs, masks and sparse adjustments
//
// The forward's workspace and the decode step (engine/decode_step.h: persistent block
// tables copied only where they change, CUDA graphs per batch bucket) are the runner's too:
// the model keeps no state between forwards.
//
// A step (execute): KDA state rows zeroed or restored from a prefix hit's snapshot; the
// forward over the scheduled tokens at the scheduler's slot mapping (a decode batch on the
// decode step, anything else through Model::forward_logits; two forwards in
// batch-invariant mode when prefill chunks and decode tokens mix); snapshots for later
// prefix hits; prompt logprobs of the rows that asked; the sampling rows gathered; then on
// the device: penalties, logit_bias, min_tokens bans, guided-decoding masks, sampling, the
// counts of the new tokens, and the logprobs of the sampled tokens (of the raw logits).
// launch() runs these as named phases around the step's InputBatch (the inputs, one per
// scheduled request, and the forward each runs in; model_runner_inputs.cpp builds it).
// Only the sampled ids and the asked-for logprobs are copied back: per step at most
// rows x (1 + 2 x logprobs) x 8 bytes (id, logprob, top ids and logprobs) plus the prompt
// logprobs asked for (with their ranks).
//
// Sampling is kernels/sampling/params.h's rule on every backend: the same request, seed and
// logits give the same tokens in `generate`, `serve`, on the CPU and on the GPU.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/decode_step.h"
#include "engine/scheduler.h"
#include "engine/step_plan.h"
#include "guided/token_constraint.h"
#include "model/model.h"
#include "model/workspace.h"

namespace hyserve {

struct LogprobEntry {
  int32_t token = 0;
  float logprob = 0.0f;  // log_softmax of the raw model logits
};

struct OutputToken {
  int32_t token = 0;
  float logprob = 0.0f;
  // 1-based rank of token by logit (ties: lower id first); prompt logprobs only, else 0.
  int64_t rank = 0;
  std::vector<LogprobEntry> top_logprobs;  // SamplingParams::logprobs entries, best first
};

struct ModelRunnerConfig {
  int64_t max_num_seqs = 256;             // rows that sample in one step at most
  int64_t max_num_batched_tokens = 8192;  // tokens of one step at most
  std::vector<int32_t> eos_token_ids;     // banned before min_tokens unless ignore_eos
  int64_t max_model_len = 4096;           // tokens of one sequence at most
  int64_t graph_max_batch = 0;            // CUDA graphs for decode batches up to this (0: none)
  size_t workspace_bytes = 0;             // the forward's workspace reserved to this at start
  // false: a tensor-parallel worker's runner (run_plan only): no sampling buffers.
  bool samples = true;
  // Speculative decoding (engine/speculative.h): drafts per request and step at most (0:
  // off). A step where requests bring drafts runs its decode tokens as one verification
  // (DecodeStep::verify) and samples every verified position; synthetic: the accepted
  // drafts are drawn at synthetic_rate (speculative.h synthetic_accepted) instead.
  int64_t num_speculative_tokens = 0;
  bool synthetic = false;
  double synthetic_rate = 0.0;
};

// Speculative decoding's counts of a step (vLLM's spec_decode metrics).
struct SpecDecodeCounts {
  int64_t num_drafts = 0;        // requests that verified drafts
  int64_t num_draft_tokens = 0;  // drafts verified
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [i]: drafts accepted at position i
  void add(const SpecDecodeCounts& other);
};

// One request's results of a step.
struct RunnerRequestResult {
  // The tokens the request got (one, or with drafts the accepted ones and the next).
  std::vector<OutputToken> sampled;
  // Prompt logprobs computed this step: (prompt position j, entry scoring prompt token j).
  std::vector<std::pair<int64_t, OutputToken>> prompt_logprobs;
};

struct RunnerStepResult {
  ModelRunnerOutput output;  // for Scheduler::update_from_output
  std::unordered_map<std::string, RunnerRequestResult> requests;
  int64_t bytes_downloaded = 0;  // device -> host bytes of this step (sampling and logprobs)
  SpecDecodeCounts spec;
};

// Called with each sampling row's raw logits (host copy) when set: `hyserve generate`
// prints their hash. Costs a download of the row; off by default.
using LogitsObserver = std::function<void(const std::string& request_id, std::span<const float>)>;

class ModelRunner {
 public:
  ModelRunner(const Model& model, KvCache& cache, ModelRunnerConfig config);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Device bytes the runner's buffers take for this config (memory planning), its workspace
  // aside.
  static int64_t device_bytes(const Model& model, const ModelRunnerConfig& config);
  // Sampling rows of one step at most: every request's verified positions.
  static int64_t max_sample_rows(const ModelRunnerConfig& config);
  // Tokens of one verification at most (0 without speculative decoding).
  static int64_t max_verify_tokens(const ModelRunnerConfig& config);

  // A request the engine accepted: its sampling seed and, with guided decoding, its
  // constraint (advanced over the request's outputs only, so a recompute after preemption
  // never feeds it twice).
  void add_request(const std::string& request_id, uint64_t seed,
                   std::shared_ptr<const TokenConstraint> constraint);
  // Drops every state of a finished or aborted request.
  void remove_request(const std::string& request_id);

  // Runs the step; `scheduler` gives each scheduled request (prompt, outputs, params).
  // launch() then collect().
  RunnerStepResult execute(const SchedulerOutput& scheduled, const Scheduler& scheduler);

  // Asynchronous scheduling: launch() issues the step (forward, logits processors,
  // sampling, the copies of the sampled ids and logprobs to pinned host memory) and returns
  // without waiting for the device; collect() waits for the oldest launched step and returns
  // its results. At most two steps are launched and not collected: the engine launches step
  // k + 1 and then collects step k. A request's input in step k + 1 may be a placeholder for
  // the token step k samples: the decode step reads it on the device; any other use (a
  // forward that is not a batched decode, guided decoding, a new penalty row) waits for
  // step k and reads it from its pinned copy.
  void launch(const SchedulerOutput& scheduled, const Scheduler& scheduler);
  RunnerStepResult collect();
  // Launched steps not collected yet.
  int64_t num_pending() const { return static_cast<int64_t>(pending_.size()); }

  void set_logits_observer(LogitsObserver fn) { observer_ = std::move(fn); }

  // Tensor parallelism, rank 0: each launched step's plan goes to `sink` (the workers)
  // before rank 0 runs it, and the sampled ids are broadcast over the model's group after
  // sampling. Not owned; set before the first step.
  void set_plan_sink(PlanSink* sink) { plan_sink_ = sink; }
  // Tensor parallelism, another rank: runs rank 0's plan of a step (the same forwards, state
  // copies and collectives, in the same order), then receives the sampled ids.
  void run_plan(const StepPlan& plan);

  // The forward's scratch (memory accounting) and the decode step (its graphs, its uploads).
  const Workspace& workspace() const { return ws_; }
  void freeze_workspace() { ws_.freeze(); }
  const DecodeStep& decode_step() const { return decode_; }
  // The decode step's graphs are released (the weights or the cache moved: sleep mode).
  void release_graphs() { decode_.release_graphs(); }
  // Tensor parallelism, rank 0: sends a control plan (StepPlan::control) to the workers, numbered
  // after the last step's.
  void send_control(StepPlan plan);

 private:
  struct RequestState {
    uint64_t seed = 0;
    std::unique_ptr<ConstraintState> constraint;
    int32_t penalty_row = -1;  // persistent penalty row, -1: none taken
  };
  // One sampling row of a step: its request and where its logits come from.
  struct Sampling {
    const ScheduledRequest* scheduled = nullptr;
    const Request* request = nullptr;
    RequestState* state = nullptr;
    int part = 0;           // which forward of the step (two in batch-invariant mixed steps)
    int64_t logit_row = 0;  // row of that forward's logits
    int32_t logprobs = -1;  // top logprobs asked for; -1: none
    int64_t draw = 0;       // index among the request's outputs of the token it samples
  };
  // A launched step: what collect() reads once its fence is done.
  // A request's verification in a launched step: its drafts and its rows, in position
  // order (collect() finds the accepted ones).
  struct Verified {
    std::string request_id;
    std::vector<int32_t> drafts;
    std::vector<size_t> rows;  // sampling rows of its positions, 1 + drafts
    uint64_t seed = 0;
    int64_t draw = 0;  // the draw index of its first position
  };
  struct Pending {
    RunnerStepResult result;              // prompt logprobs (computed at launch)
    std::vector<Verified> verified;       // the verification's sequences, in its order
    std::vector<std::string> sample_ids;  // the sampling rows' requests, in row order
    std::vector<int32_t> top_n;           // per row: top logprobs asked, -1 none
    int slot = 0;                         // which pinned slot holds the copies
    uint64_t fence = 0;
  };
  // The pinned copies of one step: sampled ids, their logprobs, top ids and logprobs.
  struct HostSlot {
    DeviceAllocation tokens, logprob, top_ids, top_logprobs;  // host memory
  };
  // The token the last launched step samples for `request_id` (its placeholder), from its
  // pinned copy: waits for that step.
  int32_t pending_token(const std::string& request_id);
  // The request's outputs before the token a step now samples: its known outputs and a
  // pending token of the step before.
  std::vector<int32_t> outputs_before_draw(const Request& r, bool samples);

  void prepare_state_rows(const SchedulerOutput& scheduled);
  // Takes and fills a penalty row for the request (its prompt mask, its outputs' counts).
  int32_t take_penalty_row(RequestState& state, const Request& r, std::span<const int32_t> outputs);
  void release_penalty_row(RequestState& state);
  void apply_logits_processors(std::span<const Sampling> rows, float* work);
  void sample(std::span<const Sampling> rows, const float* work);
  // Logprobs of the sampled ids (of the raw logits), copied to the slot's pinned buffers.
  void logprobs_of_samples(std::span<const Sampling> rows, HostSlot& slot, int64_t& bytes);
  // Logprobs of prompt tokens (host ids), rows of logits in order.
  std::vector<OutputToken> prompt_logprobs(const float* logits, std::span<const int32_t> targets,
                                           int32_t top_n, int64_t& bytes);
  // token_logprobs over `count` rows scoring targets (device ids), downloaded (the ranks only
  // with_rank: prompt logprobs report them, sampled tokens' logprobs do not); adds the bytes
  // copied to `bytes`. The entries' token fields are left 0.
  std::vector<OutputToken> score(const float* logits, const int32_t* targets, int64_t count,
                                 int32_t top_n, bool with_rank, int64_t& bytes);
  // token_logprobs over `count` rows of logits scoring targets, into the runner's buffers.
  LogprobParams run_logprobs(const float* logits, const int32_t* targets, int64_t count,
                             int32_t top_n);

  // One forward of a launched step, decided before the plan goes out.
  struct PartRun {
    std::vector<SequenceInput> batch;
    std::vector<size_t> index;           // into the step's inputs
    std::vector<int32_t> rows_of_batch;  // placeholder rows, -1: none
    bool placeholder = false;
    bool decode = false;  // on the decode step
    bool verify = false;  // a verification on the decode step (speculative decoding)
  };
  // The input batch of a launched step (the role of vLLM's InputBatch): one entry per
  // scheduled request, in the scheduler's order, and how the step's forwards share them.
  struct InputBatch {
    std::vector<SequenceInput> inputs;     // the forwards' inputs, at the scheduler's slots
    std::vector<const Request*> requests;  // each input's request
    // A placeholder input (the last step samples it): its row of tokens_; -1: none.
    std::vector<int32_t> source_rows;
    // Host copies of inputs whose placeholder is resolved on the host (a forward that is
    // not the decode step's); sized once, the inputs' spans point into them.
    std::vector<std::vector<int32_t>> resolved;
    std::vector<int> part_of;        // which forward runs each input
    std::vector<bool> verified;      // the input is a sequence of the verification
    std::vector<int64_t> logit_row;  // each input's first row in its forward's logits
    int num_parts = 1;
    bool verifies = false;  // some request brings drafts: its decode tokens are one verification
  };
  // A launch's phases, in order. Drops the finished requests and the preempted ones' rows.
  void begin_launch(const SchedulerOutput& scheduled);
  // The inputs, one per scheduled request, and the forward each runs in.
  InputBatch build_input_batch(const SchedulerOutput& scheduled, const Scheduler& scheduler);
  // The sampling rows (sets batch.logit_row), ordered by logprobs asked.
  std::vector<Sampling> gather_sampling_rows(const SchedulerOutput& scheduled, InputBatch& batch);
  // The verification's sequences in its batch order, with their sampling rows.
  std::vector<Verified> verified_sequences(const SchedulerOutput& scheduled,
                                           const InputBatch& batch, std::span<const Sampling> rows);
  // Each forward's batch and where it runs (placeholders off the decode step resolved).
  std::vector<PartRun> plan_forwards(const SchedulerOutput& scheduled, InputBatch& batch);
  // Runs one forward; its prompt logprobs into `result`, its sampling rows into raw_.
  void run_forward(const SchedulerOutput& scheduled, const InputBatch& batch, const PartRun& run,
                   std::span<const Sampling> rows, RunnerStepResult& result);
  // Processors, sampling and the copies of the ids and logprobs into the step's pinned slot.
  void sample_rows(std::span<const Sampling> rows, Pending& pending);
  // Queues the launched step for collect(); its rows become the placeholders' sources.
  void finish_launch(std::span<const Sampling> rows, bool verifies, Pending pending);
  // The plan of a launched step for the workers (and rank 0's mirror of their tables).
  StepPlan make_plan(const SchedulerOutput& scheduled, std::span<const PartRun> parts,
                     int32_t num_sampled);
  // Rank 0's sampled ids to every rank of the group (tensor parallelism).
  void broadcast_sampled(int32_t count);

  const Model& model_;
  Backend& backend_;
  KvCache& cache_;
  ModelRunnerConfig config_;
  Workspace ws_;       // every forward's scratch
  DecodeStep decode_;  // batched decode steps: persistent inputs and graphs (reads ws_)
  int64_t vocab_ = 0;
  std::unordered_map<std::string, RequestState> requests_;
  LogitsObserver observer_;

  DeviceAllocation raw_, work_;        // [max_num_seqs, vocab] fp32
  DeviceAllocation sample_workspace_;  // sampling::sample_workspace_bytes(sample rows, vocab)
  DeviceAllocation options_, tokens_, rows_;            // [max_num_seqs] SamplingOptions / int32
  DeviceAllocation repetition_, presence_, frequency_;  // [max_num_seqs + 1] fp32
  DeviceAllocation counts_;                             // [max_num_seqs + 1, vocab] int32
  DeviceAllocation prompt_mask_;                        // [max_num_seqs + 1, mask words] uint32
  DeviceAllocation masks_;                              // [max_num_seqs, mask words] uint32
  DeviceAllocation targets_, logprob_, rank_;           // [max logprob rows] int32 / fp32 / int64
  DeviceAllocation zero_rows_;                          // [max logprob rows] int32 zeros
  DeviceAllocation mask_rows_;                          // [max_num_seqs] int32
  DeviceAllocation top_ids_, top_logprobs_;             // [max logprob rows, kMaxTopLogprobs]
  DeviceAllocation entries_;  // sparse adjustments: row, id, value (grown)
  int64_t entries_capacity_ = 0;
  int64_t max_logprob_rows_ = 0;
  std::vector<int32_t> free_penalty_rows_;  // the neutral row max_num_seqs is never handed out
  bool penalties_active_ = false;           // the step's rows_ map rows to penalty rows
  HostSlot slots_[2];                       // pinned copies, alternate launches
  int64_t num_launches_ = 0;
  std::deque<Pending> pending_;  // launched, not collected, oldest first
  // The last launched step's sampling rows: request id -> row of tokens_ (and of its slot).
  std::unordered_map<std::string, int32_t> last_rows_;
  int last_slot_ = 0;
  uint64_t last_fence_ = 0;
  // Tensor parallelism: rank 0's sink and the block tables as the workers hold them (rank
  // 0: as last sent; a worker: as received), by request.
  PlanSink* plan_sink_ = nullptr;
  uint64_t num_plans_ = 0;
  std::unordered_map<std::string, std::vector<int32_t>> plan_tables_;
  // Ids whose finished request's tables the next plan drops: a new request took the id before
  // the scheduler reported the old one finished (add_request).
  std::vector<std::string> plan_dropped_early_;
  // Rank 0: the commit counts of the last collected verification, for the workers' next plan.
  std::vector<int32_t> plan_commits_;
  int64_t sample_rows_ = 0;  // max_sample_rows
};

}  // namespace hyserve
