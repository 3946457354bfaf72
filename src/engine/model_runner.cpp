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
  return 2 * rows * vocab * 4                                          // raw, work
         + sampling::sample_workspace_bytes(rows, vocab)               // the sampler's
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
  tokens_ = DeviceAllocation(b, srows * 4);  // a worker's: the sampled ids rank 0 broadcasts
  if (!config_.samples) return;
  raw_ = DeviceAllocation(b, srows * vocab * 4);
  work_ = DeviceAllocation(b, srows * vocab * 4);
  sample_workspace_ = DeviceAllocation(
      b, static_cast<size_t>(sampling::sample_workspace_bytes(sample_rows_, vocab_)));
  options_ = DeviceAllocation(b, srows * sizeof(SamplingOptions));
  rows_ = DeviceAllocation(b, srows * 4);
  repetition_ = DeviceAllocation(b, (seqs + 1) * 4);
  presence_ = DeviceAllocation(b, (seqs + 1) * 4);
  frequency_ = DeviceAllocation(b, (seqs + 1) * 4);
  counts_ = DeviceAllocation(b, (seqs + 1) * vocab * 4);
  prompt_mask_ = DeviceAllocation(b, (seqs + 1) * words * 4);
  masks_ = DeviceAllocation(b, srows * words * 4);
  max_logprob_rows_ = std::max(sample_rows_, config_.max_num_batched_tokens);
  const auto lp_rows = static_cast<size_t>(max_logprob_rows_);
  targets_ = DeviceAllocation(b, lp_rows * 4);
  zero_rows_ = DeviceAllocation(b, lp_rows * 4);
  mask_rows_ = DeviceAllocation(b, srows * 4);
  logprob_ = DeviceAllocation(b, lp_rows * 4);
  rank_ = DeviceAllocation(b, lp_rows * 8);
  top_ids_ = DeviceAllocation(b, lp_rows * kMaxTopLogprobs * 4);
  top_logprobs_ = DeviceAllocation(b, lp_rows * kMaxTopLogprobs * 4);
  // Every row starts neutral (allocate() zeroes): repetition 1 in all of them.
  const std::vector<float> ones(seqs + 1, 1.0f);
  backend_.upload(repetition_.data(), ones.data(), ones.size() * 4);
  for (int64_t row = config_.max_num_seqs - 1; row >= 0; --row) {
    free_penalty_rows_.push_back(static_cast<int32_t>(row));
  }
  for (HostSlot& slot : slots_) {
    constexpr auto kHost = DeviceAllocation::Memory::kHost;
    slot.tokens = DeviceAllocation(b, srows * 4, kHost);
    slot.logprob = DeviceAllocation(b, srows * 4, kHost);
    slot.top_ids = DeviceAllocation(b, srows * kMaxTopLogprobs * 4, kHost);
    slot.top_logprobs = DeviceAllocation(b, srows * kMaxTopLogprobs * 4, kHost);
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
  // A finished request of the same id whose tables the workers still hold: dropped by the
  // next plan, before the new request's.
  if (plan_tables_.erase(request_id) > 0) plan_dropped_early_.push_back(request_id);
}

void ModelRunner::send_control(StepPlan plan) {
  CHECK(plan_sink_ != nullptr, "model runner: a control plan without workers");
  plan.step = ++num_plans_;
  plan_sink_->send(plan);
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

// A launch, phase by phase: the input batch from the scheduler's output, its sampling rows,
// the forwards (the plan to the workers first), then sampling into the step's pinned slot.
void ModelRunner::launch(const SchedulerOutput& scheduled, const Scheduler& scheduler) {
  begin_launch(scheduled);
  Pending pending;
  pending.slot = static_cast<int>(num_launches_++ % 2);
  InputBatch batch = build_input_batch(scheduled, scheduler);
  const std::vector<Sampling> rows = gather_sampling_rows(scheduled, batch);
  pending.verified = verified_sequences(scheduled, batch, rows);
  const std::vector<PartRun> runs = plan_forwards(scheduled, batch);
  if (plan_sink_ != nullptr) {
    plan_sink_->send(make_plan(scheduled, runs, static_cast<int32_t>(rows.size())));
  }
  prepare_state_rows(scheduled);
  for (const PartRun& run : runs) run_forward(scheduled, batch, run, rows, pending.result);
  // KDA snapshots at block boundaries, for later prefix hits (stream-ordered after the
  // forward that computed the state).
  for (const SnapshotCopy& copy : scheduled.snapshot_copies) {
    cache_.copy_block(copy.snapshot_block, copy.state_block);
  }
  if (!rows.empty()) sample_rows(rows, pending);
  finish_launch(rows, batch.verifies, std::move(pending));
}

void ModelRunner::begin_launch(const SchedulerOutput& scheduled) {
  CHECK(pending_.size() < 2, "model runner: a third step launched before the first is collected");
  const TensorParallel& tp = model_.options().parallel.tp;
  CHECK(config_.samples && (tp.size == 1 || (tp.rank == 0 && plan_sink_ != nullptr)),
        "model runner: steps are launched on rank 0 of a tensor-parallel group, with a plan sink ",
        "(this is rank ", tp.rank, " of ", tp.size, ")");
  for (const std::string& id : scheduled.finished_request_ids) remove_request(id);
  for (const std::string& id : scheduled.preempted_request_ids) {
    if (const auto it = requests_.find(id); it != requests_.end()) release_penalty_row(it->second);
  }
}

void ModelRunner::run_forward(const SchedulerOutput& scheduled, const InputBatch& batch,
                              const PartRun& run, std::span<const Sampling> rows,
                              RunnerStepResult& result) {
  const int part = batch.part_of[run.index.front()];
  const float* logits = run.verify    ? decode_.verify(run.batch)
                        : !run.decode ? model_.forward_logits(run.batch, ws_)
                        : run.placeholder
                            ? decode_.run(run.batch, {tokens_.as<int32_t>(), run.rows_of_batch})
                            : decode_.run(run.batch);
  // Prompt logprobs of the rows that asked, from this forward's logits.
  for (size_t i : run.index) {
    if (!batch.inputs[i].all_logits) continue;
    const ScheduledRequest& s = scheduled.requests[i];
    const Request& r = *batch.requests[i];
    std::vector<int32_t> targets;
    for (int64_t pos = s.start_position;
         pos < s.start_position + s.num_new_tokens() && pos + 1 < r.num_prompt_tokens(); ++pos) {
      targets.push_back(r.prompt_token_ids[static_cast<size_t>(pos + 1)]);
    }
    const std::vector<OutputToken> entries =
        prompt_logprobs(logits + batch.logit_row[i] * vocab_, targets,
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

void ModelRunner::sample_rows(std::span<const Sampling> rows, Pending& pending) {
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
  pending.result.bytes_downloaded += std::ssize(rows) * 4;
  logprobs_of_samples(rows, slot, pending.result.bytes_downloaded);
}

void ModelRunner::finish_launch(std::span<const Sampling> rows, bool verifies, Pending pending) {
  pending.fence = backend_.fence();
  last_rows_.clear();
  if (rows.empty()) {
    pending_.push_back(std::move(pending));
    return;
  }
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
      in.lora_slot = q.lora_slot;
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
