// SamplingParams: the per-request generation parameters of vLLM's OpenAI API, with vLLM's
// defaults and range checks. The HTTP layer fills them from a request body and validates them
// (a failure becomes a 400 naming the field); the scheduler validates again on admission.
// The model runner (engine/model_runner.h) applies them on the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/error.h"

namespace hyserve {

class TokenConstraint;  // guided/token_constraint.h

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 or -1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  std::optional<uint64_t> seed;
  float presence_penalty = 0.0f;                      // [-2, 2]
  float frequency_penalty = 0.0f;                     // [-2, 2]
  float repetition_penalty = 1.0f;                    // > 0; 1: off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias added to its logit)
  std::vector<std::string> stop;                      // stop strings (matched on text)
  std::vector<int32_t> stop_token_ids;
  // vLLM's allowed_token_ids: when not empty, only these ids can be sampled (every other
  // logit masked, as guided decoding's masks do; ANDed with a constraint's).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words as id sequences: the last id of a sequence is banned where the outputs so
  // far end with the rest of it (a one-id word is banned everywhere).
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  bool include_stop_str_in_output = false;
  std::optional<int64_t> max_tokens;  // none: up to max_model_len
  int64_t min_tokens = 0;             // EOS and stop_token_ids do not stop before this
  bool ignore_eos = false;
  std::optional<int32_t> logprobs;         // top-N per sampled token; 0: the chosen one only
  std::optional<int32_t> prompt_logprobs;  // top-N per prompt token
  bool skip_special_tokens = true;
  // Guided decoding (response_format json_object / json_schema, guided_choice): the grammar
  // and vocabulary every output must follow; null: unconstrained. Shared by the n choices;
  // each engine request keeps its own ConstraintState.
  std::shared_ptr<const TokenConstraint> constraint;

  static constexpr int32_t kMaxLogprobs = 20;

  // Throws InvalidRequest naming the first field out of range.
  void validate(int64_t vocab_size, int64_t max_model_len) const;
};

}  // namespace hyserve
