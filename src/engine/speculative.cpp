#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace hyserve {

const char* to_string(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone:
      return "none";
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kSynthetic:
      return "synthetic";
    case SpeculativeMethod::kMtp:
      return "mtp";
    case SpeculativeMethod::kDraftModel:
      return "draft_model";
  }
  return "?";
}

void validate(const SpeculativeConfig& c) {
  if (!c.enabled()) return;
  CHECK(c.num_speculative_tokens >= 1 && c.num_speculative_tokens <= kMaxSpeculativeTokens,
        "speculative config: num_speculative_tokens must be in [1, ", kMaxSpeculativeTokens,
        "], got ", c.num_speculative_tokens);
  switch (c.method) {
    case SpeculativeMethod::kNgram:
      CHECK(c.prompt_lookup_min >= 1 && c.prompt_lookup_max >= c.prompt_lookup_min,
            "speculative config: prompt_lookup_min (", c.prompt_lookup_min,
            ") must be >= 1 and <= prompt_lookup_max (", c.prompt_lookup_max, ")");
      break;
    case SpeculativeMethod::kSynthetic:
      CHECK(std::isfinite(c.acceptance_length) && c.acceptance_length >= 1.0 &&
                c.acceptance_length <= static_cast<double>(c.num_speculative_tokens + 1),
            "speculative config: acceptance_length must be in [1, num_speculative_tokens + 1 = ",
            c.num_speculative_tokens + 1, "], got ", c.acceptance_length);
      break;
    case SpeculativeMethod::kMtp:
      throw Error(
          "speculative config: method 'mtp' (the next-token module) is not built yet; "
          "'ngram' and 'synthetic' are");
    case SpeculativeMethod::kDraftModel:
      throw Error(
          "speculative config: method 'draft_model' is not built yet; 'ngram' and 'synthetic' "
          "are");
    case SpeculativeMethod::kNone:
      break;
  }
}

bool speculates(const SamplingParams& sp) {
  return sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f &&
         sp.frequency_penalty == 0.0f && sp.constraint == nullptr && sp.allowed_token_ids.empty() &&
         sp.bad_words_token_ids.empty();
}

std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int64_t min_n, int64_t max_n,
                                  int64_t max_drafts) {
  const auto size = std::ssize(tokens);
  if (max_drafts <= 0) return {};
  for (int64_t n = std::min(max_n, size - 1); n >= min_n && n >= 1; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(size - n));
    // Earlier starts from the most recent: the first one followed by max_drafts tokens, else
    // the one followed by the most (the earliest; in a run of one token the most recent match
    // is followed by one token only).
    int64_t best = -1;
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      best = start;
      if (size - (start + n) >= max_drafts) break;
    }
    if (best < 0) continue;
    const int64_t from = best + n;
    const int64_t count = std::min(max_drafts, size - from);
    return {tokens.begin() + from, tokens.begin() + from + count};
  }
  return {};
}

namespace {

std::vector<int32_t> context_tokens(const Request& r) {
  std::vector<int32_t> all = r.prompt_token_ids;
  all.insert(all.end(), r.output_token_ids.begin(), r.output_token_ids.end());
  return all;
}

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const SpeculativeConfig& c)
      : min_(c.prompt_lookup_min), max_(c.prompt_lookup_max) {}
  std::vector<int32_t> propose(const Request& r, int64_t max_drafts) override {
    return ngram_drafts(context_tokens(r), min_, max_, max_drafts);
  }

 private:
  int64_t min_, max_;
};

// Synthetic drafts: the prompt lookup's when it finds one, else the last tokens again; which
// tokens they are does not matter (the acceptance does not read them).
class SyntheticDrafter final : public Drafter {
 public:
  std::vector<int32_t> propose(const Request& r, int64_t max_drafts) override {
    const std::vector<int32_t> all = context_tokens(r);
    std::vector<int32_t> drafts = ngram_drafts(all, 1, 4, max_drafts);
    while (std::ssize(drafts) < max_drafts && !all.empty()) {
      drafts.push_back(all[all.size() - 1 - drafts.size() % all.size()]);
    }
    return drafts;
  }
};

// splitmix64: the synthetic acceptance's draws.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c) {
  validate(c);
  switch (c.method) {
    case SpeculativeMethod::kNgram:
      return std::make_unique<NgramDrafter>(c);
    case SpeculativeMethod::kSynthetic:
      return std::make_unique<SyntheticDrafter>();
    default:
      return nullptr;
  }
}

double acceptance_rate(double length, int64_t num_drafts) {
  CHECK(num_drafts >= 1 && length >= 1.0 && length <= static_cast<double>(num_drafts + 1),
        "acceptance length ", length, " with ", num_drafts, " drafts");
  const auto mean = [&](double rate) {
    double sum = 0.0, term = 1.0;
    for (int64_t i = 0; i <= num_drafts; ++i, term *= rate) sum += term;
    return sum;
  };
  double lo = 0.0, hi = 1.0;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (mean(mid) < length ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

int64_t synthetic_accepted(double rate, int64_t num_drafts, uint64_t seed, int64_t draw_index) {
  int64_t accepted = 0;
  uint64_t state = mix(seed ^ mix(static_cast<uint64_t>(draw_index)));
  while (accepted < num_drafts) {
    state = mix(state);
    const double u = static_cast<double>(state >> 11) * 0x1.0p-53;
    if (u >= rate) break;
    ++accepted;
  }
  return accepted;
}

}  // namespace hyserve
