#include "engine/model_runner.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "engine/speculative.h"
#include "parallel/communicator.h"
#include "util/error.h"

namespace hyserve {
namespace {

bool has_penalties(const SamplingParams& sp) {
  return sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f ||
         sp.frequency_penalty != 0.0f;
}

// The ids guided decoding allows once the structure is complete: stop_token_ids and the EOS
// ids (also under ignore_eos, where they then fill the output up to max_tokens).
std::vector<int32_t> terminator_ids(const SamplingParams& sp, std::span<const int32_t> eos) {
  std::vector<int32_t> ids(sp.stop_token_ids);
  ids.insert(ids.end(), eos.begin(), eos.end());
  return ids;
}

void set_bit(std::span<uint32_t> words, int32_t id) {
  words[static_cast<size_t>(id / kTokenMaskWordBits)] |= uint32_t{1} << (id % kTokenMaskWordBits);
}

}  // namespace

// One sampling row of a step: its request and where its logits come from.
struct ModelRunner::Sampling {
  const ScheduledRequest* scheduled = nullptr;
  const Request* request = nullptr;
  RequestState* state = nullptr;
  int part = 0;           // which forward of the step (two in batch-invariant mixed steps)
  int64_t logit_row = 0;  // row of that forward's logits
  int32_t logprobs = -1;  // top logprobs asked for; -1: none
  int64_t draw = 0;       // index among the request's outputs of the token it samples
};

void SpecDecodeCounts::add(const SpecDecodeCounts& o) {
  num_drafts += o.num_drafts;
  num_draft_tokens += o.num_draft_tokens;
  num_accepted_tokens += o.num_accepted_tokens;
  if (accepted_per_pos.size() < o.accepted_per_pos.size()) {
    accepted_per_pos.resize(o.accepted_per_pos.size(), 0);
  }
  for (size_t i = 0; i < o.accepted_per_pos.size(); ++i)
    accepted_per_pos[i] += o.accepted_per_pos[i];
}

int64_t ModelRunner::max_sample_rows(const ModelRunnerConfig& c) {
  return c.max_num_seqs * (1 + c.num_speculative_tokens);
}

int64_t ModelRunner::max_verify_tokens(const ModelRunnerConfig& c) {
  if (c.num_speculative_tokens <= 0) return 0;
  return std::min(c.max_num_batched_tokens, max_sample_rows(c));
}

int64_t ModelRunner::device_bytes(const Model& model, const ModelRunnerConfig& c) {
  const int64_t vocab = model.config().vocab_size;
  const int64_t words = token_mask_words(vocab);
  const int64_t rows = max_sample_rows(c);
  const int64_t lp_rows = std::max(rows, c.max_num_batched_tokens);
  const int64_t width = model.cache_plan().blocks_for_tokens(c.max_model_len);
  return 3 * rows * vocab * 4                                          // raw, work, weights
         + rows * (static_cast<int64_t>(sizeof(SamplingOptions)) + 8)  // options, ids
         + (c.max_num_seqs + 1) * (12 + vocab * 4 + words * 4)         // penalty state
         + rows * words * 4                                            // masks
         + rows * 4                                                    // mask rows
         + lp_rows * (4 + 4 + 4 + 8 + 8 * kMaxTopLogprobs)  // logprob targets and outputs
         + DecodeStep::device_bytes(vocab, c.max_num_seqs, width) +
         DecodeStep::verify_bytes(model, c.max_num_seqs, max_verify_tokens(c), width);
}

ModelRunner::ModelRunner(const Model& model, KvCache& cache, ModelRunnerConfig config)
    : model_(model),
      backend_(model.backend()),
      cache_(cache),
      config_(std::move(config)),
      ws_(&backend_),
      decode_(model, cache, ws_,
              {config_.max_num_seqs, config_.max_model_len, config_.graph_max_batch,
               max_verify_tokens(config_)}),
      vocab_(model.config().vocab_size) {
  if (config_.workspace_bytes > 0) ws_.reserve(config_.workspace_bytes);
  CHECK(config_.max_num_seqs >= 1 && config_.max_num_batched_tokens >= 1,
        "model runner: max_num_seqs ", config_.max_num_seqs, ", max_num_batched_tokens ",
        config_.max_num_batched_tokens);
  CHECK(vocab_ >= 1 && vocab_ <= kMaxSamplingVocab, "model runner: vocab ", vocab_, " outside [1, ",
        kMaxSamplingVocab, "]");
  CHECK(config_.num_speculative_tokens >= 0 &&
            config_.num_speculative_tokens <= kMaxSpeculativeTokens,
        "model runner: num_speculative_tokens ", config_.num_speculative_tokens);
  Backend* b = &backend_;
  const auto seqs = static_cast<size_t>(config_.max_num_seqs);
  sample_rows_ = max_sample_rows(config_);
  const auto srows = static_cast<size_t>(sample_rows_);
  const auto vocab = static_cast<size_t>(vocab_);
  const auto words = static_cast<size_t>(token_mask_words(vocab_));
  tokens_ = BackendBuffer(b, srows * 4);  // a worker's: the sampled ids rank 0 broadcasts
  if (!config_.samples) return;
  raw_ = BackendBuffer(b, srows * vocab * 4);
  work_ = BackendBuffer(b, srows * vocab * 4);
  weights_ = BackendBuffer(b, srows * vocab * 4);
  options_ = BackendBuffer(b, srows * sizeof(SamplingOptions));
  rows_ = BackendBuffer(b, srows * 4);
  repetition_ = BackendBuffer(b, (seqs + 1) * 4);
  presence_ = BackendBuffer(b, (seqs + 1) * 4);
  frequency_ = BackendBuffer(b, (seqs + 1) * 4);
  counts_ = BackendBuffer(b, (seqs + 1) * vocab * 4);
  prompt_mask_ = BackendBuffer(b, (seqs + 1) * words * 4);
  masks_ = BackendBuffer(b, srows * words * 4);
  max_logprob_rows_ = std::max(sample_rows_, config_.max_num_batched_tokens);
  const auto lp_rows = static_cast<size_t>(max_logprob_rows_);
  targets_ = BackendBuffer(b, lp_rows * 4);
  zero_rows_ = BackendBuffer(b, lp_rows * 4);
  mask_rows_ = BackendBuffer(b, srows * 4);
  logprob_ = BackendBuffer(b, lp_rows * 4);
  rank_ = BackendBuffer(b, lp_rows * 8);
  top_ids_ = BackendBuffer(b, lp_rows * kMaxTopLogprobs * 4);
  top_logprobs_ = BackendBuffer(b, lp_rows * kMaxTopLogprobs * 4);
  // Every row starts neutral (allocate() zeroes): repetition 1 in all of them.
  const std::vector<float> ones(seqs + 1, 1.0f);
  backend_.upload(repetition_.data(), ones.data(), ones.size() * 4);
  for (int64_t row = config_.max_num_seqs - 1; row >= 0; --row) {
    free_penalty_rows_.push_back(static_cast<int32_t>(row));
  }
  for (HostSlot& slot : slots_) {
    constexpr auto kHost = BackendBuffer::Memory::kHost;
    slot.tokens = BackendBuffer(b, srows * 4, kHost);
    slot.logprob = BackendBuffer(b, srows * 4, kHost);
    slot.top_ids = BackendBuffer(b, srows * kMaxTopLogprobs * 4, kHost);
    slot.top_logprobs = BackendBuffer(b, srows * kMaxTopLogprobs * 4, kHost);
  }
}

ModelRunner::~ModelRunner() {
  // Launched steps still copy into the pinned slots.
  if (!pending_.empty()) backend_.synchronize();
}

void ModelRunner::add_request(const std::string& request_id, uint64_t seed,
                              std::shared_ptr<const TokenConstraint> constraint) {
  RequestState s;
  s.seed = seed;
  if (constraint) s.constraint = std::make_unique<ConstraintState>(std::move(constraint));
  const bool added = requests_.emplace(request_id, std::move(s)).second;
  CHECK(added, "model runner: request ", request_id, " added twice");
}

void ModelRunner::remove_request(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  release_penalty_row(it->second);
  requests_.erase(it);
}

void ModelRunner::release_penalty_row(RequestState& state) {
  if (state.penalty_row < 0) return;
  free_penalty_rows_.push_back(state.penalty_row);
  state.penalty_row = -1;
}

int32_t ModelRunner::take_penalty_row(RequestState& state, const Request& r,
                                      std::span<const int32_t> outputs) {
  if (state.penalty_row >= 0) return state.penalty_row;
  CHECK(!free_penalty_rows_.empty(), "model runner: more than ", config_.max_num_seqs,
        " requests with penalties sample in one step");
  const int32_t row = free_penalty_rows_.back();
  free_penalty_rows_.pop_back();
  state.penalty_row = row;
  const SamplingParams& sp = r.sampling_params;
  const auto at = [&](const BackendBuffer& buf) { return buf.as<float>() + row; };
  backend_.upload(at(repetition_), &sp.repetition_penalty, 4);
  backend_.upload(at(presence_), &sp.presence_penalty, 4);
  backend_.upload(at(frequency_), &sp.frequency_penalty, 4);
  // The prompt's ids as a mask; the outputs so far (a request resumed after preemption)
  // counted on the device as new tokens are.
  const int64_t words = token_mask_words(vocab_);
  std::vector<uint32_t> mask(static_cast<size_t>(words), 0);
  for (int32_t id : r.prompt_token_ids) set_bit(mask, id);
  backend_.upload(prompt_mask_.as<uint32_t>() + row * words, mask.data(), mask.size() * 4);
  int32_t* counts = counts_.as<int32_t>() + row * vocab_;
  backend_.fill_zero(counts, static_cast<size_t>(vocab_) * 4);
  const auto n = std::ssize(outputs);
  for (int64_t first = 0; first < n; first += max_logprob_rows_) {
    const int64_t count = std::min(max_logprob_rows_, n - first);
    backend_.upload(targets_.data(), outputs.data() + first, static_cast<size_t>(count) * 4);
    CountTokensParams p;
    p.counts = counts;  // this row's counts: every token names row 0 of it
    p.rows = zero_rows_.as<int32_t>();
    p.tokens = targets_.as<int32_t>();
    p.num_tokens = count;
    p.vocab = vocab_;
    backend_.count_tokens(p);
  }
  return row;
}

void ModelRunner::prepare_state_rows(const SchedulerOutput& scheduled) {
  // The KDA state row: restored from the prefix hit's snapshot, or zero for a request that
  // starts (or restarts after preemption) from its first token.
  for (const ScheduledRequest& s : scheduled.requests) {
    if (!s.state_block) continue;
    if (s.restore_state_from) {
      cache_.copy_block(*s.state_block, *s.restore_state_from);
    } else if (s.start_position == 0) {
      cache_.zero_block(*s.state_block);
    }
  }
}

LogprobParams ModelRunner::run_logprobs(const float* logits, const int32_t* targets, int64_t count,
                                        int32_t top_n) {
  LogprobParams p;
  p.logits = logits;
  p.targets = targets;
  p.num_rows = count;
  p.vocab = vocab_;
  p.top_n = top_n;
  p.logprob = logprob_.as<float>();
  p.rank = rank_.as<int64_t>();
  p.top_ids = top_ids_.as<int32_t>();
  p.top_logprobs = top_logprobs_.as<float>();
  backend_.token_logprobs(p);
  return p;
}

std::vector<OutputToken> ModelRunner::score(const float* logits, const int32_t* targets,
                                            int64_t count, int32_t top_n, bool with_rank,
                                            int64_t& bytes) {
  const LogprobParams p = run_logprobs(logits, targets, count, top_n);
  const auto n = static_cast<size_t>(count), top = static_cast<size_t>(top_n);
  std::vector<float> lp(n), top_lp(n * top);
  std::vector<int64_t> rank(n);
  std::vector<int32_t> top_ids(n * top);
  backend_.download(lp.data(), p.logprob, n * 4);
  if (with_rank) backend_.download(rank.data(), p.rank, n * 8);
  if (top > 0) {
    backend_.download(top_ids.data(), p.top_ids, n * top * 4);
    backend_.download(top_lp.data(), p.top_logprobs, n * top * 4);
  }
  bytes += count * (4 + (with_rank ? 8 : 0) + 8 * int64_t{top_n});
  std::vector<OutputToken> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].logprob = lp[i];
    out[i].rank = rank[i];
    for (size_t j = 0; j < top; ++j)
      out[i].top_logprobs.push_back({top_ids[i * top + j], top_lp[i * top + j]});
  }
  return out;
}

std::vector<OutputToken> ModelRunner::prompt_logprobs(const float* logits,
                                                      std::span<const int32_t> targets,
                                                      int32_t top_n, int64_t& bytes) {
  std::vector<OutputToken> out;
  const auto n = static_cast<int64_t>(targets.size());
  for (int64_t first = 0; first < n; first += max_logprob_rows_) {
    const int64_t count = std::min(max_logprob_rows_, n - first);
    backend_.upload(targets_.data(), targets.data() + first, static_cast<size_t>(count) * 4);
    std::vector<OutputToken> part =
        score(logits + first * vocab_, targets_.as<int32_t>(), count, top_n, true, bytes);
    for (int64_t i = 0; i < count; ++i) {
      part[static_cast<size_t>(i)].token = targets[static_cast<size_t>(first + i)];
      out.push_back(std::move(part[static_cast<size_t>(i)]));
    }
  }
  return out;
}

void ModelRunner::apply_logits_processors(std::span<const Sampling> rows, float* work) {
  const auto n = static_cast<int64_t>(rows.size());
  // 1. Penalties, over every row at once when any asks: the others read the neutral row.
  std::vector<int32_t> penalty_rows(rows.size(), static_cast<int32_t>(config_.max_num_seqs));
  bool any_penalty = false;
  for (size_t k = 0; k < rows.size(); ++k) {
    if (!has_penalties(rows[k].request->sampling_params)) continue;
    RequestState& state = *rows[k].state;
    penalty_rows[k] = state.penalty_row >= 0
                          ? state.penalty_row
                          : take_penalty_row(state, *rows[k].request,
                                             outputs_before_draw(*rows[k].request, true));
    any_penalty = true;
  }
  if (any_penalty) {
    backend_.upload(rows_.data(), penalty_rows.data(), penalty_rows.size() * 4);
    PenaltyParams p;
    p.logits = work;
    p.rows = rows_.as<int32_t>();
    p.repetition = repetition_.as<float>();
    p.presence = presence_.as<float>();
    p.frequency = frequency_.as<float>();
    p.output_counts = counts_.as<int32_t>();
    p.prompt_mask = prompt_mask_.as<uint32_t>();
    p.num_rows = n;
    p.vocab = vocab_;
    backend_.apply_penalties(p);
  }

  // 2. logit_bias (summed per id), then the min_tokens bans.
  std::vector<int32_t> add_row, add_id, ban_row, ban_id;
  std::vector<float> add_value;
  for (size_t k = 0; k < rows.size(); ++k) {
    const Request& r = *rows[k].request;
    const SamplingParams& sp = r.sampling_params;
    std::map<int32_t, float> bias;
    for (const auto& [id, b] : sp.logit_bias) bias[id] += b;
    for (const auto& [id, b] : bias) {
      add_row.push_back(static_cast<int32_t>(k));
      add_id.push_back(id);
      add_value.push_back(b);
    }
    if (rows[k].draw < sp.min_tokens) {
      std::set<int32_t> banned(sp.stop_token_ids.begin(), sp.stop_token_ids.end());
      if (!sp.ignore_eos) banned.insert(config_.eos_token_ids.begin(), config_.eos_token_ids.end());
      for (int32_t id : banned) {
        ban_row.push_back(static_cast<int32_t>(k));
        ban_id.push_back(id);
      }
    }
  }
  const auto total = static_cast<int64_t>(add_row.size() + ban_row.size());
  if (total > 0) {
    if (total > entries_capacity_) {
      entries_capacity_ = std::max<int64_t>(total, 2 * entries_capacity_);
      entries_ = BackendBuffer(&backend_, static_cast<size_t>(entries_capacity_) * 12);
    }
    // [rows | ids | values], adds first, then bans.
    std::vector<int32_t> packed;
    packed.reserve(static_cast<size_t>(3 * total));
    packed.insert(packed.end(), add_row.begin(), add_row.end());
    packed.insert(packed.end(), ban_row.begin(), ban_row.end());
    packed.insert(packed.end(), add_id.begin(), add_id.end());
    packed.insert(packed.end(), ban_id.begin(), ban_id.end());
    for (float v : add_value) packed.push_back(std::bit_cast<int32_t>(v));
    packed.resize(static_cast<size_t>(3 * total), 0);
    backend_.upload(entries_.data(), packed.data(), packed.size() * 4);
    const int32_t* e = entries_.as<int32_t>();
    const auto num_adds = static_cast<int64_t>(add_row.size());
    LogitAdjustParams p;
    p.logits = work;
    p.num_rows = n;
    p.vocab = vocab_;
    if (num_adds > 0) {
      p.row = e;
      p.id = e + total;
      p.value = reinterpret_cast<const float*>(e + 2 * total);
      p.num_entries = num_adds;
      p.mode = LogitAdjustMode::kAdd;
      backend_.adjust_logits(p);
    }
    if (total > num_adds) {
      p.row = e + num_adds;
      p.id = e + total + num_adds;
      p.value = nullptr;
      p.num_entries = total - num_adds;
      p.mode = LogitAdjustMode::kBan;
      backend_.adjust_logits(p);
    }
  }

  // 3. Guided decoding: the constraint's allowed ids as a bitmask per constrained row.
  const int64_t words = token_mask_words(vocab_);
  std::vector<int32_t> masked_rows;
  std::vector<uint32_t> masks;
  std::vector<uint8_t> allowed;
  for (size_t k = 0; k < rows.size(); ++k) {
    ConstraintState* c = rows[k].state->constraint.get();
    if (c == nullptr) continue;
    const Request& r = *rows[k].request;
    const std::vector<int32_t> stops = terminator_ids(r.sampling_params, config_.eos_token_ids);
    c->sync(outputs_before_draw(r, true), stops);
    c->compute_mask(stops, allowed);
    masked_rows.push_back(static_cast<int32_t>(k));
    masks.resize(masks.size() + static_cast<size_t>(words), 0);
    const std::span<uint32_t> row(masks.data() + masks.size() - static_cast<size_t>(words),
                                  static_cast<size_t>(words));
    for (size_t id = 0; id < allowed.size() && static_cast<int64_t>(id) < vocab_; ++id) {
      if (allowed[id] != 0) set_bit(row, static_cast<int32_t>(id));
    }
  }
  if (!masked_rows.empty()) {
    backend_.upload(masks_.data(), masks.data(), masks.size() * 4);
    backend_.upload(mask_rows_.data(), masked_rows.data(), masked_rows.size() * 4);
    TokenMaskParams p;
    p.logits = work;
    p.rows = mask_rows_.as<int32_t>();
    p.mask = masks_.as<uint32_t>();
    p.num_masked = static_cast<int64_t>(masked_rows.size());
    p.num_rows = n;
    p.vocab = vocab_;
    backend_.apply_token_mask(p);
  }
  penalties_active_ = any_penalty;
}

void ModelRunner::sample(std::span<const Sampling> rows, const float* work) {
  std::vector<SamplingOptions> options;
  for (const Sampling& s : rows) {
    const SamplingParams& sp = s.request->sampling_params;
    const SamplingOptions o{sp.temperature, sp.top_k == -1 ? 0 : sp.top_k, sp.top_p, sp.min_p,
                            s.state->seed,  static_cast<uint64_t>(s.draw)};
    CHECK(sampling::options_valid(o), "request ", s.scheduled->request_id,
          ": sampling options out of range");
    options.push_back(o);
  }
  backend_.upload(options_.data(), options.data(), options.size() * sizeof(SamplingOptions));
  SampleParams p;
  p.logits = work;
  p.options = options_.as<SamplingOptions>();
  p.tokens = tokens_.as<int32_t>();
  p.num_rows = static_cast<int64_t>(rows.size());
  p.vocab = vocab_;
  p.weights = weights_.as<uint32_t>();
  backend_.sample_tokens(p);
  if (penalties_active_) {
    // The new tokens join the outputs' counts (rows_ still holds each row's penalty row;
    // rows without penalties count into the neutral row, which no penalty reads).
    CountTokensParams c;
    c.counts = counts_.as<int32_t>();
    c.rows = rows_.as<int32_t>();
    c.tokens = tokens_.as<int32_t>();
    c.num_tokens = p.num_rows;
    c.vocab = vocab_;
    backend_.count_tokens(c);
  }
}

void ModelRunner::logprobs_of_samples(std::span<const Sampling> rows, HostSlot& slot,
                                      int64_t& bytes) {
  // Rows are ordered by logprobs asked (descending): one call per run of equal counts, over
  // the raw rows, scoring the sampled ids (already on the device); each run's results are
  // copied to the slot: logprobs at their rows, top entries [count, top_n] from row
  // first * kMaxTopLogprobs (collect() reads them there).
  for (size_t first = 0; first < rows.size();) {
    const int32_t top_n = rows[first].logprobs;
    if (top_n < 0) break;
    size_t end = first;
    while (end < rows.size() && rows[end].logprobs == top_n) ++end;
    const auto count = static_cast<int64_t>(end - first);
    const LogprobParams p = run_logprobs(raw_.as<float>() + static_cast<int64_t>(first) * vocab_,
                                         tokens_.as<int32_t>() + first, count, top_n);
    const auto n = static_cast<size_t>(count), top = static_cast<size_t>(top_n);
    backend_.download_async(slot.logprob.as<float>() + first, p.logprob, n * 4);
    if (top > 0) {
      backend_.download_async(slot.top_ids.as<int32_t>() + first * kMaxTopLogprobs, p.top_ids,
                              n * top * 4);
      backend_.download_async(slot.top_logprobs.as<float>() + first * kMaxTopLogprobs,
                              p.top_logprobs, n * top * 4);
    }
    bytes += count * (4 + 8 * int64_t{top_n});
    first = end;
  }
}

int32_t ModelRunner::pending_token(const std::string& request_id) {
  const auto it = last_rows_.find(request_id);
  CHECK(it != last_rows_.end(), "model runner: request ", request_id,
        " has a placeholder that the last step does not sample");
  backend_.wait_fence(last_fence_);
  const int32_t token = slots_[last_slot_].tokens.as<int32_t>()[it->second];
  CHECK(token >= 0, "model runner: request ", request_id, ": every logit is NaN");
  return token;
}

std::vector<int32_t> ModelRunner::outputs_before_draw(const Request& r, bool samples) {
  const int64_t unresolved = r.num_output_placeholders - (samples ? 1 : 0);
  CHECK(unresolved == 0 || unresolved == 1, "model runner: request ", r.id, " has ",
        r.num_output_placeholders, " placeholders");
  std::vector<int32_t> out = r.output_token_ids;
  if (unresolved == 1) out.push_back(pending_token(r.id));
  return out;
}

RunnerStepResult ModelRunner::execute(const SchedulerOutput& scheduled,
                                      const Scheduler& scheduler) {
  launch(scheduled, scheduler);
  return collect();
}

void ModelRunner::launch(const SchedulerOutput& scheduled, const Scheduler& scheduler) {
  CHECK(pending_.size() < 2, "model runner: a third step launched before the first is collected");
  const TensorParallel& tp = model_.options().tp;
  CHECK(config_.samples && (tp.size == 1 || (tp.rank == 0 && plan_sink_ != nullptr)),
        "model runner: steps are launched on rank 0 of a tensor-parallel group, with a plan sink ",
        "(this is rank ", tp.rank, " of ", tp.size, ")");
  Pending pending;
  pending.slot = static_cast<int>(num_launches_++ % 2);
  RunnerStepResult& result = pending.result;
  for (const std::string& id : scheduled.finished_request_ids) remove_request(id);
  for (const std::string& id : scheduled.preempted_request_ids) {
    if (const auto it = requests_.find(id); it != requests_.end()) release_penalty_row(it->second);
  }

  // The forward's inputs, one per scheduled request, at the scheduler's slots. An input
  // that is a placeholder (the last step samples it) names its row of tokens_.
  std::vector<SequenceInput> inputs;
  std::vector<const Request*> requests;
  std::vector<int32_t> source_rows(scheduled.requests.size(), -1);
  for (const ScheduledRequest& s : scheduled.requests) {
    const Request* r = scheduler.find_request(s.request_id);
    CHECK(r != nullptr, "model runner: scheduled request ", s.request_id, " is unknown");
    requests.push_back(r);
    const int64_t num_prompt = r->num_prompt_tokens();
    // Prompt logprobs: the row at position j scores prompt token j + 1 (computed once:
    // not again when a preempted request recomputes its prompt).
    const bool all_logits = r->sampling_params.prompt_logprobs && r->num_output_tokens() == 0 &&
                            s.start_position + 1 < num_prompt;
    // A prefill chunk: prompt tokens, or several known tokens at once (a recompute).
    const bool prefill =
        s.start_position < num_prompt || s.num_new_tokens() - s.num_draft_tokens > 1;
    SequenceInput in;
    in.cache = &cache_;
    in.blocks = s.block_ids;
    in.state_block = s.state_block.value_or(-1);
    in.num_computed = s.start_position;
    in.tokens = s.token_ids;
    in.slots = s.slot_mapping;
    in.all_logits = all_logits;
    in.prefill = prefill;
    for (size_t j = 0; j < s.token_ids.size(); ++j) {
      if (s.token_ids[j] != kPlaceholderToken) continue;
      CHECK(j + 1 == s.token_ids.size() && r->num_output_placeholders >= 1,
            "model runner: request ", s.request_id, " has a placeholder input at ", j, " of ",
            s.token_ids.size());
      const auto it = last_rows_.find(s.request_id);
      CHECK(it != last_rows_.end(), "model runner: request ", s.request_id,
            " has a placeholder that the last step does not sample");
      source_rows[inputs.size()] = it->second;
    }
    inputs.push_back(in);
  }
  // Host copies of inputs whose placeholder is resolved on the host (a forward that is not
  // the decode step's).
  std::vector<std::vector<int32_t>> resolved(inputs.size());
  // Batch-invariant mode runs prefill chunks and decode tokens as two forwards; so does a
  // step with drafts, whose decode tokens (with or without drafts) are one verification.
  std::vector<int> part_of(inputs.size(), 0);
  int num_parts = 1;
  const bool verifies =
      std::any_of(scheduled.requests.begin(), scheduled.requests.end(),
                  [](const ScheduledRequest& s) { return s.num_draft_tokens > 0; });
  std::vector<bool> verified(inputs.size(), false);
  if (verifies) {
    num_parts = 2;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ScheduledRequest& s = scheduled.requests[i];
      verified[i] = s.samples && !inputs[i].prefill && !inputs[i].all_logits;
      part_of[i] = verified[i] ? 1 : 0;
      CHECK(verified[i] || s.num_draft_tokens == 0, "model runner: request ", s.request_id,
            " has drafts after a prefill chunk");
      CHECK(s.num_draft_tokens == 0 || speculates(requests[i]->sampling_params),
            "model runner: request ", s.request_id,
            " has drafts but samples with penalties or a "
            "constraint");
    }
  } else if (!inputs.empty() && model_.mixes_prefill_and_decode(inputs)) {
    num_parts = 2;
    for (size_t i = 0; i < inputs.size(); ++i) part_of[i] = inputs[i].prefill ? 0 : 1;
  }

  // The sampling rows, ordered by logprobs asked (descending, stable): one per request that
  // samples, and in a verification one per verified position (the token after each draft and
  // after the last), drawn with the request's draw indices of those outputs.
  std::vector<Sampling> rows;
  std::vector<int64_t> logit_row(inputs.size(), 0);
  {
    int64_t next[2] = {0, 0};
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int p = part_of[i];
      logit_row[i] = next[p];
      const int64_t n = inputs[i].all_logits || verified[i] ? std::ssize(inputs[i].tokens) : 1;
      next[p] += n;
      const ScheduledRequest& s = scheduled.requests[i];
      if (!s.samples) continue;
      const auto it = requests_.find(s.request_id);
      CHECK(it != requests_.end(), "model runner: request ", s.request_id, " was never added");
      const auto& lp = requests[i]->sampling_params.logprobs;
      const int64_t draw = requests[i]->num_outputs_with_placeholders() - 1;
      const int64_t positions = verified[i] ? n : 1;
      for (int64_t j = 0; j < positions; ++j) {
        rows.push_back({&s, requests[i], &it->second, p, logit_row[i] + n - positions + j,
                        lp ? *lp : -1, draw + j});
      }
    }
  }
  CHECK(std::ssize(rows) <= sample_rows_, "model runner: ", rows.size(),
        " sampling rows in one step, at most ", sample_rows_);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Sampling& a, const Sampling& b) { return a.logprobs > b.logprobs; });
  // The verification's sequences in its batch order, with their rows.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!verified[i]) continue;
    const ScheduledRequest& s = scheduled.requests[i];
    Verified v;
    v.request_id = s.request_id;
    v.drafts.assign(s.token_ids.begin() + 1, s.token_ids.end());
    v.seed = requests_.at(s.request_id).seed;
    v.draw = requests[i]->num_outputs_with_placeholders() - 1;
    for (size_t k = 0; k < rows.size(); ++k) {
      if (rows[k].scheduled == &s) v.rows.push_back(k);
    }
    std::sort(v.rows.begin(), v.rows.end(),
              [&](size_t a, size_t b) { return rows[a].draw < rows[b].draw; });
    pending.verified.push_back(std::move(v));
  }

  // Each forward's batch, and where it runs; placeholders of a forward that is not the
  // decode step's are resolved on the host (waiting for the step before).
  std::vector<PartRun> runs;
  for (int part = 0; part < num_parts; ++part) {
    PartRun run;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (part_of[i] != part) continue;
      run.batch.push_back(inputs[i]);
      run.index.push_back(i);
      run.rows_of_batch.push_back(source_rows[i]);
      run.placeholder = run.placeholder || source_rows[i] >= 0;
    }
    if (run.batch.empty()) continue;
    if (verifies && part == 1) {
      run.verify = true;
      CHECK(!run.placeholder && decode_.accepts_verify(run.batch), "model runner: the step's ",
            run.batch.size(), " decode sequences do not fit one verification");
      runs.push_back(std::move(run));
      continue;
    }
    run.decode = decode_.accepts(run.batch);
    if (!run.decode) {
      for (size_t b = 0; b < run.batch.size(); ++b) {
        if (run.rows_of_batch[b] < 0) continue;
        const size_t i = run.index[b];
        resolved[i].assign(run.batch[b].tokens.begin(), run.batch[b].tokens.end());
        resolved[i].back() = pending_token(scheduled.requests[i].request_id);
        run.batch[b].tokens = resolved[i];
        run.rows_of_batch[b] = -1;
      }
      run.placeholder = false;
    }
    runs.push_back(std::move(run));
  }
  if (plan_sink_ != nullptr) {
    plan_sink_->send(make_plan(scheduled, runs, static_cast<int32_t>(rows.size())));
  }
  prepare_state_rows(scheduled);

  for (const PartRun& run : runs) {
    const int part = part_of[run.index.front()];
    const std::vector<size_t>& index = run.index;
    const float* logits = run.verify    ? decode_.verify(run.batch)
                          : !run.decode ? model_.forward_logits(run.batch, ws_)
                          : run.placeholder
                              ? decode_.run(run.batch, {tokens_.as<int32_t>(), run.rows_of_batch})
                              : decode_.run(run.batch);
    // Prompt logprobs of the rows that asked, from this forward's logits.
    for (size_t i : index) {
      if (!inputs[i].all_logits) continue;
      const ScheduledRequest& s = scheduled.requests[i];
      const Request& r = *requests[i];
      std::vector<int32_t> targets;
      for (int64_t pos = s.start_position;
           pos < s.start_position + s.num_new_tokens() && pos + 1 < r.num_prompt_tokens(); ++pos) {
        targets.push_back(r.prompt_token_ids[static_cast<size_t>(pos + 1)]);
      }
      const std::vector<OutputToken> entries =
          prompt_logprobs(logits + logit_row[i] * vocab_, targets,
                          *r.sampling_params.prompt_logprobs, result.bytes_downloaded);
      auto& dst = result.requests[s.request_id].prompt_logprobs;
      for (size_t j = 0; j < entries.size(); ++j) {
        dst.emplace_back(s.start_position + static_cast<int64_t>(j) + 1, entries[j]);
      }
    }
    // The sampling rows of this forward into raw, runs of consecutive rows in one copy.
    for (size_t k = 0; k < rows.size();) {
      if (rows[k].part != part) {
        ++k;
        continue;
      }
      size_t end = k + 1;
      while (end < rows.size() && rows[end].part == part &&
             rows[end].logit_row == rows[end - 1].logit_row + 1) {
        ++end;
      }
      backend_.copy(raw_.as<float>() + static_cast<int64_t>(k) * vocab_,
                    logits + rows[k].logit_row * vocab_,
                    static_cast<size_t>((static_cast<int64_t>(end - k)) * vocab_) * 4);
      k = end;
    }
  }
  // KDA snapshots at block boundaries, for later prefix hits (stream-ordered after the
  // forward that computed the state).
  for (const SnapshotCopy& copy : scheduled.snapshot_copies) {
    cache_.copy_block(copy.snapshot_block, copy.state_block);
  }
  if (rows.empty()) {
    last_rows_.clear();
    pending.fence = backend_.fence();
    pending_.push_back(std::move(pending));
    return;
  }

  if (observer_) {
    std::vector<float> row(static_cast<size_t>(vocab_));
    for (size_t k = 0; k < rows.size(); ++k) {
      backend_.download(row.data(), raw_.as<float>() + static_cast<int64_t>(k) * vocab_,
                        row.size() * 4);
      observer_(rows[k].scheduled->request_id, row);
    }
  }
  // The processors change work; logprobs read raw, so work is a copy when any row asks.
  float* work = raw_.as<float>();
  if (rows.front().logprobs >= 0) {
    work = work_.as<float>();
    backend_.copy(work, raw_.data(), rows.size() * static_cast<size_t>(vocab_) * 4);
  }
  apply_logits_processors(rows, work);
  sample(rows, work);
  broadcast_sampled(static_cast<int32_t>(rows.size()));
  HostSlot& slot = slots_[pending.slot];
  backend_.download_async(slot.tokens.data(), tokens_.data(), rows.size() * 4);
  result.bytes_downloaded += std::ssize(rows) * 4;
  logprobs_of_samples(rows, slot, result.bytes_downloaded);
  pending.fence = backend_.fence();
  last_rows_.clear();
  for (size_t k = 0; k < rows.size(); ++k) {
    pending.sample_ids.push_back(rows[k].scheduled->request_id);
    pending.top_n.push_back(rows[k].logprobs);
    // (A verified request's placeholder is never an input: no asynchronous scheduling.)
    if (!verifies) last_rows_[rows[k].scheduled->request_id] = static_cast<int32_t>(k);
  }
  last_slot_ = pending.slot;
  last_fence_ = pending.fence;
  pending_.push_back(std::move(pending));
}

RunnerStepResult ModelRunner::collect() {
  CHECK(!pending_.empty(), "model runner: collect() without a launched step");
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  backend_.wait_fence(p.fence);
  const HostSlot& slot = slots_[p.slot];
  RunnerStepResult result = std::move(p.result);
  // Row k's token with its logprobs.
  std::vector<size_t> run_first(p.sample_ids.size(), 0);  // k's run of equal top_n
  for (size_t k = 1; k < p.sample_ids.size(); ++k) {
    run_first[k] = p.top_n[k] != p.top_n[k - 1] ? k : run_first[k - 1];
  }
  const auto output_token = [&](size_t k) {
    const int32_t token = slot.tokens.as<int32_t>()[k];
    CHECK(token >= 0, "model runner: request ", p.sample_ids[k], ": every logit is NaN");
    OutputToken t;
    t.token = token;
    if (p.top_n[k] >= 0) {
      t.logprob = slot.logprob.as<float>()[k];
      const size_t at =
          run_first[k] * kMaxTopLogprobs + (k - run_first[k]) * static_cast<size_t>(p.top_n[k]);
      const int32_t* ids = slot.top_ids.as<int32_t>() + at;
      const float* lps = slot.top_logprobs.as<float>() + at;
      for (int32_t j = 0; j < p.top_n[k]; ++j) t.top_logprobs.push_back({ids[j], lps[j]});
    }
    return t;
  };
  std::vector<bool> in_verification(p.sample_ids.size(), false);
  for (const Verified& v : p.verified) {
    for (size_t k : v.rows) in_verification[k] = true;
  }
  for (size_t k = 0; k < p.sample_ids.size(); ++k) {
    if (in_verification[k]) continue;
    OutputToken t = output_token(k);
    result.output.sampled_token_ids[p.sample_ids[k]] = {t.token};
    result.requests[p.sample_ids[k]].sampled = {std::move(t)};
  }
  // A verification: each request keeps its drafts while the token sampled at a position is
  // the draft after it, then the token sampled at the first mismatch (or after the last
  // draft); synthetic: the accepted drafts drawn, then the token sampled after them. The KDA
  // states then take exactly the kept inputs (the token before the drafts and the accepted
  // drafts).
  std::vector<int32_t> commits;
  for (const Verified& v : p.verified) {
    const auto num_drafts = std::ssize(v.drafts);
    std::vector<OutputToken> tokens;
    int64_t accepted = 0;
    if (config_.synthetic) {
      accepted = synthetic_accepted(config_.synthetic_rate, num_drafts, v.seed, v.draw);
      for (int64_t j = 0; j < accepted; ++j) {
        OutputToken t = output_token(v.rows[static_cast<size_t>(j)]);
        t.token = v.drafts[static_cast<size_t>(j)];
        tokens.push_back(std::move(t));
      }
      tokens.push_back(output_token(v.rows[static_cast<size_t>(accepted)]));
    } else {
      for (;;) {
        tokens.push_back(output_token(v.rows[static_cast<size_t>(accepted)]));
        if (accepted == num_drafts ||
            tokens.back().token != v.drafts[static_cast<size_t>(accepted)]) {
          break;
        }
        ++accepted;
      }
    }
    commits.push_back(static_cast<int32_t>(accepted + 1));
    if (num_drafts > 0) {
      SpecDecodeCounts& c = result.spec;
      ++c.num_drafts;
      c.num_draft_tokens += num_drafts;
      c.num_accepted_tokens += accepted;
      if (std::ssize(c.accepted_per_pos) < num_drafts) c.accepted_per_pos.resize(num_drafts, 0);
      for (int64_t j = 0; j < accepted; ++j) ++c.accepted_per_pos[static_cast<size_t>(j)];
    }
    std::vector<int32_t>& ids = result.output.sampled_token_ids[v.request_id];
    for (const OutputToken& t : tokens) ids.push_back(t.token);
    result.requests[v.request_id].sampled = std::move(tokens);
  }
  if (!commits.empty()) {
    decode_.commit(commits);
    if (plan_sink_ != nullptr) plan_commits_ = std::move(commits);
  }
  return result;
}

StepPlan ModelRunner::make_plan(const SchedulerOutput& scheduled, std::span<const PartRun> parts,
                                int32_t num_sampled) {
  StepPlan plan;
  plan.step = ++num_plans_;
  plan.commits = std::move(plan_commits_);
  plan_commits_.clear();
  for (const auto* ids : {&scheduled.finished_request_ids, &scheduled.preempted_request_ids}) {
    for (const std::string& id : *ids) {
      if (plan_tables_.erase(id) > 0) plan.dropped.push_back(id);
    }
  }
  for (const ScheduledRequest& s : scheduled.requests) {
    if (!s.state_block) continue;
    if (s.restore_state_from) {
      plan.state_ops.push_back({*s.state_block, *s.restore_state_from});
    } else if (s.start_position == 0) {
      plan.state_ops.push_back({*s.state_block, -1});
    }
  }
  for (const PartRun& run : parts) {
    PlanPart part;
    part.decode_step = run.decode;
    part.verify = run.verify;
    for (size_t b = 0; b < run.batch.size(); ++b) {
      const SequenceInput& in = run.batch[b];
      PlanSequence q;
      q.request_id = scheduled.requests[run.index[b]].request_id;
      q.num_computed = in.num_computed;
      q.state_block = in.state_block;
      q.all_logits = in.all_logits;
      q.prefill = in.prefill;
      q.tokens.assign(in.tokens.begin(), in.tokens.end());
      q.source_row = run.rows_of_batch[b];
      q.slots.assign(in.slots.begin(), in.slots.end());
      // Only what changed of the table the workers hold for this request.
      std::vector<int32_t>& sent = plan_tables_[q.request_id];
      const auto kept = std::mismatch(sent.begin(), sent.end(), in.blocks.begin(), in.blocks.end());
      q.blocks_kept = kept.first - sent.begin();
      q.new_blocks.assign(kept.second, in.blocks.end());
      sent.assign(in.blocks.begin(), in.blocks.end());
      part.sequences.push_back(std::move(q));
    }
    plan.parts.push_back(std::move(part));
  }
  for (const SnapshotCopy& copy : scheduled.snapshot_copies) {
    plan.snapshots.push_back({copy.state_block, copy.snapshot_block});
  }
  plan.num_sampled = num_sampled;
  return plan;
}

void ModelRunner::broadcast_sampled(int32_t count) {
  const TensorParallel& tp = model_.options().tp;
  if (tp.size <= 1 || count == 0) return;
  tp.comm->broadcast(tokens_.data(), static_cast<size_t>(count) * 4, 0);
}

void ModelRunner::run_plan(const StepPlan& plan) {
  const TensorParallel& tp = model_.options().tp;
  CHECK(tp.size > 1 && tp.rank > 0, "model runner: run_plan on rank ", tp.rank, " of ", tp.size);
  if (!plan.commits.empty()) decode_.commit(plan.commits);
  for (const std::string& id : plan.dropped) plan_tables_.erase(id);
  for (const PlanStateOp& op : plan.state_ops) {
    if (op.source_block < 0) {
      cache_.zero_block(op.state_block);
    } else {
      cache_.copy_block(op.state_block, op.source_block);
    }
  }
  for (const PlanPart& part : plan.parts) {
    std::vector<SequenceInput> batch;
    std::vector<int32_t> rows;
    bool placeholder = false;
    for (const PlanSequence& q : part.sequences) {
      std::vector<int32_t>& table = plan_tables_[q.request_id];
      CHECK(q.blocks_kept <= std::ssize(table), "step plan ", plan.step, ": request ", q.request_id,
            " keeps ", q.blocks_kept, " blocks of ", table.size());
      table.resize(static_cast<size_t>(q.blocks_kept));
      for (int32_t block : q.new_blocks) {
        CHECK(block >= 0 && block < cache_.num_blocks(), "step plan ", plan.step, ": request ",
              q.request_id, " names block ", block, " of ", cache_.num_blocks());
      }
      table.insert(table.end(), q.new_blocks.begin(), q.new_blocks.end());
      SequenceInput in;
      in.cache = &cache_;
      in.blocks = table;
      in.state_block = q.state_block;
      in.num_computed = q.num_computed;
      in.tokens = q.tokens;
      in.slots = q.slots;
      in.all_logits = q.all_logits;
      in.prefill = q.prefill;
      batch.push_back(in);
      rows.push_back(q.source_row);
      placeholder = placeholder || q.source_row >= 0;
    }
    if (part.verify) {
      CHECK(!placeholder && decode_.accepts_verify(batch), "step plan ", plan.step,
            ": rank 0 ran a verification that this rank's decode step refuses");
      decode_.verify(batch);
    } else if (part.decode_step) {
      CHECK(decode_.accepts(batch), "step plan ", plan.step,
            ": rank 0 ran a batch on the decode step that this rank's decode step refuses");
      if (placeholder) {
        decode_.run(batch, {tokens_.as<int32_t>(), rows});
      } else {
        decode_.run(batch);
      }
    } else {
      CHECK(!placeholder, "step plan ", plan.step, ": a placeholder outside the decode step");
      model_.forward_logits(batch, ws_);
    }
  }
  for (const PlanSnapshot& s : plan.snapshots) cache_.copy_block(s.snapshot_block, s.state_block);
  if (plan.num_sampled > 0) {
    CHECK(plan.num_sampled <= sample_rows_, "step plan ", plan.step, ": ", plan.num_sampled,
          " sampled ids, at most ", sample_rows_);
    tp.comm->broadcast(tokens_.data(), static_cast<size_t>(plan.num_sampled) * 4, 0);
  }
}

}  // namespace hyserve
