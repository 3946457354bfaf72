// CPU token sampling, written as the definition in params.h reads.
#include "kernels/sampling/cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

using sampling::kMaxWeight;

int32_t sample_row(const float* logits, int64_t vocab, const SamplingOptions& o) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  if (best < 0) return -1;
  if (o.temperature == 0.0f) return static_cast<int32_t>(best);

  const float max_logit = logits[best];
  const double inv_temperature = sampling::inverse_temperature(o.temperature);
  std::vector<uint64_t> weight(static_cast<size_t>(vocab), 0);
  std::vector<int64_t> ranked;  // non-NaN ids by rank
  ranked.reserve(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    weight[i] = sampling::token_weight(logits[i], max_logit, inv_temperature);
    ranked.push_back(i);
  }
  std::sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) {
    return sampling::rank_key(logits[a], a) > sampling::rank_key(logits[b], b);
  });

  auto kept = static_cast<int64_t>(ranked.size());
  if (o.top_k > 0) kept = std::min<int64_t>(kept, o.top_k);
  if (o.top_p < 1.0f) {
    uint64_t total = 0;
    for (int64_t j = 0; j < kept; ++j) total += weight[ranked[j]];
    const uint64_t target = std::max<uint64_t>(1, sampling::ceil_mul(o.top_p, total));
    uint64_t sum = 0;
    for (int64_t j = 0; j < kept; ++j) {
      sum += weight[ranked[j]];
      if (sum >= target) {
        kept = j + 1;
        break;
      }
    }
  }
  const uint64_t min_weight = sampling::ceil_mul(o.min_p, kMaxWeight);
  std::vector<bool> keep(static_cast<size_t>(vocab), false);
  uint64_t total = 0;
  for (int64_t j = 0; j < kept; ++j) {
    const int64_t i = ranked[j];
    if (weight[i] >= min_weight) {
      keep[i] = true;
      total += weight[i];
    }
  }
  const uint64_t r = sampling::scale_draw(sampling::draw_bits(o.seed, o.step), total);
  uint64_t sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!keep[i]) continue;
    sum += weight[i];
    if (sum > r) return static_cast<int32_t>(i);
  }
  CHECK(false, "sample_tokens: no token drawn (total weight ", total, ")");
  return -1;
}

}  // namespace

void sample_tokens(const SampleParams& p) {
  CHECK(p.num_rows >= 0, "sample_tokens: num_rows ", p.num_rows);
  CHECK(p.vocab > 0 && p.vocab <= kMaxSamplingVocab, "sample_tokens: vocab ", p.vocab,
        " not in [1, ", kMaxSamplingVocab, "]");
  if (p.num_rows == 0) return;
  CHECK(p.logits != nullptr && p.options != nullptr && p.tokens != nullptr,
        "sample_tokens: null pointer");
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const SamplingOptions& o = p.options[r];
    CHECK(sampling::options_valid(o), "sample_tokens: row ", r, ": temperature ", o.temperature,
          " (finite, >= 0), top_k ", o.top_k, " (>= 0), top_p ", o.top_p, " (in (0, 1]), min_p ",
          o.min_p, " (in [0, 1])");
  }
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      p.tokens[r] = sample_row(p.logits + r * p.vocab, p.vocab, p.options[r]);
    }
  });
}

void gather_tokens(const GatherTokensParams& p) {
  CHECK(p.num_rows >= 0, "gather_tokens: num_rows ", p.num_rows);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    if (p.source_rows[i] >= 0) p.tokens[i] = p.source[p.source_rows[i]];
  }
}

}  // namespace hyserve::cpu
