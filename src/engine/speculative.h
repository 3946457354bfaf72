// Speculative decoding, the engine's side: which drafter proposes the tokens after a request's
// last one, and how the runner decides how many of them it keeps.
//
// Every drafter here proposes tokens, not distributions (q is a point mass on each draft). For
// such drafts the rejection rule that keeps the target distribution exactly (accept draft d
// with probability min(1, p(d) / q(d)) = p(d), else sample from p without d) draws the same
// outcomes as sampling each verified position from p with the request's own sampler (its seed
// and draw index, as without speculation) and keeping the drafts while the sampled token equals
// the draft: the sampled token at the first mismatch is then the token after the accepted
// ones. That is what the runner does (a greedy request is temperature 0: its argmax), so a
// request's outputs are the same tokens with and without speculation whenever the logits
// of each position are (on the CPU they are bitwise: the verification runs the decode form).
//
// The synthetic method is for benchmarks: its drafts are accepted at a configured mean
// acceptance length whatever the model says (the accepted drafts then become the outputs), so
// the cost of verification can be measured at the acceptance lengths real drafters reach.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"

namespace hyserve {

enum class SpeculativeMethod {
  kNone,
  kNgram,       // prompt lookup (vLLM's "ngram")
  kSynthetic,   // drafts accepted at a given mean acceptance length (benchmarks)
  kMtp,         // DeepSeek-V3.2's next-token module
  kDraftModel,  // a smaller checkpoint with the same tokenizer
};

const char* to_string(SpeculativeMethod method);

// The --speculative-config the engine runs with (server/speculative_config.h reads vLLM's
// JSON into it).
struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int64_t num_speculative_tokens = 0;  // drafts per step at most, 1..kMaxSpeculativeTokens
  // ngram: the longest suffix of the request's tokens of at most prompt_lookup_max and at
  // least prompt_lookup_min tokens that occurred before proposes the tokens that followed it.
  int64_t prompt_lookup_min = 0;
  int64_t prompt_lookup_max = 0;
  // synthetic: the mean number of tokens a verification step gives a request (accepted drafts
  // + 1), in [1, num_speculative_tokens + 1].
  double acceptance_length = 0.0;
  // draft_model: the checkpoint folder.
  std::string model;
  // How a model drafter picks its drafts: its argmax (greedy, a point mass) or a sample of
  // its distribution q, verified by rejection sampling against p / q (probabilistic). Either
  // way the outputs follow the target's distribution; ngram and synthetic drafts are tokens.
  bool probabilistic_drafts = false;
  // No drafts while this many requests or more run (0: always drafts).
  int64_t disable_by_batch_size = 0;

  bool enabled() const { return method != SpeculativeMethod::kNone; }
};

inline constexpr int64_t kMaxSpeculativeTokens = 8;

// Refuses a config the engine cannot run (Error naming the field).
void validate(const SpeculativeConfig& config);

// Whether a request takes part: speculation stays off for requests whose sampling depends on
// the outputs before each position beyond the tokens themselves (repetition, presence and
// frequency penalties; guided decoding), which then decode one token per step.
bool speculates(const SamplingParams& sampling);

// Proposes a request's drafts before each step.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max_drafts` tokens to follow the request's tokens (prompt and outputs).
  virtual std::vector<int32_t> propose(const Request& request, int64_t max_drafts) = 0;
};

// Prompt lookup: the longest suffix n-gram (prompt_lookup_max >= n >= prompt_lookup_min) that
// occurred before proposes the tokens after its most recent earlier occurrence that has
// max_drafts tokens after it (else after the earliest: the most tokens).
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int64_t min_n, int64_t max_n,
                                  int64_t max_drafts);

// The drafter of a config (ngram and synthetic; the model drafters are refused by validate
// until they are built).
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config);

// The synthetic method's acceptance: each draft in turn is accepted with probability `rate`
// until one is not (so a step's mean length is sum_{i=0..k} rate^i); deterministic in (seed,
// draw index). acceptance_rate(length, k) is the rate whose mean length over k drafts is
// `length`.
double acceptance_rate(double length, int64_t num_drafts);
int64_t synthetic_accepted(double rate, int64_t num_drafts, uint64_t seed, int64_t draw_index);

}  // namespace hyserve
