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

void SpecDecodeCounts::add(const SpecDecodeCounts& o) {
  num_drafts += o.num_drafts;
  num_draft_tokens += o.num_draft_tokens;
  num_accepted_tokens += o.num_accepted_tokens;
  if (accepted_per_pos.size() < o.accepted_per_pos.size()) {
    accepted_per_pos.resize(o.accepted_per_pos.size(), 0);
  }
  for (size_t i = 0; i < o.accepted_per_pos.size(); ++i) {
    accepted_per_pos[i] += o.accepted_per_pos[i];
  }
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
  const TensorParallel& tp = model_.options().parallel.tp;
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
  // The verification's sequences in its batch order, with their rows: one pass over the rows,
  // whose stable sort kept each request's in draw order.
  std::vector<std::vector<size_t>> rows_of(inputs.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    rows_of[static_cast<size_t>(rows[k].scheduled - scheduled.requests.data())].push_back(k);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!verified[i]) continue;
    const ScheduledRequest& s = scheduled.requests[i];
    Verified v;
    v.request_id = s.request_id;
    v.drafts.assign(s.token_ids.begin() + 1, s.token_ids.end());
    v.seed = requests_.at(s.request_id).seed;
    v.draw = requests[i]->num_outputs_with_placeholders() - 1;
    v.rows = std::move(rows_of[i]);
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
  const TensorParallel& tp = model_.options().parallel.tp;
  if (tp.size <= 1 || count == 0) return;
  tp.comm->broadcast(tokens_.data(), static_cast<size_t>(count) * 4, 0);
}

void ModelRunner::run_plan(const StepPlan& plan) {
  const TensorParallel& tp = model_.options().parallel.tp;
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
