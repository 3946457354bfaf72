// Engine: the loop that owns the scheduler and the model runner. One engine thread runs
// steps (schedule -> execute: the forward, logits processing and sampling on the device
// (engine/model_runner.h) -> scheduler update -> deliver) while requests arrive and leave
// from other threads; each request's outputs are delivered through its callback, from the
// engine thread.
//
// Storage: one KvCache (the packed block pool's rows) whose blocks the scheduler's
// KvCacheManager hands out; the model reads and writes each request's blocks and KDA
// state row (the runner zeroes, restores and snapshots those rows as the scheduler says).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/lora_registry.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/model.h"

namespace hyserve {

struct EngineConfig {
  SchedulerConfig scheduler;  // max_model_len, vocab_size and eos ids filled from the model
  int32_t num_blocks = 0;     // rows of the pool (0: enough for max_num_seqs x max_model_len)
  // The plan's block size is the smallest power of two >= this whose row holds one KDA
  // state. Prefix caching on a KDA model needs a multiple of 64, the chunk of KDA prefill,
  // so that a hit and a miss compute the same chunks.
  int64_t min_block_size = 64;
  bool enable_prefix_caching = false;
  SnapshotPolicy snapshot_policy;              // KDA snapshots kept for prefix hits
  std::vector<std::string> prefix_extra_keys;  // e.g. the served model id
  // Decode batches of up to this many sequences replay CUDA graphs (backends with graphs;
  // 0: every step eager). serve: min(max_num_seqs, 256) unless --enforce-eager.
  int64_t decode_graph_max_batch = 0;
  // The forward's workspace is reserved to this at start (a profiled step plus the
  // context's transient buffers), so that steps never grow it; 0: grown on demand.
  size_t workspace_bytes = 0;
  // Asynchronous scheduling (vLLM's --async-scheduling): step k + 1 is scheduled and
  // launched before step k's results are read, so the host's scheduling, input preparation
  // and output processing overlap the device's work. Outputs are the same as without it:
  // a request's next input is the placeholder of the token in flight, read on the device;
  // a request that finishes in step k also ran in step k + 1, whose token is dropped.
  bool async_scheduling = false;
  // Speculative decoding (engine/speculative.h); it runs without asynchronous scheduling
  // (complete_engine_config turns that off: each step's drafts follow the step before).
  SpeculativeConfig speculative;
  // LoRA adapters (issue 48; serve --enable-lora): scheduler.max_loras > 0 gives the model
  // that many adapter slots and the engine a LoraRegistry of adapters of rank up to
  // max_lora_rank. A slot's adapter changes between steps, once the step in flight is done on
  // the device; speculative verification carries each sequence's slot (eagerly).
  int64_t max_lora_rank = 16;
};

// The config an engine of this model runs with: max_model_len, vocab_size, eos ids and the
// prefill chunk alignment from the model, num_blocks 0 made max_num_seqs full-length
// requests' worth. Throws Error naming the field on a bad value.
EngineConfig complete_engine_config(const Model& model, EngineConfig config);

// The model runner's config of an engine of this config (the leader's; a tensor-parallel
// worker's sets samples false).
ModelRunnerConfig runner_config(const EngineConfig& config);

struct RequestOutput {
  std::string request_id;
  std::vector<OutputToken> new_tokens;  // tokens produced since the last output
  // prompt_logprobs (once, with the first output): [prompt_len] entries, the first empty.
  std::vector<std::optional<OutputToken>> prompt_logprobs;
  bool finished = false;
  std::string finish_reason;             // "stop", "length" or "abort" when finished
  std::optional<int32_t> stop_token_id;  // the stop_token_ids / eos id that stopped it
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache
  double queue_time_s = 0.0;      // with the first output: add_request to first scheduling
};

using OutputCallback = std::function<void(const RequestOutput&)>;

// A finished request's figures (vLLM's per-request metrics). Times are seconds from the
// engine's clock: arrival (add_request), first scheduling, first token, last token.
struct FinishedRequest {
  std::string request_id;
  std::string finish_reason;  // "stop", "length" or "abort"
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;
  int64_t num_generation_tokens = 0;
  std::optional<int64_t> max_tokens;  // the request's max_tokens, when it set one
  double e2e_s = 0.0;                 // arrival to finish
  // Absent when the request was never scheduled (queue, inference) or never produced a
  // token (prefill: scheduling to first token; decode: first to last token; TTFT).
  std::optional<double> queue_s, prefill_s, decode_s, inference_s, ttft_s;
  // decode_s / (generated tokens - 1), with at least two generated tokens.
  std::optional<double> time_per_output_token_s;
};

// Receives the engine's events on the engine thread (keep it quick; it must stay alive
// until it is replaced or the engine is gone). The server's Prometheus metrics are one.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void request_finished(const FinishedRequest& r) = 0;
  virtual void first_token(double ttft_s) = 0;
  // Once per step that gave a running request new tokens after its first: the time since
  // the step that gave it its previous ones.
  virtual void inter_token(double seconds) = 0;
  // Once per step: the tokens it computed (prefill chunks and decode tokens).
  virtual void step(int64_t num_scheduled_tokens) = 0;
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  double kv_cache_usage = 0.0;  // fraction of blocks in use
  int64_t num_preemptions = 0;  // total
  // Prompt tokens of the requests whose prefill finished (their first token came), cached
  // ones included, each request once (vLLM's prompt_tokens_total).
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  // Bytes the model runner copied device -> host (sampled ids and logprobs), total.
  int64_t device_to_host_bytes = 0;
  // Steps launched while the step before was still in flight (asynchronous scheduling).
  int64_t num_overlapped_steps = 0;
  SpecDecodeCounts spec_decode;  // totals (vllm:spec_decode_*)
};

// How a pause treats the requests it finds (vLLM's /pause?mode=): kAbort finishes them with
// "abort"; kWait lets them run to the end first; kKeep freezes them where they are (resume()
// continues them). Requests that arrive while paused wait for resume().
enum class PauseMode { kAbort, kWait, kKeep };
// "abort", "wait" or "keep"; InvalidRequest naming `field` otherwise.
PauseMode parse_pause_mode(std::string_view name, const std::string& field = "mode");

class TensorSource;

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, EngineConfig config);
  ~Engine();  // stops the loop; unfinished requests get finish_reason "abort"

  const Model& model() const { return *model_; }
  const EngineConfig& config() const { return config_; }

  // Validates (validate_request, Scheduler::check_fits) and queues the request; throws
  // InvalidRequest naming the field when it can never run.
  void add_request(Request request, OutputCallback on_output);
  // Finishes the request with reason "abort" (or `reason`), freeing its blocks at once.
  void abort_request(const std::string& request_id, const std::string& reason = "abort");

  void start();  // starts the engine thread
  void stop();   // stops it, aborting what is unfinished
  // Runs one step on the caller's thread (tests, or when not started). Returns false
  // when there was nothing to do.
  bool step();
  bool alive() const { return !dead_; }
  // Debugging: receives the raw logits row each sampled token is drawn from (a download per
  // row; `hyserve generate` hashes them). Set before the engine starts.
  void set_logits_observer(LogitsObserver fn);
  // Tensor parallelism, rank 0: every step's plan goes to `sink` (the workers) first
  // (ModelRunner::set_plan_sink). Before start().
  void set_plan_sink(PlanSink* sink);
  // Any thread; null: none. Once it returns, the previous observer gets no more calls.
  void set_observer(EngineObserver* observer);
  // The model runner (its workspace, its decode step's graphs and uploads). Engine thread
  // only: before start() or between step() calls.
  const ModelRunner& runner() const;
  // From here on no step allocates device memory: the runner's workspace and the backend
  // are frozen (a step that would grow them fails). Before start().
  void freeze_memory();
  EngineStats stats() const;
  // Generation control (issue 48 item 4: vLLM's /pause, /resume, /sleep, /wake_up,
  // /reset_prefix_cache and weight updates). Each runs on the engine thread between steps,
  // with no step in flight, and returns once it is done (on the caller's thread, stepping,
  // when the engine thread is not started). Any thread; an invalid one throws InvalidRequest,
  // a failed one the model's Error (the engine goes on as before).
  //
  // pause: no step runs until resume() (kWait: once the requests found have finished);
  // clear_cache also resets the prefix cache. Pausing a paused engine changes nothing.
  void pause(PauseMode mode, bool clear_cache);
  // Ends a pause: held and kept requests run again. InvalidRequest while asleep (wake_up).
  void resume();
  bool is_paused() const;
  // Forgets every prefix-cache entry (running requests keep their blocks); the count dropped.
  int32_t reset_prefix_cache();
  // Sleep mode: pauses (kAbort or kWait; the cache's contents are discarded, so kKeep is
  // refused), resets the prefix cache, frees the KV cache's memory and, level 1, moves the
  // weights to host memory or, level 2, frees them. The CPU backend keeps level 1's weights
  // where they are. Tensor-parallel serving refuses it (the workers hold their own).
  void sleep(int level, PauseMode mode);
  // Brings back what sleep freed: tags "weights" and "kv_cache" (empty: both). Once both
  // are back, generation resumes unless it was paused before the sleep.
  void wake_up(const std::vector<std::string>& tags);
  int sleep_level() const;  // 0: awake
  // Writes new weights over the model's (Model::reload_weights: all checked first, same
  // formats). Requests in flight go on with the new weights (pause first to keep them out);
  // no prefix-cache entry computed with the old weights is hit again. Tensor-parallel
  // serving refuses it.
  void update_weights(std::unique_ptr<TensorSource> source);
  // Weight updates applied so far.
  int64_t weights_generation() const;
  // Runs fn(model) on the engine thread between steps (no step in flight; the backend may
  // allocate meanwhile): a weight transfer's receives, which use the model's stream.
  void run_between_steps(const std::function<void(const Model&)>& fn);

  // The named LoRA adapters (any thread); null without LoRA (scheduler.max_loras 0).
  LoraRegistry* loras() { return loras_.get(); }
  const LoraRegistry* loras() const { return loras_.get(); }

 private:
  struct Impl;
  std::unique_ptr<Model> model_;
  EngineConfig config_;
  std::unique_ptr<LoraRegistry> loras_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> dead_{false};
  // Queues a control (Impl::Control) and waits for it.
  void run_control(std::function<bool()> fn);
};

}  // namespace hyserve
