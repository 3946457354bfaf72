// SamplingParams: the per-request generation parameters of vLLM's OpenAI API, with vLLM's
// defaults and range checks. The HTTP layer fills them from a request body and validates them
// (a failure becomes a 400 naming the field); the scheduler validates again on admission.
//
// Note: engine/sampler.h still declares its own two-field SamplingParams; the two must become
// one (the sampler should read this struct) before both headers meet in one program.
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

  // Throws InvalidArgument naming the first field out of range.
  void validate(int64_t vocab_size, int64_t max_model_len) const {
    CHECK(std::isfinite(temperature) && temperature >= 0.0f,
          "temperature must be a finite number >= 0, got ", temperature);
    CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got ", top_p);
    CHECK(top_k >= -1, "top_k must be -1 or 0 (off) or >= 1, got ", top_k);
    CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
    CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
          "presence_penalty must be in [-2, 2], got ", presence_penalty);
    CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
          "frequency_penalty must be in [-2, 2], got ", frequency_penalty);
    CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
          "repetition_penalty must be a finite number > 0, got ", repetition_penalty);
    for (const auto& [token, bias] : logit_bias) {
      CHECK(token >= 0 && token < vocab_size, "logit_bias token id ", token, " out of range [0, ",
            vocab_size, ")");
      CHECK(std::isfinite(bias), "logit_bias for token ", token, " must be finite, got ", bias);
    }
    for (const auto& s : stop) CHECK(!s.empty(), "stop cannot contain an empty string");
    for (int32_t token : stop_token_ids) {
      CHECK(token >= 0 && token < vocab_size, "stop_token_ids: token id ", token,
            " out of range [0, ", vocab_size, ")");
    }
    if (max_tokens) {
      CHECK(*max_tokens >= 1 && *max_tokens <= max_model_len, "max_tokens must be in [1, ",
            max_model_len, "] (max_model_len), got ", *max_tokens);
    }
    CHECK(min_tokens >= 0, "min_tokens must be >= 0, got ", min_tokens);
    CHECK(!max_tokens || min_tokens <= *max_tokens, "min_tokens must be <= max_tokens, got ",
          min_tokens, " > ", *max_tokens);
    CHECK(!logprobs || (*logprobs >= 0 && *logprobs <= kMaxLogprobs), "logprobs must be in [0, ",
          kMaxLogprobs, "], got ", logprobs.value_or(0));
    CHECK(!prompt_logprobs || (*prompt_logprobs >= 0 && *prompt_logprobs <= kMaxLogprobs),
          "prompt_logprobs must be in [0, ", kMaxLogprobs, "], got ", prompt_logprobs.value_or(0));
  }
};

}  // namespace hyserve
