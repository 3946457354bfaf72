#include "engine/sampling_params.h"

namespace hyserve {
namespace {

// Throws InvalidRequest(param, the message) unless cond.
template <typename... Args>
void require(bool cond, const char* param, Args&&... message) {
  if (!cond) throw InvalidRequest(param, str_cat(std::forward<Args>(message)...));
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size, int64_t max_model_len) const {
  require(std::isfinite(temperature) && temperature >= 0.0f, "temperature",
          "temperature must be a finite number >= 0, got ", temperature);
  require(top_p > 0.0f && top_p <= 1.0f, "top_p", "top_p must be in (0, 1], got ", top_p);
  require(top_k >= -1, "top_k", "top_k must be -1 or 0 (off) or >= 1, got ", top_k);
  require(min_p >= 0.0f && min_p <= 1.0f, "min_p", "min_p must be in [0, 1], got ", min_p);
  require(presence_penalty >= -2.0f && presence_penalty <= 2.0f, "presence_penalty",
          "presence_penalty must be in [-2, 2], got ", presence_penalty);
  require(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f, "frequency_penalty",
          "frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  require(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f, "repetition_penalty",
          "repetition_penalty must be a finite number > 0, got ", repetition_penalty);
  for (const auto& [token, bias] : logit_bias) {
    require(token >= 0 && token < vocab_size, "logit_bias", "logit_bias token id ", token,
            " out of range [0, ", vocab_size, ")");
    require(std::isfinite(bias), "logit_bias", "logit_bias for token ", token,
            " must be finite, got ", bias);
  }
  for (const auto& s : stop) require(!s.empty(), "stop", "stop cannot contain an empty string");
  for (int32_t token : stop_token_ids) {
    require(token >= 0 && token < vocab_size, "stop_token_ids", "stop_token_ids: token id ", token,
            " out of range [0, ", vocab_size, ")");
  }
  for (const std::vector<int32_t>& word : bad_words_token_ids) {
    require(!word.empty(), "bad_words", "bad_words: a word of no tokens");
    for (int32_t token : word) {
      require(token >= 0 && token < vocab_size, "bad_words", "bad_words: token id ", token,
              " out of range [0, ", vocab_size, ")");
    }
  }
  for (int32_t token : allowed_token_ids) {
    require(token >= 0 && token < vocab_size, "allowed_token_ids", "allowed_token_ids: token id ",
            token, " out of range [0, ", vocab_size, ")");
  }
  if (max_tokens) {
    require(*max_tokens >= 1 && *max_tokens <= max_model_len, "max_tokens",
            "max_tokens must be in [1, ", max_model_len, "] (max_model_len), got ", *max_tokens);
  }
  require(min_tokens >= 0, "min_tokens", "min_tokens must be >= 0, got ", min_tokens);
  require(!max_tokens || min_tokens <= *max_tokens, "min_tokens",
          "min_tokens must be <= max_tokens, got ", min_tokens, " > ", max_tokens.value_or(0));
  require(!logprobs || (*logprobs >= 0 && *logprobs <= kMaxLogprobs), "logprobs",
          "logprobs must be in [0, ", kMaxLogprobs, "], got ", logprobs.value_or(0));
  require(!prompt_logprobs || (*prompt_logprobs >= 0 && *prompt_logprobs <= kMaxLogprobs),
          "prompt_logprobs", "prompt_logprobs must be in [0, ", kMaxLogprobs, "], got ",
          prompt_logprobs.value_or(0));
}

}  // namespace hyserve
