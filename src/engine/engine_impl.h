// Engine::Impl: the engine thread's state, shared by engine/engine.cpp (the step loop) and
// engine/engine_control.cpp (pause, sleep, weight updates). Internal to engine/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"

namespace hyserve {

inline RequestOutput finished_output(const std::string& id, int64_t num_prompt_tokens,
                                     const std::string& reason) {
  RequestOutput out;
  out.request_id = id;
  out.finished = true;
  out.finish_reason = reason;
  out.num_prompt_tokens = num_prompt_tokens;
  return out;
}

struct Engine::Impl {
  // An admitted request, owned by the engine thread.
  struct Live {
    OutputCallback on_output;
    int64_t num_prompt_tokens = 0;
    std::vector<std::optional<OutputToken>> prompt_logprob_values;  // [prompt_len] when asked
    bool sent_first_output = false;
    using Clock = std::chrono::steady_clock;
    Clock::time_point arrival;  // when add_request was called
    std::optional<Clock::time_point> scheduled, first_token, last_token;
    double queue_time_s = 0.0;  // arrival to first scheduling
    int64_t num_output_tokens = 0;
    int64_t num_cached_tokens = 0;  // prompt tokens the prefix cache supplied
    std::optional<int64_t> max_tokens;
  };
  // An add or an abort from any thread, applied at the start of the next step.
  struct Command {
    bool is_add = false;
    Request request;  // add
    OutputCallback on_output;
    std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
    std::string request_id;  // abort
    std::string reason;
  };
  struct Delivery {
    OutputCallback on_output;
    RequestOutput output;
  };

  Impl(Model& m, const EngineConfig& c, const KvCacheConfig& kv)
      : model(m),
        writable_model(m),
        config(c),
        scheduler(c.scheduler, kv),
        cache(m.new_cache(kv.num_blocks, c.min_block_size)),
        runner(m, *cache, runner_config(c)),
        drafter(make_drafter(c.speculative)) {}

  void apply_incoming(std::vector<Delivery>& out);
  // schedule -> execute -> update -> deliver (the outputs go to `out`). With asynchronous
  // scheduling: schedule and launch this step, then update from the step before.
  bool run_step(std::vector<Delivery>& out);
  // Collects a launched step's results and applies them (update, outputs, stats).
  void finish_step(const SchedulerOutput& scheduled, std::vector<Delivery>& out);
  // Queue times of requests scheduled for the first time.
  void note_scheduled(const SchedulerOutput& scheduled);
  // The outputs of a step's updates, with the runner's logprobs.
  // Returns the prompt tokens of the requests that got their first token.
  int64_t collect_outputs(const SchedulerOutput& scheduled, RunnerStepResult& result,
                          const std::vector<RequestUpdate>& updates, std::vector<Delivery>& out);
  // A finished request's figures: its log line (vLLM's: id, tokens, queue time, TTFT, end
  // to end) and the observer's record.
  void report_finished(const std::string& id, const Live& l, const std::string& reason);
  // Finishes every queued and admitted request with `reason` (scheduler untouched when dead).
  void abort_all(std::vector<Delivery>& out, const std::string& reason, bool dead);
  void forget(const std::string& id);
  void update_stats(bool dead);
  // The speculative-decoding log line (mean acceptance length), every 10 s at most.
  void log_spec_decode(const SpecDecodeCounts& total);
  SpecDecodeCounts spec_logged;  // totals at the last line, engine thread
  std::chrono::steady_clock::time_point spec_logged_at = std::chrono::steady_clock::now();
  // Calls the callbacks, outside every lock; a callback that throws is logged.
  static void deliver(std::vector<Delivery>& out);

  const Model& model;
  Model& writable_model;  // set_lora, weight updates and sleep between steps, engine thread
  const EngineConfig& config;
  Scheduler scheduler;                               // engine thread
  std::unique_ptr<KvCache> cache;                    // the block pool's rows, engine thread
  ModelRunner runner;                                // engine thread
  std::unique_ptr<Drafter> drafter;                  // speculative decoding, engine thread
  std::unordered_map<std::string, Live> live;        // engine thread
  std::mt19937_64 seed_rng{std::random_device{}()};  // engine thread
  bool has_work = false;                             // engine thread
  std::optional<SchedulerOutput> in_flight;          // launched, not applied (engine thread)
  // Calls to the observer hold observer_mu, so that once set_observer returns the old one
  // gets no more calls.
  EngineObserver* observer = nullptr;  // guarded by observer_mu
  std::mutex observer_mu;
  template <class F>
  void notify(F&& f) {
    std::lock_guard lock(observer_mu);
    if (observer != nullptr) f(*observer);
  }

  // Generation control (engine/engine_control.cpp): pause, resume, sleep, wake-up, prefix
  // cache reset and weight updates, run on the engine thread between steps.
  struct Control {
    // With no step in flight; true when done, false to be called again after the next step
    // (a pause that waits for the running requests).
    std::function<bool()> fn;
    std::shared_ptr<std::promise<void>> done;
  };
  // Runs the oldest control, if any (after applying what came in and finishing the step in
  // flight). Returns whether there was one.
  bool run_controls(std::vector<Delivery>& out);
  // Fails every queued control with `why` (the engine stopped or failed).
  void fail_controls(const std::string& why);
  // Finishes the step in flight (asynchronous scheduling).
  void settle(std::vector<Delivery>& out);
  // Adds held while paused go back to the queue, in their order.
  void release_held();
  // One call of a pause's control (pause, sleep): the first closes admission and, kAbort,
  // ends what is queued and running; true once nothing runs (kWait: after the running requests
  // have finished; steps go on meanwhile).
  bool drain(PauseMode mode, bool& started);
  // Ends a pause: admission opens and the held adds are released.
  void reopen();
  std::vector<Delivery> control_out;  // outputs a control produced (its aborts), engine thread
  // Controls done in this step, answered after its outputs are delivered (a caller of
  // pause(kWait) sees the finished requests' last outputs first), engine thread.
  struct Answer {
    std::shared_ptr<std::promise<void>> done;
    std::exception_ptr error;
  };
  std::vector<Answer> answers;
  void answer_controls();
  bool admission_closed = false;  // adds are held (paused, or a pause draining), engine thread
  std::vector<Command> held;      // engine thread
  std::atomic<bool> paused{false};
  std::atomic<int> sleep_level{0};
  bool paused_by_sleep = false;  // engine thread
  bool has_workers = false;      // tensor-parallel workers follow this engine's plans
  std::atomic<int64_t> weights_generation{0};

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Control> controls;         // guarded by mu
  std::vector<Command> incoming;        // guarded by mu
  std::unordered_set<std::string> ids;  // queued or admitted, guarded by mu
  EngineStats stats;                    // guarded by mu
  bool stop_requested = false;          // guarded by mu
  std::thread thread;
};

}  // namespace hyserve
