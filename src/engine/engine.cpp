#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tensor_parallel_group.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "util/error.h"
#include "util/log.h"

namespace hyserve {

ModelRunnerConfig runner_config(const EngineConfig& c) {
  ModelRunnerConfig r;
  r.max_num_seqs = c.scheduler.max_num_seqs;
  r.max_num_batched_tokens = c.scheduler.max_num_batched_tokens;
  r.eos_token_ids = c.scheduler.eos_token_ids;
  r.max_model_len = c.scheduler.max_model_len;
  r.graph_max_batch = c.decode_graph_max_batch;
  r.workspace_bytes = c.workspace_bytes;
  r.num_speculative_tokens = c.speculative.enabled() ? c.speculative.num_speculative_tokens : 0;
  r.synthetic = c.speculative.method == SpeculativeMethod::kSynthetic;
  if (r.synthetic) {
    r.synthetic_rate =
        acceptance_rate(c.speculative.acceptance_length, c.speculative.num_speculative_tokens);
  }
  return r;
}

void Engine::Impl::forget(const std::string& id) {
  live.erase(id);
  runner.remove_request(id);
  std::lock_guard lock(mu);
  ids.erase(id);
}

void Engine::Impl::apply_incoming(std::vector<Delivery>& out) {
  std::vector<Command> commands;
  {
    std::lock_guard lock(mu);
    commands.swap(incoming);
  }
  for (Command& c : commands) {
    if (c.is_add && admission_closed) {
      held.push_back(std::move(c));  // paused: admitted by resume()
      continue;
    }
    if (!c.is_add) {
      const auto h = std::find_if(held.begin(), held.end(),
                                  [&](const Command& x) { return x.request.id == c.request_id; });
      if (h != held.end()) {
        out.push_back({h->on_output,
                       finished_output(c.request_id, h->request.num_prompt_tokens(), c.reason)});
        held.erase(h);
        std::lock_guard lock(mu);
        ids.erase(c.request_id);
        continue;
      }
    }
    if (c.is_add) {
      const std::string id = c.request.id;
      Live l;
      l.on_output = std::move(c.on_output);
      l.arrival = c.arrival;
      l.num_prompt_tokens = c.request.num_prompt_tokens();
      const SamplingParams& sp = c.request.sampling_params;
      l.max_tokens = sp.max_tokens;
      const uint64_t seed = sp.seed ? *sp.seed : seed_rng();
      const std::shared_ptr<const TokenConstraint> constraint = sp.constraint;
      if (sp.prompt_logprobs)
        l.prompt_logprob_values.resize(static_cast<size_t>(l.num_prompt_tokens));
      try {
        scheduler.add_request(std::move(c.request));
      } catch (const Error& e) {
        log::warn("engine: request {} refused at admission: {}", id, e.what());
        out.push_back({l.on_output, finished_output(id, l.num_prompt_tokens, "abort")});
        report_finished(id, l, "abort");
        std::lock_guard lock(mu);
        ids.erase(id);
        continue;
      }
      live.emplace(id, std::move(l));
      runner.add_request(id, seed, constraint);
    } else {
      const auto it = live.find(c.request_id);
      if (it == live.end() || !scheduler.abort_request(c.request_id)) continue;
      out.push_back({it->second.on_output,
                     finished_output(c.request_id, it->second.num_prompt_tokens, c.reason)});
      report_finished(c.request_id, it->second, c.reason);
      forget(c.request_id);
    }
  }
}

bool Engine::Impl::run_step(std::vector<Delivery>& out) {
  apply_incoming(out);
  bool did = !out.empty();
  std::optional<SchedulerOutput> launched;
  if (scheduler.has_unfinished_requests()) {
    const int64_t off_at = config.speculative.disable_by_batch_size;
    if (drafter && (off_at == 0 || scheduler.num_running() < off_at)) {
      const int64_t k = config.speculative.num_speculative_tokens;
      scheduler.propose_drafts([&](const Request& r) {
        return speculates(r.sampling_params) ? drafter->propose(r, k) : std::vector<int32_t>{};
      });
    }
    launched = scheduler.schedule();
    // A slot changes only once the step in flight (asynchronous scheduling) is done on the
    // device: it may still read the slot's old adapter (a request that finished in the step
    // before it ran once more).
    if (!launched->lora_loads.empty() && in_flight) writable_model.backend().synchronize();
    for (LoraLoad& load : launched->lora_loads) {
      // The workers' slots change with rank 0's, before this step's plan.
      if (has_workers) send_lora_to_workers(model, runner, load.slot, load.adapter);
      writable_model.set_lora(load.slot, std::move(load.adapter));
    }
    note_scheduled(*launched);
    {
      std::lock_guard lock(mu);
      stats.num_preemptions += static_cast<int64_t>(launched->preempted_request_ids.size());
    }
    runner.launch(*launched, scheduler);
    did = did || !launched->requests.empty();
  }
  // The step before runs on the device while this one was scheduled and launched.
  if (in_flight && launched) {
    std::lock_guard lock(mu);
    ++stats.num_overlapped_steps;
  }
  if (in_flight) {
    finish_step(*in_flight, out);
    in_flight.reset();
    did = true;
  }
  if (launched) {
    if (config.async_scheduling) {
      in_flight = std::move(launched);
    } else {
      finish_step(*launched, out);
    }
  }
  has_work = scheduler.has_unfinished_requests() || in_flight.has_value();
  update_stats(false);
  return did;
}

void Engine::Impl::finish_step(const SchedulerOutput& scheduled, std::vector<Delivery>& out) {
  RunnerStepResult result = runner.collect();
  const std::vector<RequestUpdate> updates = scheduler.update_from_output(scheduled, result.output);
  const int64_t num_prompt_tokens = collect_outputs(scheduled, result, updates, out);
  int64_t num_generated = 0;
  for (const RequestUpdate& u : updates) num_generated += std::ssize(u.new_token_ids);
  std::lock_guard lock(mu);
  stats.prompt_tokens += num_prompt_tokens;
  stats.generation_tokens += num_generated;
  stats.device_to_host_bytes += result.bytes_downloaded;
  stats.spec_decode.add(result.spec);
  if (config.speculative.enabled()) log_spec_decode(stats.spec_decode);
}

void Engine::Impl::log_spec_decode(const SpecDecodeCounts& total) {
  // vLLM's SpecDecoding line, at most every 10 s, over the drafts since the last one.
  const auto now = Live::Clock::now();
  if (now - spec_logged_at < std::chrono::seconds(10)) return;
  const double seconds = std::chrono::duration<double>(now - spec_logged_at).count();
  spec_logged_at = now;
  SpecDecodeCounts d = total;
  d.num_drafts -= spec_logged.num_drafts;
  d.num_draft_tokens -= spec_logged.num_draft_tokens;
  d.num_accepted_tokens -= spec_logged.num_accepted_tokens;
  for (size_t i = 0; i < d.accepted_per_pos.size() && i < spec_logged.accepted_per_pos.size();
       ++i) {
    d.accepted_per_pos[i] -= spec_logged.accepted_per_pos[i];
  }
  spec_logged = total;
  if (d.num_drafts == 0) return;
  std::string per_pos;
  for (int64_t a : d.accepted_per_pos) {
    per_pos += fmt::format("{}{:.3f}", per_pos.empty() ? "" : ", ",
                           static_cast<double>(a) / static_cast<double>(d.num_drafts));
  }
  log::info(
      "SpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} "
      "tokens/s, Drafted throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, "
      "Per-position acceptance rate: {}, Avg Draft acceptance rate: {:.1f}%",
      1.0 + static_cast<double>(d.num_accepted_tokens) / static_cast<double>(d.num_drafts),
      static_cast<double>(d.num_accepted_tokens) / seconds,
      static_cast<double>(d.num_draft_tokens) / seconds, d.num_accepted_tokens, d.num_draft_tokens,
      per_pos,
      d.num_draft_tokens > 0 ? 100.0 * static_cast<double>(d.num_accepted_tokens) /
                                   static_cast<double>(d.num_draft_tokens)
                             : 0.0);
}

void Engine::Impl::report_finished(const std::string& id, const Live& l,
                                   const std::string& reason) {
  const auto now = Live::Clock::now();
  const auto seconds = [](auto from, auto to) {
    return std::chrono::duration<double>(to - from).count();
  };
  FinishedRequest r;
  r.request_id = id;
  r.finish_reason = reason;
  r.num_prompt_tokens = l.num_prompt_tokens;
  r.num_cached_tokens = l.num_cached_tokens;
  r.num_generation_tokens = l.num_output_tokens;
  r.max_tokens = l.max_tokens;
  r.e2e_s = seconds(l.arrival, now);
  if (l.scheduled) {
    r.queue_s = seconds(l.arrival, *l.scheduled);
    r.inference_s = seconds(*l.scheduled, l.last_token.value_or(now));
  }
  if (l.first_token) {
    r.ttft_s = seconds(l.arrival, *l.first_token);
    if (l.scheduled) r.prefill_s = seconds(*l.scheduled, *l.first_token);
    r.decode_s = seconds(*l.first_token, *l.last_token);
    if (l.num_output_tokens > 1) {
      r.time_per_output_token_s = *r.decode_s / static_cast<double>(l.num_output_tokens - 1);
    }
  }
  log::info(
      "finished request {}: reason {}, prompt tokens {} ({} cached), generated tokens {}, queue "
      "{:.3f} s, TTFT {}, end to end {:.3f} s",
      id, reason, l.num_prompt_tokens, l.num_cached_tokens, l.num_output_tokens,
      r.queue_s.value_or(r.e2e_s), r.ttft_s ? fmt::format("{:.3f} s", *r.ttft_s) : std::string("-"),
      r.e2e_s);
  notify([&](EngineObserver& o) { o.request_finished(r); });
}

void Engine::Impl::note_scheduled(const SchedulerOutput& scheduled) {
  const auto now = Live::Clock::now();
  for (const ScheduledRequest& s : scheduled.requests) {
    Live& l = live.at(s.request_id);
    if (l.scheduled) continue;
    l.scheduled = now;
    const Request* r = scheduler.find_request(s.request_id);
    CHECK(r != nullptr, "engine: scheduled request ", s.request_id, " is unknown");
    l.num_cached_tokens = r->num_cached_prompt_tokens;
    l.queue_time_s = std::chrono::duration<double>(now - l.arrival).count();
  }
  notify([&](EngineObserver& o) { o.step(scheduled.num_scheduled_tokens); });
}

int64_t Engine::Impl::collect_outputs(const SchedulerOutput& scheduled, RunnerStepResult& result,
                                      const std::vector<RequestUpdate>& updates,
                                      std::vector<Delivery>& out) {
  int64_t new_prompt_tokens = 0;
  for (const ScheduledRequest& s : scheduled.requests) {
    const auto it = result.requests.find(s.request_id);
    const auto lit = live.find(s.request_id);
    // A request aborted while its step was in flight is gone.
    if (it == result.requests.end() || lit == live.end()) continue;
    Live& l = lit->second;
    for (auto& [pos, entry] : it->second.prompt_logprobs) {
      if (pos < std::ssize(l.prompt_logprob_values)) {
        l.prompt_logprob_values[static_cast<size_t>(pos)] = std::move(entry);
      }
    }
  }
  for (const RequestUpdate& u : updates) {
    Live& l = live.at(u.request_id);
    RequestOutput o;
    o.request_id = u.request_id;
    const auto it = result.requests.find(u.request_id);
    const std::vector<OutputToken>* sampled =
        it != result.requests.end() ? &it->second.sampled : nullptr;
    if (!u.new_token_ids.empty()) {
      const auto now = Live::Clock::now();
      if (!l.first_token) {
        l.first_token = now;
        new_prompt_tokens += l.num_prompt_tokens;
        const double ttft = std::chrono::duration<double>(now - l.arrival).count();
        notify([&](EngineObserver& obs) { obs.first_token(ttft); });
      } else {
        const double gap = std::chrono::duration<double>(now - *l.last_token).count();
        notify([&](EngineObserver& obs) { obs.inter_token(gap); });
      }
      l.last_token = now;
    }
    l.num_output_tokens += std::ssize(u.new_token_ids);
    // The update's tokens are the runner's, in order (cut at a stop).
    for (size_t j = 0; j < u.new_token_ids.size(); ++j) {
      const int32_t token = u.new_token_ids[j];
      o.new_tokens.push_back(sampled && j < sampled->size() && (*sampled)[j].token == token
                                 ? (*sampled)[j]
                                 : OutputToken{token, 0.0f, 0, {}});
    }
    if (!l.sent_first_output) {
      o.prompt_logprobs = std::move(l.prompt_logprob_values);
      o.queue_time_s = l.queue_time_s;
      l.sent_first_output = true;
    }
    o.num_prompt_tokens = l.num_prompt_tokens;
    o.num_cached_tokens = l.num_cached_tokens;
    if (is_finished(u.status)) {
      o.finished = true;
      o.finish_reason = to_string(u.status);
      o.stop_token_id = u.stop_token_id;
      const auto& eos = config.scheduler.eos_token_ids;
      if (!o.stop_token_id && u.status == RequestStatus::kFinishedStopped &&
          !u.new_token_ids.empty() && std::ranges::find(eos, u.new_token_ids.back()) != eos.end()) {
        o.stop_token_id = u.new_token_ids.back();
      }
    }
    out.push_back({l.on_output, std::move(o)});
    if (is_finished(u.status)) {
      report_finished(u.request_id, l, to_string(u.status));
      forget(u.request_id);
    }
  }
  return new_prompt_tokens;
}

void Engine::Impl::abort_all(std::vector<Delivery>& out, const std::string& reason, bool dead) {
  std::vector<Command> commands;
  {
    std::lock_guard lock(mu);
    commands.swap(incoming);
  }
  // Adds held by a pause first: they came before the ones still incoming.
  commands.insert(commands.begin(), std::make_move_iterator(held.begin()),
                  std::make_move_iterator(held.end()));
  held.clear();
  for (Command& c : commands) {
    if (!c.is_add) continue;
    out.push_back(
        {c.on_output, finished_output(c.request.id, c.request.num_prompt_tokens(), reason)});
  }
  for (auto& [id, l] : live) {
    if (!dead) scheduler.abort_request(id);
    out.push_back({l.on_output, finished_output(id, l.num_prompt_tokens, reason)});
    report_finished(id, l, reason);
  }
  live.clear();
  if (in_flight && !dead) {
    // Every request of the launched step is gone: its results only end the step.
    runner.collect();
    scheduler.update_from_output(*in_flight, {});
  }
  in_flight.reset();
  has_work = false;
  {
    std::lock_guard lock(mu);
    ids.clear();
  }
  update_stats(dead);
}

void Engine::Impl::update_stats(bool dead) {
  std::lock_guard lock(mu);
  stats.num_running = dead ? 0 : scheduler.num_running();
  stats.num_waiting = dead ? 0 : scheduler.num_waiting();
  stats.kv_cache_usage = dead ? 0.0 : scheduler.kv_cache().usage();
  const PrefixCacheStats& p = scheduler.kv_cache().prefix_cache_stats();
  stats.prefix_cache_queries = p.num_query_tokens;
  stats.prefix_cache_hits = p.num_hit_tokens;
}

void Engine::Impl::deliver(std::vector<Delivery>& out) {
  for (Delivery& d : out) {
    if (!d.on_output) continue;
    try {
      d.on_output(d.output);
    } catch (const std::exception& e) {
      log::error("engine: output callback of {} threw: {}", d.output.request_id, e.what());
    }
  }
}

EngineConfig complete_engine_config(const Model& model, EngineConfig config) {
  const ModelConfig& mc = model.config();
  SchedulerConfig& sc = config.scheduler;
  if (sc.max_model_len == 0) sc.max_model_len = mc.max_position_embeddings;
  if (model.prefill_chunk_alignment() > 1)
    sc.prefill_chunk_alignment = model.prefill_chunk_alignment();
  sc.vocab_size = mc.vocab_size;
  if (sc.eos_token_ids.empty()) {
    for (int64_t id : mc.eos_token_ids) sc.eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  CHECK(config.min_block_size >= 1 && (config.min_block_size & (config.min_block_size - 1)) == 0,
        "min_block_size must be a power of two, got ", config.min_block_size);
  CHECK(!model.options().batch_invariant ||
            model.cache_plan(config.min_block_size).tokens_per_block() %
                    model.prefill_chunk_alignment() ==
                0,
        "batch-invariant mode on a KDA model needs blocks of a multiple of ",
        model.prefill_chunk_alignment(),
        " tokens (KDA prefill chunks) so that a prefix hit ends on a chunk boundary");
  CHECK(config.num_blocks >= 0, "num_blocks must be >= 0, got ", config.num_blocks);
  validate(config.speculative);
  if (config.speculative.enabled() && config.async_scheduling) {
    log::info("engine: speculative decoding runs without asynchronous scheduling");
    config.async_scheduling = false;
  }
  CHECK(sc.max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", sc.max_num_seqs);
  CHECK(sc.max_loras >= 0, "max_loras must be >= 0, got ", sc.max_loras);
  if (sc.max_loras > 0) {
    CHECK(config.max_lora_rank >= 1 && config.max_lora_rank <= 64,
          "max_lora_rank must be in [1, 64], got ", config.max_lora_rank);
  }
  if (config.num_blocks == 0) {
    const int64_t per_seq =
        model.cache_plan(config.min_block_size).blocks_for_tokens(sc.max_model_len);
    const int64_t blocks = sc.max_num_seqs * per_seq + sc.max_num_seqs;
    CHECK(blocks <= std::numeric_limits<int32_t>::max(), "engine: ", blocks,
          " KV blocks do not fit an int32; set num_blocks");
    config.num_blocks = static_cast<int32_t>(blocks);
  }
  return config;
}

namespace {

KvCacheConfig make_kv_config(const Model& model, const EngineConfig& config) {
  KvCacheConfig kv =
      make_kv_cache_config(model.cache_plan(config.min_block_size), config.num_blocks);
  kv.enable_prefix_caching = config.enable_prefix_caching;
  kv.snapshot_policy = config.snapshot_policy;
  kv.prefix_extra_keys = config.prefix_extra_keys;
  return kv;
}

}  // namespace

Engine::Engine(std::unique_ptr<Model> model, EngineConfig config)
    : model_(std::move(model)), config_(complete_engine_config(*model_, std::move(config))) {
  if (config_.scheduler.max_loras > 0) {
    model_->enable_lora(config_.scheduler.max_loras, config_.max_lora_rank);
    loras_ = std::make_unique<LoraRegistry>(*model_, config_.max_lora_rank);
  }
  impl_ = std::make_unique<Impl>(*model_, config_, make_kv_config(*model_, config_));
  if (config_.speculative.enabled()) {
    const auto k = static_cast<size_t>(config_.speculative.num_speculative_tokens);
    impl_->stats.spec_decode.accepted_per_pos.assign(k, 0);
    log::info("engine: speculative decoding, {} with up to {} drafts per step",
              to_string(config_.speculative.method), k);
  }
}

Engine::~Engine() {
  stop();
}

void Engine::add_request(Request request, OutputCallback on_output) {
  CHECK_AS(Error, !dead_, "engine: the engine has failed and takes no new requests");
  // The scheduler's admission rules, checked here so the caller gets the error.
  const SchedulerConfig& sc = config_.scheduler;
  CHECK(!request.id.empty(), "request id must not be empty");
  validate_request(request.prompt_token_ids, request.sampling_params,
                   {sc.vocab_size, sc.max_model_len});
  impl_->scheduler.check_fits(request);
  if (request.lora != nullptr && !loras_) {
    throw InvalidRequest("model", "LoRA adapters are not enabled (--enable-lora)");
  }
  {
    std::lock_guard lock(impl_->mu);
    CHECK(!impl_->ids.contains(request.id), "request id '", request.id, "' is already in use");
    impl_->ids.insert(request.id);
    Impl::Command c;
    c.is_add = true;
    c.request = std::move(request);
    c.on_output = std::move(on_output);
    impl_->incoming.push_back(std::move(c));
  }
  impl_->cv.notify_all();
}

void Engine::abort_request(const std::string& request_id, const std::string& reason) {
  {
    std::lock_guard lock(impl_->mu);
    Impl::Command c;
    c.request_id = request_id;
    c.reason = reason;
    impl_->incoming.push_back(std::move(c));
  }
  impl_->cv.notify_all();
}

bool Engine::step() {
  std::vector<Impl::Delivery> out;
  bool did = false;
  if (dead_) {
    impl_->abort_all(out, "abort", true);
    did = !out.empty();
  } else {
    try {
      did = impl_->run_controls(out);
      if (!impl_->paused) {
        did = impl_->run_step(out) || did;
      } else {
        impl_->apply_incoming(out);  // aborts apply; adds wait for resume()
        impl_->has_work = false;
        impl_->update_stats(false);
        did = did || !out.empty();
      }
    } catch (const std::exception& e) {
      log::error("engine: step failed, aborting every request: {}", e.what());
      dead_ = true;
      out.clear();
      impl_->abort_all(out, "abort", true);
      did = true;
    }
  }
  if (dead_) impl_->fail_controls("engine: the engine has failed");
  Impl::deliver(out);
  impl_->answer_controls();
  return did;
}

void Engine::start() {
  std::lock_guard guard(impl_->mu);
  CHECK(!impl_->thread.joinable(), "engine: already started");
  impl_->stop_requested = false;
  impl_->thread = std::thread([this] {
    for (;;) {
      {
        std::unique_lock lock(impl_->mu);
        impl_->cv.wait(lock, [this] {
          return impl_->stop_requested || !impl_->incoming.empty() || impl_->has_work ||
                 !impl_->controls.empty();
        });
        if (impl_->stop_requested) return;
      }
      step();
    }
  });
}

void Engine::stop() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop_requested = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->fail_controls("engine: the engine stopped");
  std::vector<Impl::Delivery> out;
  impl_->abort_all(out, "abort", dead_);
  Impl::deliver(out);
}

void Engine::set_observer(EngineObserver* observer) {
  std::lock_guard lock(impl_->observer_mu);
  impl_->observer = observer;
}

void Engine::set_logits_observer(LogitsObserver fn) {
  impl_->runner.set_logits_observer(std::move(fn));
}

void Engine::set_plan_sink(PlanSink* sink) {
  impl_->runner.set_plan_sink(sink);
  impl_->has_workers = sink != nullptr;
}

const ModelRunner& Engine::runner() const {
  return impl_->runner;
}

void Engine::freeze_memory() {
  impl_->runner.freeze_workspace();
  model_->backend().freeze();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace hyserve
