#include "engine/logits_processor.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "util/error.h"

namespace hyserve {

bool needs_logits_processing(const SamplingParams& params, int64_t num_output_tokens) {
  return params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
         params.frequency_penalty != 0.0f || !params.logit_bias.empty() ||
         num_output_tokens < params.min_tokens;
}

void apply_logits_processors(std::span<float> logits, const LogitsProcessorInput& input) {
  CHECK(input.params != nullptr, "apply_logits_processors: params is null");
  CHECK(!logits.empty(), "apply_logits_processors: empty logits row");
  const SamplingParams& sp = *input.params;
  const auto vocab = static_cast<int64_t>(logits.size());
  const auto check_id = [&](int32_t token, const char* what) {
    CHECK(token >= 0 && token < vocab, "apply_logits_processors: ", what, " token id ", token,
          " out of range [0, ", vocab, ")");
  };

  if (sp.repetition_penalty != 1.0f) {
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (auto tokens : {input.prompt_token_ids, input.output_token_ids}) {
      for (int32_t token : tokens) {
        check_id(token, "prompt / output");
        seen[static_cast<size_t>(token)] = true;
      }
    }
    for (int64_t i = 0; i < vocab; ++i) {
      if (!seen[static_cast<size_t>(i)]) continue;
      float& l = logits[static_cast<size_t>(i)];
      l = l > 0.0f ? l / sp.repetition_penalty : l * sp.repetition_penalty;
    }
  }

  if (sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f) {
    std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
    for (int32_t token : input.output_token_ids) {
      check_id(token, "output");
      ++count[static_cast<size_t>(token)];
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const int64_t c = count[static_cast<size_t>(i)];
      if (c == 0) continue;
      logits[static_cast<size_t>(i)] -=
          sp.presence_penalty + sp.frequency_penalty * static_cast<float>(c);
    }
  }

  for (const auto& [token, bias] : sp.logit_bias) {
    check_id(token, "logit_bias");
    logits[static_cast<size_t>(token)] += bias;
  }

  if (static_cast<int64_t>(input.output_token_ids.size()) < sp.min_tokens) {
    constexpr float kBanned = -std::numeric_limits<float>::infinity();
    for (int32_t token : sp.stop_token_ids) {
      check_id(token, "stop_token_ids");
      logits[static_cast<size_t>(token)] = kBanned;
    }
    if (!sp.ignore_eos) {
      for (int32_t token : input.eos_token_ids) {
        check_id(token, "eos");
        logits[static_cast<size_t>(token)] = kBanned;
      }
    }
  }
}

void apply_allowed_tokens(std::span<float> logits, const std::vector<uint8_t>& allowed) {
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  if (std::find(allowed.begin(), allowed.end(), uint8_t{1}) == allowed.end()) return;
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (i >= allowed.size() || allowed[i] == 0)
      logits[i] = kBanned;
    else
      any_finite = any_finite || logits[i] > kBanned;
  }
  if (any_finite) return;
  for (size_t i = 0; i < logits.size() && i < allowed.size(); ++i) {
    if (allowed[i] != 0) logits[i] = 0.0f;
  }
}

}  // namespace hyserve
