// The model runner's input batch (engine/model_runner.h): from a scheduler output to the
// forwards' inputs, the step's sampling rows, the verification's sequences, each forward's
// batch and where it runs, and the plan the tensor-parallel workers replay.
#include <algorithm>

#include "engine/model_runner.h"
#include "engine/speculative.h"
#include "util/error.h"

namespace hyserve {

ModelRunner::InputBatch ModelRunner::build_input_batch(const SchedulerOutput& scheduled,
                                                       const Scheduler& scheduler) {
  // The forward's inputs, one per scheduled request, at the scheduler's slots. An input
  // that is a placeholder (the last step samples it) names its row of tokens_.
  InputBatch batch;
  std::vector<SequenceInput>& inputs = batch.inputs;
  batch.source_rows.assign(scheduled.requests.size(), -1);
  for (const ScheduledRequest& s : scheduled.requests) {
    const Request* r = scheduler.find_request(s.request_id);
    CHECK(r != nullptr, "model runner: scheduled request ", s.request_id, " is unknown");
    batch.requests.push_back(r);
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
    in.lora_slot = s.lora_slot;
    for (size_t j = 0; j < s.token_ids.size(); ++j) {
      if (s.token_ids[j] != kPlaceholderToken) continue;
      CHECK(j + 1 == s.token_ids.size() && r->num_output_placeholders >= 1,
            "model runner: request ", s.request_id, " has a placeholder input at ", j, " of ",
            s.token_ids.size());
      const auto it = last_rows_.find(s.request_id);
      CHECK(it != last_rows_.end(), "model runner: request ", s.request_id,
            " has a placeholder that the last step does not sample");
      batch.source_rows[inputs.size()] = it->second;
    }
    inputs.push_back(in);
  }
  batch.resolved.resize(inputs.size());
  // Batch-invariant mode runs prefill chunks and decode tokens as two forwards; so does a
  // step with drafts, whose decode tokens (with or without drafts) are one verification.
  batch.part_of.assign(inputs.size(), 0);
  batch.verifies = std::any_of(scheduled.requests.begin(), scheduled.requests.end(),
                               [](const ScheduledRequest& s) { return s.num_draft_tokens > 0; });
  batch.verified.assign(inputs.size(), false);
  if (batch.verifies) {
    batch.num_parts = 2;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ScheduledRequest& s = scheduled.requests[i];
      batch.verified[i] = s.samples && !inputs[i].prefill && !inputs[i].all_logits;
      batch.part_of[i] = batch.verified[i] ? 1 : 0;
      CHECK(batch.verified[i] || s.num_draft_tokens == 0, "model runner: request ", s.request_id,
            " has drafts after a prefill chunk");
      CHECK(s.num_draft_tokens == 0 || speculates(batch.requests[i]->sampling_params),
            "model runner: request ", s.request_id,
            " has drafts but samples with penalties or a "
            "constraint");
    }
  } else if (!inputs.empty() && model_.mixes_prefill_and_decode(inputs)) {
    batch.num_parts = 2;
    for (size_t i = 0; i < inputs.size(); ++i) batch.part_of[i] = inputs[i].prefill ? 0 : 1;
  }
  return batch;
}

std::vector<ModelRunner::Sampling> ModelRunner::gather_sampling_rows(
    const SchedulerOutput& scheduled, InputBatch& batch) {
  // The sampling rows, ordered by logprobs asked (descending, stable): one per request that
  // samples, and in a verification one per verified position (the token after each draft and
  // after the last), drawn with the request's draw indices of those outputs.
  std::vector<Sampling> rows;
  batch.logit_row.assign(batch.inputs.size(), 0);
  int64_t next[2] = {0, 0};
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const SequenceInput& in = batch.inputs[i];
    const int p = batch.part_of[i];
    batch.logit_row[i] = next[p];
    const int64_t n = in.all_logits || batch.verified[i] ? std::ssize(in.tokens) : 1;
    next[p] += n;
    const ScheduledRequest& s = scheduled.requests[i];
    if (!s.samples) continue;
    const auto it = requests_.find(s.request_id);
    CHECK(it != requests_.end(), "model runner: request ", s.request_id, " was never added");
    const Request* r = batch.requests[i];
    const auto& lp = r->sampling_params.logprobs;
    const int64_t draw = r->num_outputs_with_placeholders() - 1;
    const int64_t positions = batch.verified[i] ? n : 1;
    for (int64_t j = 0; j < positions; ++j) {
      rows.push_back(
          {&s, r, &it->second, p, batch.logit_row[i] + n - positions + j, lp ? *lp : -1, draw + j});
    }
  }
  CHECK(std::ssize(rows) <= sample_rows_, "model runner: ", rows.size(),
        " sampling rows in one step, at most ", sample_rows_);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Sampling& a, const Sampling& b) { return a.logprobs > b.logprobs; });
  return rows;
}

std::vector<ModelRunner::Verified> ModelRunner::verified_sequences(const SchedulerOutput& scheduled,
                                                                   const InputBatch& batch,
                                                                   std::span<const Sampling> rows) {
  // One pass over the rows, whose stable sort kept each request's in draw order.
  std::vector<std::vector<size_t>> rows_of(batch.inputs.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    rows_of[static_cast<size_t>(rows[k].scheduled - scheduled.requests.data())].push_back(k);
  }
  std::vector<Verified> verified;
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    if (!batch.verified[i]) continue;
    const ScheduledRequest& s = scheduled.requests[i];
    Verified v;
    v.request_id = s.request_id;
    v.drafts.assign(s.token_ids.begin() + 1, s.token_ids.end());
    v.seed = requests_.at(s.request_id).seed;
    v.draw = batch.requests[i]->num_outputs_with_placeholders() - 1;
    v.rows = std::move(rows_of[i]);
    verified.push_back(std::move(v));
  }
  return verified;
}

std::vector<ModelRunner::PartRun> ModelRunner::plan_forwards(const SchedulerOutput& scheduled,
                                                             InputBatch& batch) {
  // Each forward's batch, and where it runs; placeholders of a forward that is not the
  // decode step's are resolved on the host (waiting for the step before).
  std::vector<PartRun> runs;
  for (int part = 0; part < batch.num_parts; ++part) {
    PartRun run;
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      if (batch.part_of[i] != part) continue;
      run.batch.push_back(batch.inputs[i]);
      run.index.push_back(i);
      run.rows_of_batch.push_back(batch.source_rows[i]);
      run.placeholder = run.placeholder || batch.source_rows[i] >= 0;
    }
    if (run.batch.empty()) continue;
    if (batch.verifies && part == 1) {
      run.verify = true;
      CHECK(!run.placeholder && decode_.accepts_verify(run.batch), "model runner: the step's ",
            run.batch.size(), " decode sequences do not fit one verification");
      runs.push_back(std::move(run));
      continue;
    }
    // A batch with adapters decodes there too: the step carries each row's LoRA slot.
    run.decode = decode_.accepts(run.batch);
    if (!run.decode) {
      for (size_t b = 0; b < run.batch.size(); ++b) {
        if (run.rows_of_batch[b] < 0) continue;
        const size_t i = run.index[b];
        std::vector<int32_t>& resolved = batch.resolved[i];
        resolved.assign(run.batch[b].tokens.begin(), run.batch[b].tokens.end());
        resolved.back() = pending_token(scheduled.requests[i].request_id);
        run.batch[b].tokens = resolved;
        run.rows_of_batch[b] = -1;
      }
      run.placeholder = false;
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

StepPlan ModelRunner::make_plan(const SchedulerOutput& scheduled, std::span<const PartRun> parts,
                                int32_t num_sampled) {
  StepPlan plan;
  plan.step = ++num_plans_;
  plan.commits = std::move(plan_commits_);
  plan_commits_.clear();
  plan.dropped = std::move(plan_dropped_early_);
  plan_dropped_early_.clear();
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
      q.lora_slot = in.lora_slot;
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

}  // namespace hyserve
