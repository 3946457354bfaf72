// The model runner's logits processing and sampling (engine/model_runner.h): the persistent
// penalty rows, the processors over a step's sampling rows (penalties, logit_bias, min_tokens
// bans, guided-decoding masks), the draw, and the logprobs of sampled and prompt tokens.
#include <algorithm>
#include <bit>
#include <map>
#include <set>

#include "engine/model_runner.h"
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
  const auto at = [&](const DeviceAllocation& buf) { return buf.as<float>() + row; };
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

  // 2. logit_bias (summed per id), then the min_tokens and bad_words bans.
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
    if (!sp.bad_words_token_ids.empty()) {
      // vLLM's rule: a word's last id is banned where the outputs end with the rest of it.
      const std::vector<int32_t> past = outputs_before_draw(r, true);
      for (const std::vector<int32_t>& word : sp.bad_words_token_ids) {
        const size_t prefix = word.size() - 1;
        if (prefix > past.size() ||
            !std::equal(word.begin(), word.end() - 1, past.end() - static_cast<ptrdiff_t>(prefix)))
          continue;
        ban_row.push_back(static_cast<int32_t>(k));
        ban_id.push_back(word.back());
      }
    }
  }
  const auto total = static_cast<int64_t>(add_row.size() + ban_row.size());
  if (total > 0) {
    if (total > entries_capacity_) {
      entries_capacity_ = std::max<int64_t>(total, 2 * entries_capacity_);
      entries_ = DeviceAllocation(&backend_, static_cast<size_t>(entries_capacity_) * 12);
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

  // 3. Guided decoding and allowed_token_ids: the allowed ids as a bitmask per masked row
  // (the constraint's, ANDed with the request's allow-list when it has both).
  const int64_t words = token_mask_words(vocab_);
  std::vector<int32_t> masked_rows;
  std::vector<uint32_t> masks;
  std::vector<uint8_t> allowed;
  for (size_t k = 0; k < rows.size(); ++k) {
    ConstraintState* c = rows[k].state->constraint.get();
    const Request& r = *rows[k].request;
    const std::vector<int32_t>& allow_list = r.sampling_params.allowed_token_ids;
    if (c == nullptr && allow_list.empty()) continue;
    if (c != nullptr) {
      const std::vector<int32_t> stops = terminator_ids(r.sampling_params, config_.eos_token_ids);
      c->sync(outputs_before_draw(r, true), stops);
      c->compute_mask(stops, allowed);
    } else {
      allowed.assign(static_cast<size_t>(vocab_), 1);
    }
    if (!allow_list.empty()) {
      std::vector<uint8_t> listed(allowed.size(), 0);
      for (const int32_t id : allow_list) {
        if (id >= 0 && static_cast<size_t>(id) < listed.size()) listed[id] = 1;
      }
      for (size_t id = 0; id < allowed.size(); ++id) allowed[id] &= listed[id];
    }
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
  p.workspace = sample_workspace_.data();
  p.workspace_bytes = sample_workspace_.size();
  p.host_options = options.data();
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

}  // namespace hyserve
