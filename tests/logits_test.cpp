// The CPU logits processors and log-probabilities (kernels/logits): each op exactly on
// hand-computed rows (penalty signs, repeated counts, bias then ban, the mask fallback,
// ranks with ties, NaN and -inf), its refusals, and equality on random rows with a plain
// per-row statement of each processor's definition (vLLM's) and of the logprob.
#include "kernels/logits/cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/sampling_params.h"
#include "kernels/sampling/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Equal bit patterns (NaN == NaN, -0 != +0), naming the first difference.
testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]))
      return testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  return testing::AssertionSuccess();
}

std::vector<uint32_t> mask_of(int64_t vocab, const std::vector<int32_t>& ids) {
  std::vector<uint32_t> mask(static_cast<size_t>(token_mask_words(vocab)), 0);
  for (int32_t id : ids) mask[id / 32] |= 1u << (id % 32);
  return mask;
}

// Persistent per-request state of a batch of `max_rows` rows (PenaltyParams' arrays).
struct PenaltyState {
  PenaltyState(int64_t max_rows, int64_t vocab_size)
      : vocab(vocab_size),
        repetition(max_rows, 1.0f),
        presence(max_rows, 0.0f),
        frequency(max_rows, 0.0f),
        counts(max_rows * vocab_size, 0),
        prompt_mask(max_rows * token_mask_words(vocab_size), 0) {}

  void add_prompt(int32_t row, const std::vector<int32_t>& ids) {
    for (int32_t id : ids) prompt_mask[row * token_mask_words(vocab) + id / 32] |= 1u << (id % 32);
  }
  void add_outputs(int32_t row, const std::vector<int32_t>& ids) {
    const std::vector<int32_t> rows(ids.size(), row);
    cpu::count_tokens({.counts = counts.data(),
                       .rows = rows.data(),
                       .tokens = ids.data(),
                       .num_tokens = static_cast<int64_t>(ids.size()),
                       .vocab = vocab});
  }
  void apply(std::vector<float>& logits, const std::vector<int32_t>& rows) {
    cpu::apply_penalties({.logits = logits.data(),
                          .rows = rows.data(),
                          .repetition = repetition.data(),
                          .presence = presence.data(),
                          .frequency = frequency.data(),
                          .output_counts = counts.data(),
                          .prompt_mask = prompt_mask.data(),
                          .num_rows = static_cast<int64_t>(rows.size()),
                          .vocab = vocab});
  }

  int64_t vocab;
  std::vector<float> repetition, presence, frequency;
  std::vector<int32_t> counts;
  std::vector<uint32_t> prompt_mask;
};

TEST(LogitsPenalties, RepetitionDividesPositiveAndMultipliesNegativeLogits) {
  PenaltyState s(1, 6);
  s.repetition[0] = 2.0f;
  s.add_prompt(0, {0, 1, 1});
  s.add_outputs(0, {2, 3, 3, 3});
  std::vector<float> logits = {3.0f, -3.0f, 5.0f, -0.5f, 1.0f, -1.0f};
  s.apply(logits, {0});
  // Each seen id once, however often it occurs; ids 4 and 5 are not seen.
  EXPECT_TRUE(same_bits(logits, {1.5f, -6.0f, 2.5f, -1.0f, 1.0f, -1.0f}));
}

TEST(LogitsPenalties, PresenceAndFrequencyCountOutputsOnly) {
  PenaltyState s(1, 5);
  s.presence[0] = 0.5f;
  s.frequency[0] = 0.25f;
  s.add_prompt(0, {0, 4});
  s.add_outputs(0, {1, 2, 2, 2, 4});
  std::vector<float> logits = {1.0f, 1.0f, -2.0f, 3.0f, 0.0f};
  s.apply(logits, {0});
  // l -= 0.5 + 0.25 * count: id 1 once, id 2 three times, id 4 once; id 0 is prompt only.
  EXPECT_TRUE(same_bits(logits, {1.0f, 0.25f, -3.25f, 3.0f, -0.75f}));
}

TEST(LogitsPenalties, RepetitionThenPresenceOnPersistentRows) {
  // Logits rows 0 and 1 read persistent rows 2 and 0; persistent row 1 is someone else's.
  PenaltyState s(3, 4);
  s.repetition = {1.0f, 4.0f, 2.0f};
  s.presence = {1.0f, 0.0f, 0.5f};
  s.frequency = {0.0f, 8.0f, 0.0f};
  s.add_outputs(2, {0, 1});
  s.add_outputs(1, {3});
  s.add_outputs(0, {3, 3});
  std::vector<float> logits = {4.0f, -4.0f, 4.0f, 4.0f,  //
                               4.0f, -4.0f, 4.0f, 4.0f};
  s.apply(logits, {2, 0});
  EXPECT_TRUE(same_bits(logits, {1.5f, -8.5f, 4.0f, 4.0f,  //
                                 4.0f, -4.0f, 4.0f, 3.0f}));
}

TEST(LogitsPenalties, OffRowIsUnchangedBitForBit) {
  PenaltyState s(1, 4);
  s.add_prompt(0, {0, 1, 2, 3});
  s.add_outputs(0, {0, 1, 2, 3});
  std::vector<float> logits = {-0.0f, NAN, -kInf, 7.0f};
  const std::vector<float> before = logits;
  s.apply(logits, {0});
  EXPECT_TRUE(same_bits(logits, before));
}

TEST(LogitsPenalties, RefusesBadArguments) {
  PenaltyState s(2, 4);
  std::vector<float> logits(4, 0.0f);
  EXPECT_THROW(s.apply(logits, {-1}), InvalidArgument);
  s.repetition[1] = 0.0f;
  EXPECT_THROW(s.apply(logits, {1}), InvalidArgument);
  EXPECT_NO_THROW(cpu::apply_penalties({.num_rows = 0, .vocab = 4}));
  EXPECT_THROW(cpu::apply_penalties({.num_rows = 1, .vocab = 4}), InvalidArgument);
  EXPECT_THROW(cpu::apply_penalties({.num_rows = 0, .vocab = 0}), InvalidArgument);
}

TEST(LogitsCountTokens, CountsDuplicatesAndSkipsIdsOutsideTheVocab) {
  const int64_t vocab = 4;
  std::vector<int32_t> counts(3 * vocab, 0);
  counts[1 * vocab + 2] = 5;
  const std::vector<int32_t> rows = {0, 1, 0, 2, 1, 0, 2};
  const std::vector<int32_t> tokens = {3, 2, 3, -1, 2, 0, 4};
  cpu::count_tokens({.counts = counts.data(),
                     .rows = rows.data(),
                     .tokens = tokens.data(),
                     .num_tokens = 7,
                     .vocab = vocab});
  EXPECT_EQ(counts, (std::vector<int32_t>{1, 0, 0, 2, 0, 0, 7, 0, 0, 0, 0, 0}));

  const std::vector<int32_t> bad_rows = {0, -1};
  EXPECT_THROW(cpu::count_tokens({.counts = counts.data(),
                                  .rows = bad_rows.data(),
                                  .tokens = tokens.data(),
                                  .num_tokens = 2,
                                  .vocab = vocab}),
               InvalidArgument);
  EXPECT_EQ(counts[3], 2) << "a refused call changes nothing";
}

void adjust(std::vector<float>& logits, int64_t num_rows, const std::vector<int32_t>& row,
            const std::vector<int32_t>& id, const std::vector<float>& value, LogitAdjustMode mode) {
  cpu::adjust_logits({.logits = logits.data(),
                      .row = row.data(),
                      .id = id.data(),
                      .value = value.empty() ? nullptr : value.data(),
                      .num_entries = static_cast<int64_t>(row.size()),
                      .num_rows = num_rows,
                      .vocab = static_cast<int64_t>(logits.size()) / num_rows,
                      .mode = mode});
}

TEST(LogitsAdjust, BiasThenBan) {
  std::vector<float> logits = {1.0f,  2.0f, 3.0f,  //
                               -1.0f, NAN,  0.5f};
  adjust(logits, 2, {0, 1, 1, 0}, {2, 0, 2, 0}, {-3.0f, 100.0f, 0.25f, 0.5f},
         LogitAdjustMode::kAdd);
  EXPECT_TRUE(same_bits(logits, {1.5f, 2.0f, 0.0f, 99.0f, NAN, 0.75f}));
  adjust(logits, 2, {1, 0, 1}, {2, 2, 1}, {}, LogitAdjustMode::kBan);
  EXPECT_TRUE(same_bits(logits, {1.5f, 2.0f, -kInf, 99.0f, -kInf, -kInf}));
}

TEST(LogitsAdjust, RefusesOutOfRangeAndRepeatedEntries) {
  std::vector<float> logits(6, 0.0f);
  EXPECT_THROW(adjust(logits, 2, {2}, {0}, {1.0f}, LogitAdjustMode::kAdd), InvalidArgument);
  EXPECT_THROW(adjust(logits, 2, {0}, {3}, {1.0f}, LogitAdjustMode::kAdd), InvalidArgument);
  EXPECT_THROW(adjust(logits, 2, {0}, {-1}, {}, LogitAdjustMode::kBan), InvalidArgument);
  EXPECT_THROW(adjust(logits, 2, {1, 1}, {2, 2}, {1.0f, 1.0f}, LogitAdjustMode::kAdd),
               InvalidArgument);
  EXPECT_THROW(adjust(logits, 2, {1}, {2}, {}, LogitAdjustMode::kAdd), InvalidArgument);
  EXPECT_TRUE(same_bits(logits, std::vector<float>(6, 0.0f)));
}

void mask(std::vector<float>& logits, int64_t num_rows, const std::vector<int32_t>& rows,
          const std::vector<uint32_t>& masks) {
  cpu::apply_token_mask({.logits = logits.data(),
                         .rows = rows.data(),
                         .mask = masks.data(),
                         .num_masked = static_cast<int64_t>(rows.size()),
                         .num_rows = num_rows,
                         .vocab = static_cast<int64_t>(logits.size()) / num_rows});
}

TEST(LogitsTokenMask, BansClearedIdsWithFallbackToAllowedZeros) {
  const int64_t vocab = 4;
  std::vector<float> logits = {1.0f, 2.0f,  3.0f,  4.0f,    // row 0: not masked
                               1.0f, 2.0f,  3.0f,  4.0f,    // row 1: {1, 3} allowed
                               1.0f, -kInf, 3.0f,  -kInf,   // row 2: {1, 3}, both -inf
                               1.0f, 2.0f,  NAN,   -kInf,   // row 3: {2, 3}: NaN, -inf
                               1.0f, 2.0f,  3.0f,  4.0f,    // row 4: nothing allowed
                               NAN,  kInf,  -kInf, -kInf};  // row 5: {1}: +inf is kept
  std::vector<uint32_t> masks;
  for (const auto& ids : std::vector<std::vector<int32_t>>{{1, 3}, {1, 3}, {2, 3}, {}, {1}}) {
    const auto m = mask_of(vocab, ids);
    masks.insert(masks.end(), m.begin(), m.end());
  }
  mask(logits, 6, {1, 2, 3, 4, 5}, masks);
  EXPECT_TRUE(same_bits(logits, {1.0f,  2.0f,  3.0f,  4.0f,  //
                                 -kInf, 2.0f,  -kInf, 4.0f,  //
                                 -kInf, 0.0f,  -kInf, 0.0f,  //
                                 -kInf, -kInf, 0.0f,  0.0f,  //
                                 1.0f,  2.0f,  3.0f,  4.0f,  //
                                 -kInf, kInf,  -kInf, -kInf}));
}

TEST(LogitsTokenMask, IgnoresPaddingBitsAndRefusesRepeatedRows) {
  const int64_t vocab = 33;  // two mask words, 31 padding bits
  std::vector<float> logits(vocab, 1.0f);
  std::vector<uint32_t> m = {0u, 0xfffffffeu};  // only padding bits set: no id allowed
  mask(logits, 1, {0}, m);
  EXPECT_TRUE(same_bits(logits, std::vector<float>(vocab, 1.0f)));
  m = {0u, 0xffffffffu};  // id 32 allowed
  mask(logits, 1, {0}, m);
  std::vector<float> want(vocab, -kInf);
  want[32] = 1.0f;
  EXPECT_TRUE(same_bits(logits, want));

  std::vector<float> two(2 * vocab, 1.0f);
  const std::vector<uint32_t> masks = {1u, 0u, 1u, 0u};
  EXPECT_THROW(mask(two, 2, {1, 1}, masks), InvalidArgument);
  EXPECT_THROW(mask(two, 2, {2}, masks), InvalidArgument);
  EXPECT_TRUE(same_bits(two, std::vector<float>(2 * vocab, 1.0f)));
}

struct Logprobs {
  std::vector<float> logprob;
  std::vector<int64_t> rank;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

Logprobs logprobs(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                  int32_t top_n) {
  const auto rows = static_cast<int64_t>(targets.size());
  Logprobs out{std::vector<float>(rows), std::vector<int64_t>(rows),
               std::vector<int32_t>(rows * top_n), std::vector<float>(rows * top_n)};
  cpu::token_logprobs({.logits = logits.data(),
                       .targets = targets.data(),
                       .num_rows = rows,
                       .vocab = static_cast<int64_t>(logits.size()) / rows,
                       .top_n = top_n,
                       .logprob = out.logprob.data(),
                       .rank = out.rank.data(),
                       .top_ids = out.top_ids.data(),
                       .top_logprobs = out.top_logprobs.data()});
  return out;
}

TEST(LogitsLogprobs, NanAndMinusInfRankLastAndAddNothing) {
  // max 0, sum of exp over non-NaN = 1 + 0 + 1 = 2: log_z = ln 2.
  const std::vector<float> row = {0.0f, -kInf, NAN, 0.0f};
  const float minus_ln2 = static_cast<float>(-std::log(2.0));
  const std::vector<float> want_logprob = {minus_ln2, -kInf, NAN, minus_ln2};
  const std::vector<int64_t> want_rank = {1, 3, 4, 2};
  for (int32_t target = 0; target < 4; ++target) {
    const Logprobs got = logprobs(row, {target}, 6);
    SCOPED_TRACE(target);
    EXPECT_TRUE(same_bits(got.logprob, {want_logprob[target]}));
    EXPECT_EQ(got.rank[0], want_rank[target]);
    EXPECT_EQ(got.top_ids, (std::vector<int32_t>{0, 3, 1, 2, -1, -1}));
    EXPECT_TRUE(same_bits(got.top_logprobs, {minus_ln2, minus_ln2, -kInf, NAN, -kInf, -kInf}));
  }
}

TEST(LogitsLogprobs, TiesRankByIdAndMinusZeroTiesPlusZero) {
  const Logprobs got = logprobs({1.0f, 2.0f, 2.0f, 1.0f, 2.0f,  //
                                 -0.0f, 0.0f, -0.0f, -1.0f, 0.0f},
                                {3, 2}, 5);
  EXPECT_EQ(got.rank, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{1, 2, 4, 0, 3,  //
                                               0, 1, 2, 4, 3}));
  // Row 0: log_z = 2 + ln(e^-1 + 1 + 1 + e^-1 + 1), summed in id order as defined.
  const double e = std::exp(-1.0);
  const double log_z = 2.0 + std::log(e + 1.0 + 1.0 + e + 1.0);
  EXPECT_EQ(got.logprob[0], static_cast<float>(1.0 - log_z));
  EXPECT_EQ(got.top_logprobs[0], static_cast<float>(2.0 - log_z));
}

TEST(LogitsLogprobs, AllNanAndAllMinusInfRowsKeepTheIdOrder) {
  const Logprobs got = logprobs({NAN, NAN, NAN, -kInf, -kInf, -kInf}, {1, 2}, 3);
  EXPECT_TRUE(std::isnan(got.logprob[0]) && std::isnan(got.logprob[1]));
  EXPECT_EQ(got.rank, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
}

TEST(LogitsLogprobs, RefusesBadArguments) {
  EXPECT_THROW(logprobs({0.0f, 1.0f}, {2}, 1), InvalidArgument);
  EXPECT_THROW(logprobs({0.0f, 1.0f}, {-1}, 1), InvalidArgument);
  EXPECT_THROW(logprobs({0.0f, 1.0f}, {0}, kMaxTopLogprobs + 1), InvalidArgument);
  EXPECT_NO_THROW(logprobs({0.0f, 1.0f}, {0}, 0));
}

// make_logprobs of engine/engine.cpp (the CPU engine's definition), restated: the token's
// logprob, its rank (ties: lower id first, NaN last) and the best top_n.
Logprobs engine_logprobs(const std::vector<float>& row, int32_t token, int32_t top_n) {
  float max_logit = -kInf;
  for (float l : row) {
    if (l > max_logit) max_logit = l;
  }
  double sum = 0.0;
  for (float l : row) {
    if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - max_logit);
  }
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  const auto logprob = [&](int32_t id) { return static_cast<float>(row[id] - log_z); };
  const auto better = [&](int32_t a, int32_t b) {
    if (std::isnan(row[a]) != std::isnan(row[b])) return std::isnan(row[b]);
    return row[a] > row[b] || (!(row[b] > row[a]) && a < b);
  };
  Logprobs out{{logprob(token)}, {1}, {}, {}};
  for (int32_t id = 0; id < static_cast<int32_t>(row.size()); ++id)
    out.rank[0] += better(id, token);
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), better);
  for (int32_t j = 0; j < top_n; ++j) {
    const int32_t id = j < static_cast<int32_t>(ids.size()) ? ids[j] : -1;
    out.top_ids.push_back(id);
    out.top_logprobs.push_back(id >= 0 ? logprob(id) : -kInf);
  }
  return out;
}

// Random logits: kind 1 and 2 with ties (+-0 among them), kind 2 with -inf and NaN.
std::vector<float> random_logits(int64_t n, std::mt19937_64& rng, int kind) {
  std::normal_distribution<float> d(0.0f, kind == 2 ? 8.0f : 2.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = d(rng);
    if (kind >= 1) x = std::round(x * 2.0f) / 2.0f;
    if (kind == 2 && rng() % 11 == 0) x = rng() % 2 ? NAN : -kInf;
  }
  return v;
}

TEST(LogitsLogprobs, EqualTheEngineDefinitionOnRandomRows) {
  std::mt19937_64 rng(7);
  for (int64_t vocab : {1, 2, 3, 20, 21, 64, 1000}) {
    for (int kind = 0; kind < 3; ++kind) {
      const int64_t rows = 9;
      const std::vector<float> logits = random_logits(rows * vocab, rng, kind);
      std::vector<int32_t> targets(rows);
      for (int32_t& t : targets) t = static_cast<int32_t>(rng() % vocab);
      for (int32_t top_n : {0, 1, 5, kMaxTopLogprobs}) {
        const Logprobs got = logprobs(logits, targets, top_n);
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE("vocab " + std::to_string(vocab) + " kind " + std::to_string(kind) +
                       " top_n " + std::to_string(top_n) + " row " + std::to_string(r));
          const Logprobs want = engine_logprobs(
              {logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab}, targets[r], top_n);
          EXPECT_TRUE(same_bits({got.logprob[r]}, want.logprob));
          EXPECT_EQ(got.rank[r], want.rank[0]);
          EXPECT_EQ(std::vector<int32_t>(got.top_ids.begin() + r * top_n,
                                         got.top_ids.begin() + (r + 1) * top_n),
                    want.top_ids);
          EXPECT_TRUE(same_bits(
              {got.top_logprobs.begin() + r * top_n, got.top_logprobs.begin() + (r + 1) * top_n},
              want.top_logprobs));
        }
      }
    }
  }
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// One row processed as the definitions read, one request at a time: repetition over the
// distinct prompt + output ids (l > 0 ? l / p : l * p), presence + frequency x count over the
// outputs, logit_bias added, stop ids and (unless ignore_eos) EOS at -inf while fewer outputs
// than min_tokens, then a guided mask (ids not allowed at -inf; if no allowed id keeps a
// finite logit they all get 0; an empty allowed set leaves the row).
void reference_row(std::span<float> row, const SamplingParams& sp, std::span<const int32_t> prompt,
                   std::span<const int32_t> outputs, std::span<const int32_t> eos,
                   const std::vector<uint8_t>& allowed) {
  const size_t vocab = row.size();
  if (sp.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (int32_t id : prompt) seen[id] = true;
    for (int32_t id : outputs) seen[id] = true;
    for (size_t i = 0; i < vocab; ++i) {
      if (seen[i])
        row[i] = row[i] > 0.0f ? row[i] / sp.repetition_penalty : row[i] * sp.repetition_penalty;
    }
  }
  std::vector<int64_t> count(vocab, 0);
  for (int32_t id : outputs) ++count[id];
  for (size_t i = 0; i < vocab; ++i) {
    if (count[i] > 0) {
      row[i] -= sp.presence_penalty + sp.frequency_penalty * static_cast<float>(count[i]);
    }
  }
  for (const auto& [id, bias] : sp.logit_bias) row[id] += bias;
  if (static_cast<int64_t>(outputs.size()) < sp.min_tokens) {
    for (int32_t id : sp.stop_token_ids) row[id] = -kInf;
    if (!sp.ignore_eos) {
      for (int32_t id : eos) row[id] = -kInf;
    }
  }
  if (std::find(allowed.begin(), allowed.end(), uint8_t{1}) == allowed.end()) return;
  bool finite = false;
  for (size_t i = 0; i < vocab; ++i) {
    if (allowed[i] == 0) {
      row[i] = -kInf;
    } else {
      finite = finite || row[i] > -kInf;
    }
  }
  if (finite) return;
  for (size_t i = 0; i < vocab; ++i) {
    if (allowed[i] != 0) row[i] = 0.0f;
  }
}

// The runner's processor sequence (params.h: penalties, bias, bans, mask) on a batch equals
// reference_row applied to each row.
TEST(LogitsEngine, ProcessorsEqualTheEngineOnRandomRows) {
  std::mt19937_64 rng(11);
  const std::vector<int32_t> eos = {0, 2};
  for (int64_t vocab : {3, 40, 200}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t rows = 1 + static_cast<int64_t>(rng() % 6);
      const int64_t max_rows = rows + 2;
      std::vector<int32_t> persistent(max_rows);
      std::iota(persistent.begin(), persistent.end(), 0);
      std::shuffle(persistent.begin(), persistent.end(), rng);
      persistent.resize(rows);

      std::vector<float> logits = random_logits(rows * vocab, rng, static_cast<int>(rng() % 3));
      std::vector<float> want = logits;
      PenaltyState state(max_rows, vocab);
      std::vector<int32_t> bias_rows, bias_ids, ban_rows, ban_ids, masked_rows;
      std::vector<float> bias_values;
      std::vector<uint32_t> masks;
      for (int64_t i = 0; i < rows; ++i) {
        const int32_t pr = persistent[i];
        SamplingParams sp;
        const float penalties[] = {1.0f, 0.5f, 1.3f, 2.0f};
        sp.repetition_penalty = penalties[rng() % 4];
        sp.presence_penalty = rng() % 2 ? 0.0f : std::uniform_real_distribution<float>(-2, 2)(rng);
        sp.frequency_penalty = rng() % 2 ? 0.0f : std::uniform_real_distribution<float>(-2, 2)(rng);
        std::set<int32_t> biased;
        for (int32_t id : random_ids(rng() % 4, vocab, rng)) {
          if (!biased.insert(id).second) continue;
          sp.logit_bias.push_back({id, std::uniform_real_distribution<float>(-5, 5)(rng)});
        }
        sp.stop_token_ids = random_ids(rng() % 3, vocab, rng);
        sp.ignore_eos = rng() % 2;
        const std::vector<int32_t> prompt = random_ids(1 + rng() % 8, vocab, rng);
        const std::vector<int32_t> outputs = random_ids(rng() % 12, vocab, rng);
        sp.min_tokens = static_cast<int64_t>(rng() % 16);
        std::vector<uint8_t> allowed;
        const int mask_kind = static_cast<int>(rng() % 4);  // 0: none, 3: nothing allowed
        if (mask_kind > 0) {
          allowed.assign(vocab, 0);
          if (mask_kind < 3) {
            for (int32_t id : random_ids(1 + rng() % 5, vocab, rng)) allowed[id] = 1;
          }
        }

        const std::span<float> row(want.data() + i * vocab, vocab);
        reference_row(row, sp, prompt, outputs, eos, allowed);

        state.repetition[pr] = sp.repetition_penalty;
        state.presence[pr] = sp.presence_penalty;
        state.frequency[pr] = sp.frequency_penalty;
        state.add_prompt(pr, prompt);
        state.add_outputs(pr, outputs);
        for (const auto& [id, bias] : sp.logit_bias) {
          bias_rows.push_back(static_cast<int32_t>(i));
          bias_ids.push_back(id);
          bias_values.push_back(bias);
        }
        if (static_cast<int64_t>(outputs.size()) < sp.min_tokens) {
          std::set<int32_t> banned(sp.stop_token_ids.begin(), sp.stop_token_ids.end());
          if (!sp.ignore_eos) banned.insert(eos.begin(), eos.end());
          for (int32_t id : banned) {
            ban_rows.push_back(static_cast<int32_t>(i));
            ban_ids.push_back(id);
          }
        }
        if (!allowed.empty()) {
          masked_rows.push_back(static_cast<int32_t>(i));
          std::vector<int32_t> ids;
          for (int32_t id = 0; id < vocab; ++id) {
            if (allowed[id]) ids.push_back(id);
          }
          const auto m = mask_of(vocab, ids);
          masks.insert(masks.end(), m.begin(), m.end());
        }
      }
      state.apply(logits, persistent);
      adjust(logits, rows, bias_rows, bias_ids, bias_values, LogitAdjustMode::kAdd);
      adjust(logits, rows, ban_rows, ban_ids, {}, LogitAdjustMode::kBan);
      mask(logits, rows, masked_rows, masks);
      ASSERT_TRUE(same_bits(logits, want)) << "vocab " << vocab << " trial " << trial;
    }
  }
}

// The CPU backend forwards each op to the CPU kernel.
TEST(LogitsBackend, CpuBackendRunsTheCpuOps) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  std::vector<float> logits = {1.0f, 4.0f, 2.0f, -1.0f};
  const std::vector<int32_t> rows = {0}, tokens = {1}, id = {2};
  std::vector<int32_t> counts(4, 0);
  backend->count_tokens({counts.data(), rows.data(), tokens.data(), 1, 4});
  EXPECT_EQ(counts, (std::vector<int32_t>{0, 1, 0, 0}));
  const float repetition = 2.0f, presence = 0.0f, frequency = 1.0f;
  const std::vector<uint32_t> prompt = {1u << 3};
  backend->apply_penalties({logits.data(), rows.data(), &repetition, &presence, &frequency,
                            counts.data(), prompt.data(), 1, 4});
  EXPECT_TRUE(same_bits(logits, {1.0f, 1.0f, 2.0f, -2.0f}));
  const float bias = 0.5f;
  backend->adjust_logits({logits.data(), rows.data(), id.data(), &bias, 1, 1, 4});
  EXPECT_TRUE(same_bits(logits, {1.0f, 1.0f, 2.5f, -2.0f}));
  const std::vector<uint32_t> allowed = {0b1011u};
  backend->apply_token_mask({logits.data(), rows.data(), allowed.data(), 1, 1, 4});
  EXPECT_TRUE(same_bits(logits, {1.0f, 1.0f, -kInf, -2.0f}));

  float logprob = 0.0f;
  int64_t rank = 0;
  int32_t top_id = -2;
  float top_logprob = 0.0f;
  backend->token_logprobs(
      {logits.data(), tokens.data(), 1, 4, 1, &logprob, &rank, &top_id, &top_logprob});
  EXPECT_EQ(rank, 2);
  EXPECT_EQ(top_id, 0);
  EXPECT_EQ(logprob, top_logprob);
  const SamplingOptions greedy{};
  int32_t token = -2;
  backend->sample_tokens({logits.data(), &greedy, &token, 1, 4});
  EXPECT_EQ(token, 0);
}

}  // namespace
}  // namespace hyserve
