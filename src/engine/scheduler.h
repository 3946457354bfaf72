// Scheduler: decides, every step, which requests run and how many of their tokens, in the
// style of vLLM v1. There are no prefill and decode phases: each request's
// num_computed_tokens chases its num_tokens() under a per-step token budget, so a prefill
// chunk, a decode step, a prefix hit and a recompute after preemption are one rule.
//
// One step (schedule):
//   1. running requests, most urgent first: decode = 1 token, or the next prefill chunk
//      (capped by the budget, long_prefill_token_threshold, the next KDA snapshot
//      boundary and the step's prefill cost cap, max_step_prefill_cost). When blocks run out, the
//      least urgent running request is preempted by recompute (blocks freed, num_computed_tokens =
//      0, outputs kept) and the allocation retried; a request that would have to preempt itself
//      waits.
//   2. if nothing was preempted: waiting requests in policy order (fcfs: order of arrival at
//      add_request; priority: lower priority value, then earlier arrival_time) with a prefix
//      lookup, while the budget, the cost cap, max_num_seqs and free blocks allow. The head of the
//      queue blocks the rest (no overtaking).
//   3. the full blocks of every scheduled request are registered in the prefix cache and
//      KDA snapshots to fill are listed.
// The scheduled requests' num_computed_tokens advance in schedule() itself, and each step
// that samples adds a placeholder for its token (Request::num_output_placeholders), so the
// next schedule() may come before this step's results (asynchronous scheduling: the next
// step's input for that request is the placeholder, read on the device). update_from_output
// then replaces the placeholders with the sampled tokens, applies the stop conditions and
// frees finished requests; several schedule()s may be pending, applied in order.
//
// "Most urgent" is the same order everywhere: fcfs ranks by add order, priority by
// (priority, arrival_time, add order). Running requests are kept sorted by it, so a
// preemption victim is never a request already scheduled in this step.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/lora_slots.h"
#include "engine/request.h"

namespace hyserve {

enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 8192;                // token budget of one step
  int64_t max_num_seqs = 256;                           // running requests at most
  int64_t max_model_len = 0;                            // prompt + outputs at most
  int64_t vocab_size = 0;                               // for SamplingParams::validate
  std::optional<int64_t> long_prefill_token_threshold;  // tokens per request per step at most
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  bool enable_chunked_prefill = true;  // off: a prompt is computed in one step or waits
  // A prefill chunk that stops short of the request's known tokens ends on a multiple of
  // this (0: anywhere); when the budget left cannot reach one, the request waits for a later
  // step, unless it is alone in the step. KDA models use the KDA chunk (64): every chunking of a
  // prompt, prefix hits included, then runs the same KDA chunks and gives the same bits.
  int64_t prefill_chunk_alignment = 0;
  std::vector<int32_t> eos_token_ids;  // stop unless ignore_eos (after min_tokens)
  // Prefill cost cap (docs/DECISIONS.md, "Prefill cost cap"): a step's time grows with
  // tokens x context, so under the token budget alone a long prompt's late chunks stall every
  // decoding stream. With a cap, each step's cost (step_cost: its decodes, then its prefill
  // chunks) stays within it: the running decodes' cost is set aside first (they are never
  // cut), then every prefill chunk is cut to what is left, down to an aligned end. A chunk
  // that cannot afford even the tokens to its next aligned end waits for a later step, unless
  // it is the step's first prefill chunk: that one takes them, so a long prompt always
  // advances. 0: off (the token budget alone); serve's default is
  // default_max_step_prefill_cost.
  int64_t max_step_prefill_cost = 0;  // token x context units
  // A token's weight work (projections, MLP, MoE, KDA) in the same units: as much as
  // attending over this many context tokens.
  int64_t prefill_linear_cost_tokens = 1024;
  // LoRA adapters resident at once (serve --max-loras; 0: LoRA off). A waiting request whose
  // adapter finds no slot (each holds another adapter some running request uses) is
  // skipped until one frees; the requests behind it may go first (vLLM's rule).
  int64_t max_loras = 0;
};

// The cost of computing `num_tokens` tokens from `start_position`: each token attends over
// the cached prefix and the chunk's earlier tokens and does its weight work,
//   num_tokens x (start_position + linear_cost_tokens) + num_tokens^2 / 2.
int64_t step_cost(int64_t start_position, int64_t num_tokens, int64_t linear_cost_tokens);
// The cost of a first chunk of max_num_batched_tokens tokens (from position 0): a cap that
// leaves a prompt of up to max_num_batched_tokens as it is and keeps every later step no
// dearer than the dearest step the token budget allows at an empty context.
int64_t default_max_step_prefill_cost(const SchedulerConfig& config);

// One request's share of a step.
struct ScheduledRequest {
  std::string request_id;
  int64_t start_position = 0;         // num_computed_tokens before the step
  std::vector<int32_t> token_ids;     // [num_new_tokens] inputs at positions start_position...
  std::vector<int64_t> slot_mapping;  // [num_new_tokens] BlockTable::slot_index of each
  std::vector<int32_t> block_ids;     // [num_blocks] the request's whole block table
  // KDA state row (models with KDA layers). start_position == 0: zero it before the step;
  // restore_state_from: copy that snapshot row into it before the step.
  std::optional<int32_t> state_block;
  std::optional<int32_t> restore_state_from;
  // The step reaches the request's last known token: sample the next one from its logits.
  // false for a prefill chunk that is not the last.
  bool samples = false;
  // Speculative decoding: the last num_draft_tokens of token_ids are drafts after the last
  // known token (which is token_ids[0]); the step samples a token after each of them too,
  // and update_from_output keeps the drafts the runner accepted.
  int64_t num_draft_tokens = 0;
  int32_t lora_slot = -1;  // the LoRA slot of its adapter (-1: none)

  int64_t num_new_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> requests;
  int64_t num_scheduled_tokens = 0;
  std::vector<SnapshotCopy> snapshot_copies;       // to make after the step's forward
  std::vector<std::string> preempted_request_ids;  // preempted in this step
  // Finished or aborted since the previous schedule(): the runner drops its state for them.
  std::vector<std::string> finished_request_ids;
  // LoRA slots whose adapter changes before this step's forward (Model::set_lora).
  std::vector<LoraLoad> lora_loads;
};

// What the runner (and the detokenizer) report for one step.
struct ModelRunnerOutput {
  // Tokens sampled for each scheduled request with samples == true: one, or with
  // speculative decoding the accepted drafts and the token after them (1 + accepted).
  std::unordered_map<std::string, std::vector<int32_t>> sampled_token_ids;
  // Requests to finish after appending this step's tokens, e.g. kFinishedStopped when the
  // detokenizer matched a stop string.
  std::unordered_map<std::string, RequestStatus> finished;
};

// One request's progress in a step, for streaming.
struct RequestUpdate {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  RequestStatus status = RequestStatus::kRunning;  // a finished status ends the stream
  std::optional<int32_t> stop_token_id;            // the stop_token_ids entry that stopped it
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config);

  // Queues a request (status waiting). Throws InvalidArgument when its id is taken, and
  // InvalidRequest when it can never run (validate_request, check_fits).
  void add_request(Request request);
  // Removes a waiting or running request and frees its blocks at once. false if unknown.
  bool abort_request(const std::string& request_id);

  // Speculative decoding: sets the drafts of every running request whose next step is a
  // decode step (drafts_follow) to propose(request).
  template <class Propose>
  void propose_drafts(Propose&& propose) {
    for (Entry* entry : running_) {
      Request& r = entry->request;
      if (drafts_follow(r)) r.spec_token_ids = propose(static_cast<const Request&>(r));
    }
  }
  // Whether the request's next step is a decode step that drafts may follow: only its last
  // known token is not computed, it is an output (the prompt's last token ends a prefill
  // chunk, which is never verified), and nothing is in flight.
  static bool drafts_follow(const Request& r) {
    return r.num_output_placeholders == 0 && r.num_computed_tokens + 1 == r.num_tokens() &&
           r.num_computed_tokens >= r.num_prompt_tokens();
  }

  SchedulerOutput schedule();
  // Applies the runner's results for `scheduled`, the oldest schedule() not applied yet.
  // Requests aborted or finished since then are skipped; a request preempted since then
  // keeps its token.
  std::vector<RequestUpdate> update_from_output(const SchedulerOutput& scheduled,
                                                const ModelRunnerOutput& output);

  const SchedulerConfig& config() const { return config_; }
  const KvCacheManager& kv_cache() const { return kv_; }
  // KvCacheManager::reset_prefix_cache and set_weights_generation (between steps).
  int32_t reset_prefix_cache() { return kv_.reset_prefix_cache(); }
  void set_weights_generation(int64_t generation) { kv_.set_weights_generation(generation); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  bool has_unfinished_requests() const { return !requests_.empty(); }
  // A waiting or running request; nullptr once finished or aborted.
  // Throws InvalidRequest (param max_tokens) when the request could never fit the whole
  // cache, however long it waited (reads only the configuration: any thread).
  void check_fits(const Request& request) const;
  const Request* find_request(const std::string& request_id) const;

 private:
  struct Entry {
    Request request;
    uint64_t seq = 0;  // add order
  };

  // The queues' order (a total order: seq breaks ties); a request's key never changes
  // while it is queued.
  struct MoreUrgent {
    SchedulingPolicy policy = SchedulingPolicy::kFcfs;
    bool operator()(const Entry* a, const Entry* b) const;
  };
  // Ordered sets, so that finishing or aborting any one request costs O(log n).
  using Queue = std::set<Entry*, MoreUrgent>;
  void preempt(Entry* victim, SchedulerOutput& out);
  void release_lora(Request& request);
  void finish(Entry* entry, RequestStatus status);
  // Length at which the request stops for length: min(prompt + max_tokens, max_model_len).
  int64_t max_num_tokens(const Request& request) const;
  std::optional<RequestStatus> check_stop(Request& request) const;
  ScheduledRequest describe_step(const Request& request, int64_t num_new_tokens,
                                 int64_t num_drafts) const;
  // The most tokens from `begin`, at most num_tokens, that cost_left affords (step_cost);
  // when not even the tokens to the next multiple of prefill_chunk_alignment fit: those
  // tokens for the step's first prefill chunk (first_prefill), 0 for any other.
  int64_t limit_to_cost(int64_t begin, int64_t num_tokens, int64_t cost_left,
                        bool first_prefill) const;
  // The drafts a decode step of the request may verify: its spec_token_ids, as many as fit
  // the budget left (which the step's own token takes one of) and the request's length.
  int64_t num_drafts(const Request& request, int64_t budget);

  SchedulerConfig config_;
  KvCacheManager kv_;
  LoraSlots lora_slots_;
  std::unordered_map<std::string, Entry> requests_;  // waiting and running
  Queue waiting_;                                    // most urgent first
  Queue running_;                                    // most urgent first
  std::vector<std::string> finished_since_schedule_;
  uint64_t next_seq_ = 0;
};

}  // namespace hyserve
