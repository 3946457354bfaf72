#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/error.h"

namespace hyserve {

int64_t step_cost(int64_t start_position, int64_t num_tokens, int64_t linear_cost_tokens) {
  return num_tokens * (start_position + linear_cost_tokens) + num_tokens * num_tokens / 2;
}

int64_t default_max_step_prefill_cost(const SchedulerConfig& config) {
  return step_cost(0, config.max_num_batched_tokens, config.prefill_linear_cost_tokens);
}

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config)
    : config_(config),
      kv_(kv_config),
      lora_slots_(config.max_loras),
      waiting_(MoreUrgent{config.policy}),
      running_(MoreUrgent{config.policy}) {
  CHECK(config.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got ",
        config.max_num_batched_tokens);
  CHECK(config.max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", config.max_num_seqs);
  CHECK(config.max_model_len >= 2, "max_model_len must be >= 2, got ", config.max_model_len);
  CHECK(config.enable_chunked_prefill || config.max_num_batched_tokens >= config.max_model_len,
        "without chunked prefill, max_num_batched_tokens (", config.max_num_batched_tokens,
        ") must be >= max_model_len (", config.max_model_len, ")");
  CHECK(config.vocab_size >= 1, "vocab_size must be >= 1, got ", config.vocab_size);
  CHECK(!config.long_prefill_token_threshold || *config.long_prefill_token_threshold >= 1,
        "long_prefill_token_threshold must be >= 1, got ",
        config.long_prefill_token_threshold.value_or(0));
  CHECK(config.max_step_prefill_cost >= 0, "max_step_prefill_cost must be >= 0 (0: off), got ",
        config.max_step_prefill_cost);
  CHECK(config.prefill_linear_cost_tokens >= 0, "prefill_linear_cost_tokens must be >= 0, got ",
        config.prefill_linear_cost_tokens);
}

bool Scheduler::MoreUrgent::operator()(const Entry* a, const Entry* b) const {
  if (policy == SchedulingPolicy::kPriority) {
    if (a->request.priority != b->request.priority) {
      return a->request.priority < b->request.priority;
    }
    if (a->request.arrival_time != b->request.arrival_time) {
      return a->request.arrival_time < b->request.arrival_time;
    }
  }
  return a->seq < b->seq;
}

int64_t Scheduler::max_num_tokens(const Request& request) const {
  const auto& max_tokens = request.sampling_params.max_tokens;
  return max_tokens ? std::min(request.num_prompt_tokens() + *max_tokens, config_.max_model_len)
                    : config_.max_model_len;
}

void Scheduler::check_fits(const Request& request) const {
  // The last token is sampled, never computed: the cache holds max_num_tokens - 1 positions.
  const int64_t num_blocks_needed = kv_.blocks_for_request(max_num_tokens(request) - 1);
  if (num_blocks_needed <= kv_.pool().num_blocks()) return;
  const auto& max_tokens = request.sampling_params.max_tokens;
  throw InvalidRequest(
      "max_tokens",
      str_cat("The prompt (", request.num_prompt_tokens(), " tokens) + ",
              max_tokens ? str_cat("max_tokens (", *max_tokens, ")")
                         : str_cat("output up to max_model_len (", config_.max_model_len, ")"),
              " needs ", num_blocks_needed, " KV blocks of ", kv_.config().tokens_per_block(),
              " tokens; the whole cache has ", kv_.pool().num_blocks(), "."));
}

void Scheduler::add_request(Request request) {
  CHECK(!requests_.contains(request.id), "request id '", request.id, "' is already in use");
  validate_request(request.prompt_token_ids, request.sampling_params,
                   {config_.vocab_size, config_.max_model_len});
  check_fits(request);
  if (request.lora != nullptr && config_.max_loras == 0) {
    throw InvalidRequest("model", "LoRA adapters are not enabled (--enable-lora)");
  }

  // A finished request of the same id not reported yet: reported as finished, the new one
  // would be dropped with it (the runner drops the old one's state when it is added).
  std::erase(finished_since_schedule_, request.id);
  request.status = RequestStatus::kWaiting;
  request.output_token_ids.clear();
  request.num_computed_tokens = 0;
  request.num_cached_prompt_tokens = 0;
  request.num_preemptions = 0;
  request.num_output_placeholders = 0;
  request.stop_token_id.reset();
  request.lora_slot = -1;
  const std::string id = request.id;
  Entry& entry = requests_.emplace(id, Entry{std::move(request), next_seq_++}).first->second;
  waiting_.insert(&entry);
}

void Scheduler::finish(Entry* entry, RequestStatus status) {
  running_.erase(entry);
  waiting_.erase(entry);
  kv_.free(entry->request);
  release_lora(entry->request);
  entry->request.status = status;
  finished_since_schedule_.push_back(entry->request.id);
  requests_.erase(entry->request.id);
}

bool Scheduler::abort_request(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  finish(&it->second, RequestStatus::kFinishedAborted);
  return true;
}

const Request* Scheduler::find_request(const std::string& request_id) const {
  const auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : &it->second.request;
}

void Scheduler::preempt(Entry* victim, SchedulerOutput& out) {
  running_.erase(victim);
  kv_.free(victim->request);
  release_lora(victim->request);
  victim->request.status = RequestStatus::kPreempted;
  victim->request.num_computed_tokens = 0;
  ++victim->request.num_preemptions;
  waiting_.insert(victim);
  out.preempted_request_ids.push_back(victim->request.id);
}

void Scheduler::release_lora(Request& request) {
  if (request.lora_slot < 0) return;
  lora_slots_.release(request.lora_slot);
  request.lora_slot = -1;
}

ScheduledRequest Scheduler::describe_step(const Request& request, int64_t num_new_tokens,
                                          int64_t num_drafts) const {
  ScheduledRequest s;
  s.request_id = request.id;
  s.start_position = request.num_computed_tokens;
  const int64_t end = s.start_position + num_new_tokens;
  const int64_t known_end = end - num_drafts;
  s.token_ids = request.scheduled_tokens(s.start_position, known_end);
  s.token_ids.insert(s.token_ids.end(), request.spec_token_ids.begin(),
                     request.spec_token_ids.begin() + num_drafts);
  const BlockTable& table = *kv_.block_table(request.id);
  s.slot_mapping.reserve(num_new_tokens);
  for (int64_t p = s.start_position; p < end; ++p) s.slot_mapping.push_back(table.slot_index(p));
  s.block_ids.assign(table.blocks().begin(), table.blocks().end());
  s.state_block = table.state_block();
  s.samples = known_end == request.num_scheduled_tokens();
  s.num_draft_tokens = num_drafts;
  s.lora_slot = request.lora_slot;
  return s;
}

int64_t Scheduler::limit_to_cost(int64_t begin, int64_t num_tokens, int64_t cost_left,
                                 bool first_prefill) const {
  const int64_t linear = config_.prefill_linear_cost_tokens;
  if (num_tokens <= 0 || step_cost(begin, num_tokens, linear) <= cost_left) return num_tokens;
  // The largest n with n^2 / 2 + n x (begin + linear) <= cost_left, from the root of the
  // quadratic, then corrected for rounding.
  const double b = static_cast<double>(begin + linear);
  const double c = static_cast<double>(std::max<int64_t>(cost_left, 0));
  int64_t n =
      std::clamp<int64_t>(static_cast<int64_t>(std::sqrt(b * b + 2.0 * c) - b), 0, num_tokens - 1);
  while (n > 0 && step_cost(begin, n, linear) > cost_left) --n;
  while (n + 1 < num_tokens && step_cost(begin, n + 1, linear) <= cost_left) ++n;
  const int64_t align = std::max<int64_t>(config_.prefill_chunk_alignment, 1);
  const int64_t least = std::min(num_tokens, (begin / align + 1) * align - begin);
  if (n >= least) return n;
  return first_prefill ? least : 0;
}

int64_t Scheduler::num_drafts(const Request& request, int64_t budget) {
  // Only where drafts_follow; the accepted drafts and the token after them end at the
  // request's length at most.
  if (request.spec_token_ids.empty() || !drafts_follow(request)) return 0;
  const int64_t room = max_num_tokens(request) - request.num_tokens() - 1;
  const int64_t n =
      std::max<int64_t>(0, std::min({std::ssize(request.spec_token_ids), budget, room}));
  return kv_.drafts_before_snapshot(request, n);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.finished_request_ids = std::move(finished_since_schedule_);
  finished_since_schedule_.clear();
  kv_.begin_step();
  int64_t budget = config_.max_num_batched_tokens;
  struct Step {
    Entry* entry;
    int64_t num_new_tokens;  // drafts included
    int64_t num_drafts;
  };
  std::vector<Step> scheduled;

  // A running request whose step in flight samples its last allowed token is done
  // (asynchronous scheduling: its result is not applied yet).
  const auto done = [&](const Request& r) {
    return r.num_output_placeholders > 0 && r.num_scheduled_tokens() >= max_num_tokens(r);
  };
  const auto is_decode = [](const Request& r) {
    return r.num_scheduled_tokens() - r.num_computed_tokens == 1;
  };
  // The prefill cost cap: the running decodes' cost set aside, what prefill chunks have left.
  const int64_t linear = config_.prefill_linear_cost_tokens;
  const bool cost_capped = config_.enable_chunked_prefill && config_.max_step_prefill_cost > 0;
  int64_t cost_left = config_.max_step_prefill_cost;
  bool has_prefill = false;  // a prefill chunk is in the step
  if (cost_capped) {
    for (const Entry* entry : running_) {
      const Request& r = entry->request;
      if (!done(r) && is_decode(r)) cost_left -= step_cost(r.num_computed_tokens, 1, linear);
    }
  }
  // A scheduled step's cost; a decode's own token was set aside, its drafts were not.
  const auto charge = [&](int64_t begin, int64_t n, bool decode) {
    if (!cost_capped) return;
    cost_left -= step_cost(begin, n, linear) - (decode ? step_cost(begin, 1, linear) : 0);
    has_prefill = has_prefill || !decode;
  };

  // How many tokens from `begin` this step may compute for the request.
  const auto step_tokens = [&](Request& r, int64_t begin) {
    int64_t n = std::min(r.num_scheduled_tokens() - begin, budget);
    if (!config_.enable_chunked_prefill) return n;
    if (config_.long_prefill_token_threshold) {
      n = std::min(n, *config_.long_prefill_token_threshold);
    }
    // limit_to_snapshot_boundary counts from num_computed_tokens.
    const int64_t computed = std::exchange(r.num_computed_tokens, begin);
    const bool decode = is_decode(r) && r.status == RequestStatus::kRunning;
    n = kv_.limit_to_snapshot_boundary(r, n);
    r.num_computed_tokens = computed;
    if (cost_capped && !decode) n = limit_to_cost(begin, n, cost_left, !has_prefill);
    // An aligned end, or no tokens this step (a later step has the budget for one) unless
    // nothing else runs in this step, where waiting would not help.
    const int64_t align = config_.prefill_chunk_alignment;
    if (align > 0 && begin + n < r.num_scheduled_tokens()) {
      const int64_t aligned_end = (begin + n) / align * align;
      if (aligned_end > begin) {
        n = aligned_end - begin;
      } else if (budget < config_.max_num_batched_tokens) {
        n = 0;
      }
    }
    return n;
  };

  // Preemption takes the least urgent running request (the last), never one before `it`.
  for (auto it = running_.begin(); it != running_.end() && budget > 0; ++it) {
    Entry* entry = *it;
    Request& r = entry->request;
    if (done(r)) continue;
    const int64_t n = step_tokens(r, r.num_computed_tokens);
    if (n == 0) continue;
    // A decode step verifies the request's drafts too when their slots are free (they are
    // dropped before anyone is preempted for them).
    int64_t drafts = num_drafts(r, budget - n);
    bool fits = kv_.allocate_slots(r, n + drafts, 0);
    if (!fits && drafts > 0) {
      drafts = 0;
      fits = kv_.allocate_slots(r, n, 0);
    }
    while (!fits && *running_.rbegin() != entry) {
      preempt(*running_.rbegin(), out);
      fits = kv_.allocate_slots(r, n, 0);
    }
    if (!fits) {
      preempt(entry, out);
      break;
    }
    scheduled.push_back({entry, n + drafts, drafts});
    budget -= n + drafts;
    charge(r.num_computed_tokens, n + drafts, is_decode(r));
  }

  for (auto next = waiting_.begin();
       out.preempted_request_ids.empty() && next != waiting_.end() && budget > 0 &&
       static_cast<int64_t>(running_.size()) < config_.max_num_seqs;) {
    const auto at = next++;
    Entry* entry = *at;
    Request& r = entry->request;
    // An adapter without a slot now: skipped, the next waiting request may go.
    if (r.lora != nullptr && !lora_slots_.can_acquire(r.lora.get())) continue;
    // A request preempted while a step of it was in flight waits for that step's token.
    if (r.num_output_placeholders > 0) break;
    int64_t num_cached = kv_.get_computed_blocks(r);
    if (!config_.enable_chunked_prefill && r.num_tokens() - num_cached > budget) break;
    int64_t n = step_tokens(r, num_cached);
    if (n == 0) break;
    bool fits = kv_.allocate_slots(r, n, num_cached);
    if (!fits && num_cached > 0) {
      // A hit also holds its snapshot for the step; without the hit that block is not needed.
      num_cached = 0;
      n = step_tokens(r, 0);
      fits = n > 0 && kv_.allocate_slots(r, n, 0);
    }
    if (!fits) break;
    waiting_.erase(at);
    if (r.lora != nullptr) r.lora_slot = lora_slots_.acquire(r.lora);
    if (r.status == RequestStatus::kWaiting) r.num_cached_prompt_tokens = num_cached;
    r.status = RequestStatus::kRunning;
    r.num_computed_tokens = num_cached;
    running_.insert(entry);
    scheduled.push_back({entry, n, 0});
    budget -= n;
    charge(num_cached, n, false);
  }

  // The step is decided: each request's inputs, then its computed tokens advance now (the
  // next schedule() may come before this step's results) and a sampling step adds a
  // placeholder for its token.
  // Drafts are registered in the prefix cache only once accepted (a later step's call), and a
  // step with drafts takes no KDA snapshot: its end state is known only after verification.
  for (const auto& [entry, n, drafts] : scheduled) {
    Request& r = entry->request;
    out.requests.push_back(describe_step(r, n, drafts));
    out.requests.back().restore_state_from = kv_.take_state_restore_block(r.id);
    out.num_scheduled_tokens += n;
    if (auto copy = kv_.cache_full_blocks(r, r.num_computed_tokens + n - drafts, drafts == 0)) {
      out.snapshot_copies.push_back(std::move(*copy));
    }
    r.num_computed_tokens += n;
    r.spec_token_ids.clear();
    if (out.requests.back().samples) ++r.num_output_placeholders;
  }
  out.lora_loads = lora_slots_.take_loads();
  return out;
}

std::optional<RequestStatus> Scheduler::check_stop(Request& request) const {
  const SamplingParams& sp = request.sampling_params;
  if (request.num_output_tokens() >= sp.min_tokens) {
    const int32_t last = request.output_token_ids.back();
    if (!sp.ignore_eos &&
        std::ranges::find(config_.eos_token_ids, last) != config_.eos_token_ids.end()) {
      return RequestStatus::kFinishedStopped;
    }
    if (std::ranges::find(sp.stop_token_ids, last) != sp.stop_token_ids.end()) {
      request.stop_token_id = last;
      return RequestStatus::kFinishedStopped;
    }
  }
  if (request.num_tokens() >= max_num_tokens(request)) return RequestStatus::kFinishedLength;
  return std::nullopt;
}

std::vector<RequestUpdate> Scheduler::update_from_output(const SchedulerOutput& scheduled,
                                                         const ModelRunnerOutput& output) {
  kv_.end_step();
  std::vector<RequestUpdate> updates;
  for (const ScheduledRequest& s : scheduled.requests) {
    const auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;
    Entry* entry = &it->second;
    Request& r = entry->request;
    // A request preempted after this step was scheduled (by the next schedule()) keeps the
    // step's token: its outputs survive preemption.
    CHECK(r.status == RequestStatus::kPreempted ||
              (r.status == RequestStatus::kRunning &&
               r.num_computed_tokens >= s.start_position + s.num_new_tokens()),
          "update_from_output: request ", r.id, " was not scheduled by a pending schedule()");
    const auto sampled = output.sampled_token_ids.find(r.id);
    const bool has_tokens = sampled != output.sampled_token_ids.end() && !sampled->second.empty();
    CHECK(has_tokens == s.samples, "update_from_output: request ", r.id,
          s.samples ? " reached its last token but got no sampled token"
                    : " got sampled tokens for a prefill chunk that is not the last");
    if (s.samples) {
      CHECK(r.num_output_placeholders >= 1, "update_from_output: request ", r.id,
            " has no placeholder for its sampled token");
      --r.num_output_placeholders;
    }
    if (s.num_draft_tokens > 0 && r.status == RequestStatus::kRunning) {
      // The rejected drafts' positions are computed no more (their slots are written again
      // by the tokens that take those positions).
      const int64_t accepted = std::ssize(sampled->second) - 1;
      CHECK(accepted >= 0 && accepted <= s.num_draft_tokens, "update_from_output: request ", r.id,
            " got ", sampled->second.size(), " tokens for ", s.num_draft_tokens, " drafts");
      r.num_computed_tokens -= s.num_draft_tokens - accepted;
    } else {
      CHECK(!has_tokens || sampled->second.size() == 1, "update_from_output: request ", r.id,
            " got ", sampled->second.size(), " tokens without drafts");
    }
    RequestUpdate update{r.id, {}, RequestStatus::kRunning, std::nullopt};
    std::optional<RequestStatus> stop;
    if (has_tokens) {
      for (int32_t token : sampled->second) {
        CHECK(token >= 0 && token < config_.vocab_size, "update_from_output: request ", r.id,
              ": sampled token id ", token, " out of range");
        r.output_token_ids.push_back(token);
        update.new_token_ids.push_back(token);
        if ((stop = check_stop(r))) break;
      }
    }
    kv_.resolve_placeholders(r);
    if (const auto f = output.finished.find(r.id); !stop && f != output.finished.end()) {
      CHECK(is_finished(f->second), "update_from_output: request ", r.id, " finished with status ",
            to_string(f->second));
      stop = f->second;
    }
    if (stop) {
      update.status = *stop;
      update.stop_token_id = r.stop_token_id;
      finish(entry, *stop);
    }
    if (!update.new_token_ids.empty() || stop) updates.push_back(std::move(update));
  }
  return updates;
}

}  // namespace hyserve
