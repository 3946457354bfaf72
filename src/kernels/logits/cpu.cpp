// CPU logits processors and log-probabilities, written as params.h reads; rows run in
// parallel (each row is one thread's, so results do not depend on the thread count).
#include "kernels/logits/cpu.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_set>
#include <vector>

#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

constexpr float kBanned = -std::numeric_limits<float>::infinity();

void check_vocab(const char* op, int64_t vocab) {
  CHECK(vocab > 0 && vocab <= INT32_MAX, op, ": vocab ", vocab, " not in [1, 2^31)");
}

bool mask_bit(const uint32_t* mask_row, int64_t id) {
  return (mask_row[id / kTokenMaskWordBits] >> (id % kTokenMaskWordBits)) & 1u;
}

}  // namespace

void apply_penalties(const PenaltyParams& p) {
  CHECK(p.num_rows >= 0, "apply_penalties: num_rows ", p.num_rows);
  check_vocab("apply_penalties", p.vocab);
  if (p.num_rows == 0) return;
  CHECK(p.logits && p.rows && p.repetition && p.presence && p.frequency && p.output_counts &&
            p.prompt_mask,
        "apply_penalties: null pointer");
  const int64_t words = token_mask_words(p.vocab);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    CHECK(p.rows[i] >= 0, "apply_penalties: rows[", i, "] = ", p.rows[i]);
    CHECK(p.repetition[p.rows[i]] > 0.0f, "apply_penalties: repetition[", p.rows[i],
          "] = ", p.repetition[p.rows[i]], " (must be > 0)");
  }
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = p.rows[i];
      const float repetition = p.repetition[r];
      const float presence = p.presence[r];
      const float frequency = p.frequency[r];
      const int32_t* counts = p.output_counts + r * p.vocab;
      const uint32_t* prompt = p.prompt_mask + r * words;
      float* logits = p.logits + i * p.vocab;
      for (int64_t id = 0; id < p.vocab; ++id) {
        float& l = logits[id];
        const int32_t count = counts[id];
        if (repetition != 1.0f && (count > 0 || mask_bit(prompt, id))) {
          l = l > 0.0f ? l / repetition : l * repetition;
        }
        if ((presence != 0.0f || frequency != 0.0f) && count > 0) {
          l -= presence + frequency * static_cast<float>(count);
        }
      }
    }
  });
}

void count_tokens(const CountTokensParams& p) {
  CHECK(p.num_tokens >= 0, "count_tokens: num_tokens ", p.num_tokens);
  check_vocab("count_tokens", p.vocab);
  if (p.num_tokens == 0) return;
  CHECK(p.counts && p.rows && p.tokens, "count_tokens: null pointer");
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    CHECK(p.rows[i] >= 0, "count_tokens: rows[", i, "] = ", p.rows[i]);
  }
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int32_t token = p.tokens[i];
    if (token >= 0 && token < p.vocab) ++p.counts[p.rows[i] * p.vocab + token];
  }
}

void adjust_logits(const LogitAdjustParams& p) {
  CHECK(p.num_entries >= 0 && p.num_rows >= 0, "adjust_logits: num_entries ", p.num_entries,
        ", num_rows ", p.num_rows);
  check_vocab("adjust_logits", p.vocab);
  if (p.num_entries == 0) return;
  const bool add = p.mode == LogitAdjustMode::kAdd;
  CHECK(p.logits && p.row && p.id && (p.value || !add), "adjust_logits: null pointer");
  std::unordered_set<int64_t> seen;
  for (int64_t e = 0; e < p.num_entries; ++e) {
    CHECK(p.row[e] >= 0 && p.row[e] < p.num_rows, "adjust_logits: row[", e, "] = ", p.row[e],
          " not in [0, ", p.num_rows, ")");
    CHECK(p.id[e] >= 0 && p.id[e] < p.vocab, "adjust_logits: id[", e, "] = ", p.id[e],
          " not in [0, ", p.vocab, ")");
    const int64_t at = p.row[e] * p.vocab + p.id[e];
    CHECK(seen.insert(at).second, "adjust_logits: entry ", e, " repeats (row ", p.row[e], ", id ",
          p.id[e], ")");
  }
  for (int64_t e = 0; e < p.num_entries; ++e) {
    float& l = p.logits[p.row[e] * p.vocab + p.id[e]];
    l = add ? l + p.value[e] : kBanned;
  }
}

void apply_token_mask(const TokenMaskParams& p) {
  CHECK(p.num_masked >= 0 && p.num_rows >= 0, "apply_token_mask: num_masked ", p.num_masked,
        ", num_rows ", p.num_rows);
  check_vocab("apply_token_mask", p.vocab);
  if (p.num_masked == 0) return;
  CHECK(p.logits && p.rows && p.mask, "apply_token_mask: null pointer");
  std::vector<bool> masked(static_cast<size_t>(p.num_rows), false);
  for (int64_t k = 0; k < p.num_masked; ++k) {
    const int32_t r = p.rows[k];
    CHECK(r >= 0 && r < p.num_rows, "apply_token_mask: rows[", k, "] = ", r, " not in [0, ",
          p.num_rows, ")");
    CHECK(!masked[r], "apply_token_mask: rows[", k, "] = ", r, " repeats");
    masked[r] = true;
  }
  const int64_t words = token_mask_words(p.vocab);
  parallel_for(p.num_masked, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const uint32_t* mask = p.mask + k * words;
      float* logits = p.logits + p.rows[k] * p.vocab;
      bool any_allowed = false;
      for (int64_t id = 0; id < p.vocab; ++id) any_allowed = any_allowed || mask_bit(mask, id);
      if (!any_allowed) continue;
      bool any_finite = false;  // an allowed logit above -inf (NaN is not)
      for (int64_t id = 0; id < p.vocab; ++id) {
        if (!mask_bit(mask, id)) {
          logits[id] = kBanned;
        } else {
          any_finite = any_finite || logits[id] > kBanned;
        }
      }
      if (any_finite) continue;
      for (int64_t id = 0; id < p.vocab; ++id) {
        if (mask_bit(mask, id)) logits[id] = 0.0f;
      }
    }
  });
}

void token_logprobs(const LogprobParams& p) {
  CHECK(p.num_rows >= 0, "token_logprobs: num_rows ", p.num_rows);
  check_vocab("token_logprobs", p.vocab);
  CHECK(p.top_n >= 0 && p.top_n <= kMaxTopLogprobs, "token_logprobs: top_n ", p.top_n,
        " not in [0, ", kMaxTopLogprobs, "]");
  if (p.num_rows == 0) return;
  CHECK(p.logits && p.targets && p.logprob && p.rank, "token_logprobs: null pointer");
  CHECK(p.top_n == 0 || (p.top_ids && p.top_logprobs),
        "token_logprobs: null top_ids / top_logprobs");
  for (int64_t r = 0; r < p.num_rows; ++r) {
    CHECK(p.targets[r] >= 0 && p.targets[r] < p.vocab, "token_logprobs: targets[", r,
          "] = ", p.targets[r], " not in [0, ", p.vocab, ")");
  }
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> keys;
    for (int64_t r = begin; r < end; ++r) {
      const float* l = p.logits + r * p.vocab;
      float max_logit = kBanned;
      for (int64_t id = 0; id < p.vocab; ++id) {
        if (l[id] > max_logit) max_logit = l[id];
      }
      double sum = 0.0;
      for (int64_t id = 0; id < p.vocab; ++id) {
        if (!std::isnan(l[id])) sum += std::exp(static_cast<double>(l[id]) - max_logit);
      }
      const double log_z = static_cast<double>(max_logit) + std::log(sum);
      const auto logprob = [&](int64_t id) {
        return static_cast<float>(static_cast<double>(l[id]) - log_z);
      };

      const int32_t target = p.targets[r];
      const uint64_t target_key = logits::logprob_key(l[target], target);
      int64_t num_before = 0;
      for (int64_t id = 0; id < p.vocab; ++id) {
        num_before += logits::logprob_key(l[id], id) > target_key;
      }
      p.logprob[r] = logprob(target);
      p.rank[r] = 1 + num_before;

      if (p.top_n == 0) continue;
      keys.resize(static_cast<size_t>(p.vocab));
      for (int64_t id = 0; id < p.vocab; ++id) keys[id] = logits::logprob_key(l[id], id);
      const int64_t n = std::min<int64_t>(p.top_n, p.vocab);
      std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), std::greater<>());
      for (int64_t j = 0; j < p.top_n; ++j) {
        const int32_t id = j < n ? logits::logprob_key_id(keys[j]) : -1;
        p.top_ids[r * p.top_n + j] = id;
        p.top_logprobs[r * p.top_n + j] = id >= 0 ? logprob(id) : kBanned;
      }
    }
  });
}

}  // namespace hyserve::cpu
