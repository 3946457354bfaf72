#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "engine/logits_processor.h"
#include "guided/token_constraint.h"
#include "kernels/kda/params.h"
#include "kernels/sampling/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

// log_softmax of `row` at `token`, and the top_n best entries (logit desc, id asc).
OutputToken make_logprobs(std::span<const float> row, int32_t token, int32_t top_n) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : row) {
    if (l > max_logit) max_logit = l;
  }
  double sum = 0.0;
  for (float l : row) {
    if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - max_logit);
  }
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  const auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(row[static_cast<size_t>(id)]) - log_z);
  };
  const auto better = [&](int32_t a, int32_t b) {
    const float la = row[static_cast<size_t>(a)], lb = row[static_cast<size_t>(b)];
    if (std::isnan(la) != std::isnan(lb)) return std::isnan(lb);
    return la > lb || (!(lb > la) && a < b);
  };
  OutputToken out{token, logprob(token), 1, {}};
  for (int32_t id = 0; id < static_cast<int32_t>(row.size()); ++id) out.rank += better(id, token);
  if (top_n > 0) {
    std::vector<int32_t> ids(row.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto n = std::min<size_t>(static_cast<size_t>(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), better);
    for (size_t i = 0; i < n; ++i) out.top_logprobs.push_back({ids[i], logprob(ids[i])});
  }
  return out;
}

// The ids guided decoding allows once the structure is complete: stop_token_ids and the EOS
// ids (also under ignore_eos, where they then fill the output up to max_tokens).
std::vector<int32_t> terminator_ids(const SamplingParams& sp, std::span<const int32_t> eos) {
  std::vector<int32_t> ids(sp.stop_token_ids);
  ids.insert(ids.end(), eos.begin(), eos.end());
  return ids;
}

RequestOutput finished_output(const std::string& id, int64_t num_prompt_tokens,
                              const std::string& reason) {
  RequestOutput out;
  out.request_id = id;
  out.finished = true;
  out.finish_reason = reason;
  out.num_prompt_tokens = num_prompt_tokens;
  return out;
}

}  // namespace

struct Engine::Impl {
  // An admitted request, owned by the engine thread.
  struct Live {
    OutputCallback on_output;
    int64_t num_prompt_tokens = 0;
    uint64_t seed = 0;  // SamplingParams::seed, or drawn at admission
    std::optional<int32_t> prompt_logprobs;
    std::vector<std::optional<OutputToken>> prompt_logprob_values;  // [prompt_len] when asked
    bool sent_first_output = false;
    std::chrono::steady_clock::time_point arrival;  // when add_request was called
    bool scheduled_once = false;
    double queue_time_s = 0.0;  // arrival to first scheduling
    // Guided decoding: advanced over the request's outputs only (so a recompute after
    // preemption never feeds it twice); null when unconstrained.
    std::unique_ptr<ConstraintState> constraint;
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

  Impl(const Model& m, const EngineConfig& c, const KvCacheConfig& kv)
      : model(m),
        config(c),
        scheduler(c.scheduler, kv),
        cache(m.new_cache(kv.num_blocks, c.min_block_size)) {}

  void apply_incoming(std::vector<Delivery>& out);
  bool run_step(std::vector<Delivery>& out);
  // Finishes every queued and admitted request with `reason` (scheduler untouched when dead).
  void abort_all(std::vector<Delivery>& out, const std::string& reason, bool dead);
  void forget(const std::string& id);
  void update_stats(bool dead);
  // Calls the callbacks, outside every lock; a callback that throws is logged.
  static void deliver(std::vector<Delivery>& out);

  const Model& model;
  const EngineConfig& config;
  Scheduler scheduler;                               // engine thread
  std::unique_ptr<KvCache> cache;                    // the block pool's rows, engine thread
  std::unordered_map<std::string, Live> live;        // engine thread
  std::mt19937_64 seed_rng{std::random_device{}()};  // engine thread
  std::vector<float> logits;                         // [rows, vocab] of the last forward
  std::vector<uint8_t> allowed;                      // [vocab] guided decoding mask
  bool has_work = false;                             // engine thread

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Command> incoming;        // guarded by mu
  std::unordered_set<std::string> ids;  // queued or admitted, guarded by mu
  EngineStats stats;                    // guarded by mu
  bool stop_requested = false;          // guarded by mu
  std::thread thread;
};

void Engine::Impl::forget(const std::string& id) {
  live.erase(id);
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
    if (c.is_add) {
      const std::string id = c.request.id;
      Live l;
      l.on_output = std::move(c.on_output);
      l.arrival = c.arrival;
      l.num_prompt_tokens = c.request.num_prompt_tokens();
      const SamplingParams& sp = c.request.sampling_params;
      l.seed = sp.seed ? *sp.seed : seed_rng();
      l.prompt_logprobs = sp.prompt_logprobs;
      if (sp.constraint) l.constraint = std::make_unique<ConstraintState>(sp.constraint);
      if (l.prompt_logprobs)
        l.prompt_logprob_values.resize(static_cast<size_t>(l.num_prompt_tokens));
      try {
        scheduler.add_request(std::move(c.request));
      } catch (const Error& e) {
        std::fprintf(stderr, "engine: request %s refused at admission: %s\n", id.c_str(), e.what());
        out.push_back({l.on_output, finished_output(id, l.num_prompt_tokens, "abort")});
        std::lock_guard lock(mu);
        ids.erase(id);
        continue;
      }
      live.emplace(id, std::move(l));
    } else {
      const auto it = live.find(c.request_id);
      if (it == live.end() || !scheduler.abort_request(c.request_id)) continue;
      out.push_back({it->second.on_output,
                     finished_output(c.request_id, it->second.num_prompt_tokens, c.reason)});
      forget(c.request_id);
    }
  }
}

bool Engine::Impl::run_step(std::vector<Delivery>& out) {
  apply_incoming(out);
  const bool applied = !out.empty();
  if (!scheduler.has_unfinished_requests()) {
    has_work = false;
    update_stats(false);
    return applied;
  }
  const SchedulerOutput scheduled = scheduler.schedule();
  // A preempted request's blocks went back to the pool; it restarts from its prompt.
  const auto num_preemptions = static_cast<int64_t>(scheduled.preempted_request_ids.size());

  // One input per scheduled request; rows[i] is its first logits row.
  const int64_t vocab = model.config().vocab_size;
  std::vector<SequenceInput> batch;
  std::vector<int64_t> rows;
  int64_t num_rows = 0, num_prompt_tokens = 0;
  for (const ScheduledRequest& s : scheduled.requests) {
    Live& l = live.at(s.request_id);
    if (!l.scheduled_once) {
      l.scheduled_once = true;
      l.queue_time_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - l.arrival).count();
    }
    // The KDA state row: restored from the prefix hit's snapshot, or zero for a request
    // that starts (or restarts after preemption) from its first token.
    if (s.state_block) {
      if (s.restore_state_from) {
        cache->copy_block(*s.state_block, *s.restore_state_from);
      } else if (s.start_position == 0) {
        cache->zero_block(*s.state_block);
      }
    }
    // Prompt logprobs: the row at position j scores prompt token j + 1.
    const bool all_logits =
        l.prompt_logprobs && !l.sent_first_output && s.start_position + 1 < l.num_prompt_tokens;
    // A prefill chunk: prompt tokens, or several tokens at once (a recompute).
    const bool prefill = s.start_position < l.num_prompt_tokens || s.num_new_tokens() > 1;
    batch.push_back({cache.get(), s.block_ids, s.state_block.value_or(-1), s.start_position,
                     s.token_ids, all_logits, prefill});
    rows.push_back(num_rows);
    num_rows += all_logits ? s.num_new_tokens() : 1;
    num_prompt_tokens += std::max<int64_t>(
        0, std::min(s.start_position + s.num_new_tokens(), l.num_prompt_tokens) - s.start_position);
  }
  if (!batch.empty()) model.forward(batch, logits);
  // KDA snapshots at block boundaries, for later prefix hits (stream-ordered after the
  // forward that computed the state).
  for (const SnapshotCopy& copy : scheduled.snapshot_copies) {
    cache->copy_block(copy.snapshot_block, copy.state_block);
  }
  CHECK(static_cast<int64_t>(logits.size()) == num_rows * vocab || batch.empty(),
        "engine: forward returned ", logits.size(), " logits for ", num_rows, " rows");
  const auto row_of = [&](int64_t r) {
    return std::span<const float>(logits.data() + r * vocab, static_cast<size_t>(vocab));
  };

  // Processed rows of the requests that sample, one sample_tokens call over all of them.
  std::vector<size_t> sampling;  // indices into scheduled.requests
  std::vector<float> processed;  // [sampling.size(), vocab]
  std::vector<SamplingOptions> options;
  std::unordered_map<std::string, int64_t> num_cached;
  for (size_t i = 0; i < scheduled.requests.size(); ++i) {
    const ScheduledRequest& s = scheduled.requests[i];
    Live& l = live.at(s.request_id);
    const Request* r = scheduler.find_request(s.request_id);
    CHECK(r != nullptr, "engine: scheduled request ", s.request_id, " is unknown");
    num_cached[s.request_id] = r->num_cached_prompt_tokens;
    if (batch[i].all_logits) {
      for (int64_t j = 0; j < s.num_new_tokens(); ++j) {
        const int64_t pos = s.start_position + j;
        if (pos + 1 >= l.num_prompt_tokens) break;
        l.prompt_logprob_values[static_cast<size_t>(pos + 1)] =
            make_logprobs(row_of(rows[i] + j), r->prompt_token_ids[static_cast<size_t>(pos + 1)],
                          *l.prompt_logprobs);
      }
    }
    if (!s.samples) continue;
    const int64_t last = rows[i] + (batch[i].all_logits ? s.num_new_tokens() - 1 : 0);
    const auto raw = row_of(last);
    processed.insert(processed.end(), raw.begin(), raw.end());
    const SamplingParams& sp = r->sampling_params;
    if (needs_logits_processing(sp, r->num_output_tokens())) {
      const std::vector<int32_t> eos(config.scheduler.eos_token_ids.begin(),
                                     config.scheduler.eos_token_ids.end());
      apply_logits_processors(
          std::span<float>(processed.data() + sampling.size() * static_cast<size_t>(vocab),
                           static_cast<size_t>(vocab)),
          {&sp, r->prompt_token_ids, r->output_token_ids, eos});
    }
    if (l.constraint) {
      const std::vector<int32_t> stops = terminator_ids(sp, config.scheduler.eos_token_ids);
      l.constraint->sync(r->output_token_ids, stops);
      l.constraint->compute_mask(stops, allowed);
      apply_allowed_tokens(
          std::span<float>(processed.data() + sampling.size() * static_cast<size_t>(vocab),
                           static_cast<size_t>(vocab)),
          allowed);
    }
    options.push_back({sp.temperature, sp.top_k == -1 ? 0 : sp.top_k, sp.top_p, sp.min_p, l.seed,
                       static_cast<uint64_t>(r->num_output_tokens())});
    sampling.push_back(i);
  }
  std::vector<int32_t> tokens(sampling.size());
  if (!sampling.empty()) {
    cpu::sample_tokens({processed.data(), options.data(), tokens.data(),
                        static_cast<int64_t>(sampling.size()), vocab});
  }

  ModelRunnerOutput runner_output;
  std::unordered_map<std::string, OutputToken> sampled;
  for (size_t k = 0; k < sampling.size(); ++k) {
    const ScheduledRequest& s = scheduled.requests[sampling[k]];
    CHECK(tokens[k] >= 0, "engine: request ", s.request_id, ": every logit is NaN");
    runner_output.sampled_token_ids[s.request_id] = {tokens[k]};
    const Request* r = scheduler.find_request(s.request_id);
    const auto& logprobs = r->sampling_params.logprobs;
    OutputToken t{tokens[k], 0.0f, 0, {}};
    if (logprobs) {
      const int64_t last =
          rows[sampling[k]] + (batch[sampling[k]].all_logits ? s.num_new_tokens() - 1 : 0);
      t = make_logprobs(row_of(last), tokens[k], *logprobs);
    }
    sampled.emplace(s.request_id, std::move(t));
  }

  const std::vector<RequestUpdate> updates = scheduler.update_from_output(scheduled, runner_output);
  for (const RequestUpdate& u : updates) {
    Live& l = live.at(u.request_id);
    RequestOutput o;
    o.request_id = u.request_id;
    for (int32_t token : u.new_token_ids) {
      const auto it = sampled.find(u.request_id);
      o.new_tokens.push_back(it != sampled.end() && it->second.token == token
                                 ? it->second
                                 : OutputToken{token, 0.0f, 0, {}});
    }
    if (!l.sent_first_output) {
      o.prompt_logprobs = std::move(l.prompt_logprob_values);
      o.queue_time_s = l.queue_time_s;
      l.sent_first_output = true;
    }
    o.num_prompt_tokens = l.num_prompt_tokens;
    o.num_cached_tokens = num_cached[u.request_id];
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
    if (is_finished(u.status)) forget(u.request_id);
  }
  has_work = scheduler.has_unfinished_requests();
  {
    std::lock_guard lock(mu);
    stats.num_preemptions += num_preemptions;
    stats.prompt_tokens += num_prompt_tokens;
    stats.generation_tokens += static_cast<int64_t>(sampling.size());
  }
  update_stats(false);
  return applied || !scheduled.requests.empty();
}

void Engine::Impl::abort_all(std::vector<Delivery>& out, const std::string& reason, bool dead) {
  std::vector<Command> commands;
  {
    std::lock_guard lock(mu);
    commands.swap(incoming);
  }
  for (Command& c : commands) {
    if (!c.is_add) continue;
    out.push_back(
        {c.on_output, finished_output(c.request.id, c.request.num_prompt_tokens(), reason)});
  }
  for (auto& [id, l] : live) {
    if (!dead) scheduler.abort_request(id);
    out.push_back({l.on_output, finished_output(id, l.num_prompt_tokens, reason)});
  }
  live.clear();
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
      std::fprintf(stderr, "engine: output callback of %s threw: %s\n", d.output.request_id.c_str(),
                   e.what());
    }
  }
}

namespace {

EngineConfig complete_config(const Model& model, EngineConfig config) {
  const ModelConfig& mc = model.config();
  SchedulerConfig& sc = config.scheduler;
  if (sc.max_model_len == 0) sc.max_model_len = mc.max_position_embeddings;
  if (mc.num_kda_layers() > 0) sc.prefill_chunk_alignment = kKdaChunkSize;
  sc.vocab_size = mc.vocab_size;
  if (sc.eos_token_ids.empty()) {
    for (int64_t id : mc.eos_token_ids) sc.eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  CHECK(config.min_block_size >= 1 && (config.min_block_size & (config.min_block_size - 1)) == 0,
        "min_block_size must be a power of two, got ", config.min_block_size);
  CHECK(!(model.options().batch_invariant && mc.num_kda_layers() > 0) ||
            model.cache_plan(config.min_block_size).block_size % kKdaChunkSize == 0,
        "batch-invariant mode on a KDA model needs blocks of a multiple of ", kKdaChunkSize,
        " tokens (KDA prefill chunks) so that a prefix hit ends on a chunk boundary");
  CHECK(config.num_blocks >= 0, "num_blocks must be >= 0, got ", config.num_blocks);
  CHECK(sc.max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", sc.max_num_seqs);
  if (config.num_blocks == 0) {
    const int64_t block_size = model.cache_plan(config.min_block_size).block_size;
    const int64_t per_seq = (sc.max_model_len + block_size - 1) / block_size;
    const int64_t blocks = sc.max_num_seqs * per_seq + sc.max_num_seqs;
    CHECK(blocks <= std::numeric_limits<int32_t>::max(), "engine: ", blocks,
          " KV blocks do not fit an int32; set num_blocks");
    config.num_blocks = static_cast<int32_t>(blocks);
  }
  return config;
}

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
    : model_(std::move(model)), config_(complete_config(*model_, std::move(config))) {
  impl_ = std::make_unique<Impl>(*model_, config_, make_kv_config(*model_, config_));
}

Engine::~Engine() {
  stop();
}

void Engine::add_request(Request request, OutputCallback on_output) {
  CHECK_AS(Error, !dead_, "engine: the engine has failed and takes no new requests");
  // The scheduler's admission rules, checked here so the caller gets the error.
  const SchedulerConfig& sc = config_.scheduler;
  CHECK(!request.id.empty(), "request id must not be empty");
  request.sampling_params.validate(sc.vocab_size, sc.max_model_len);
  const int64_t num_prompt = request.num_prompt_tokens();
  CHECK(num_prompt >= 1, "request ", request.id, ": the prompt is empty");
  for (int32_t token : request.prompt_token_ids) {
    CHECK(token >= 0 && token < sc.vocab_size, "request ", request.id, ": prompt token id ", token,
          " out of range [0, ", sc.vocab_size, ")");
  }
  CHECK(num_prompt < sc.max_model_len, "request ", request.id, ": the prompt has ", num_prompt,
        " tokens, max_model_len is ", sc.max_model_len, ": no room for an output token");
  const auto& max_tokens = request.sampling_params.max_tokens;
  CHECK(!max_tokens || num_prompt + *max_tokens <= sc.max_model_len, "request ", request.id,
        ": prompt (", num_prompt, " tokens) + max_tokens (", max_tokens.value_or(0),
        ") exceeds max_model_len ", sc.max_model_len);
  const int64_t max_len =
      max_tokens ? std::min(num_prompt + *max_tokens, sc.max_model_len) : sc.max_model_len;
  const int64_t blocks_needed = impl_->scheduler.kv_cache().blocks_for_request(max_len - 1);
  CHECK(blocks_needed <= config_.num_blocks, "request ", request.id, ": prompt + max_tokens need ",
        blocks_needed, " KV blocks; the whole cache has ", config_.num_blocks);
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
      did = impl_->run_step(out);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "engine: step failed, aborting every request: %s\n", e.what());
      dead_ = true;
      out.clear();
      impl_->abort_all(out, "abort", true);
      did = true;
    }
  }
  Impl::deliver(out);
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
          return impl_->stop_requested || !impl_->incoming.empty() || impl_->has_work;
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
  std::vector<Impl::Delivery> out;
  impl_->abort_all(out, "abort", dead_);
  Impl::deliver(out);
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace hyserve
