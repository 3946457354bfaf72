// Logits processing: the per-request adjustments SamplingParams asks for, applied to one
// row of raw model logits before sampling (vLLM's definitions):
//
//   repetition_penalty p  over the distinct tokens of prompt + outputs (HF / vLLM):
//                         l > 0 ? l / p : l * p
//   presence / frequency  over the outputs (OpenAI): l -= presence * (count > 0)
//                                                          + frequency * count
//   logit_bias            added to the listed tokens
//   min_tokens            while fewer outputs than min_tokens: the stop_token_ids and (unless
//                         ignore_eos) the EOS ids get -inf, so they cannot be drawn
//
//   guided decoding       (apply_allowed_tokens, after the above) ids outside the request's
//                         ConstraintState mask get -inf
//
// Logprobs are reported from the raw logits, before any of this.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace hyserve {

struct LogitsProcessorInput {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_token_ids;
  std::span<const int32_t> output_token_ids;
  std::span<const int32_t> eos_token_ids;
};

// Whether apply_logits_processors changes anything for these params and output count.
bool needs_logits_processing(const SamplingParams& params, int64_t num_output_tokens);

// Adjusts one row of logits [vocab] in place. Throws on token ids outside the row.
void apply_logits_processors(std::span<float> logits, const LogitsProcessorInput& input);

// Sets logits[id] = -inf where allowed[id] == 0 (ids beyond `allowed` too). Should that leave
// no finite logit (min_tokens banned the EOS a finished structure asks for), the allowed ids
// get logit 0 instead, so sampling still draws one of them; with no id allowed at all, the
// row is left as it is (sampling must draw something).
void apply_allowed_tokens(std::span<float> logits, const std::vector<uint8_t>& allowed);

}  // namespace hyserve
