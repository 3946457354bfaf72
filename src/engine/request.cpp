#include "engine/request.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

bool is_finished(RequestStatus status) {
  return status == RequestStatus::kFinishedStopped || status == RequestStatus::kFinishedLength ||
         status == RequestStatus::kFinishedAborted;
}

const char* to_string(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting:
      return "waiting";
    case RequestStatus::kRunning:
      return "running";
    case RequestStatus::kPreempted:
      return "preempted";
    case RequestStatus::kFinishedStopped:
      return "stop";
    case RequestStatus::kFinishedLength:
      return "length";
    case RequestStatus::kFinishedAborted:
      return "abort";
  }
  return "unknown";
}

int32_t Request::token(int64_t pos) const {
  CHECK(pos >= 0 && pos < num_tokens(), "request ", id, ": position ", pos, " outside [0, ",
        num_tokens(), ")");
  return pos < num_prompt_tokens() ? prompt_token_ids[pos]
                                   : output_token_ids[pos - num_prompt_tokens()];
}

std::vector<int32_t> Request::tokens(int64_t begin, int64_t end) const {
  CHECK(begin >= 0 && begin <= end && end <= num_tokens(), "request ", id, ": tokens [", begin,
        ", ", end, ") outside [0, ", num_tokens(), ")");
  std::vector<int32_t> out;
  out.reserve(end - begin);
  for (int64_t p = begin; p < end; ++p) out.push_back(token(p));
  return out;
}

std::vector<int32_t> Request::scheduled_tokens(int64_t begin, int64_t end) const {
  CHECK(begin >= 0 && begin <= end && end <= num_scheduled_tokens(), "request ", id, ": tokens [",
        begin, ", ", end, ") outside [0, ", num_scheduled_tokens(), ")");
  std::vector<int32_t> out = tokens(begin, std::min(end, std::max(begin, num_tokens())));
  out.resize(static_cast<size_t>(end - begin), kPlaceholderToken);
  return out;
}

void validate_request(std::span<const int32_t> prompt, const SamplingParams& sampling,
                      const RequestLimits& limits) {
  sampling.validate(limits.vocab_size, limits.max_model_len);
  const auto num_prompt = static_cast<int64_t>(prompt.size());
  if (num_prompt == 0) throw InvalidRequest("prompt", "The prompt is empty.");
  for (int32_t token : prompt) {
    if (token < 0 || token >= limits.vocab_size) {
      throw InvalidRequest("prompt", str_cat("Token id ", token, " is out of vocabulary [0, ",
                                             limits.vocab_size, ")."));
    }
  }
  const int64_t max_len = limits.max_model_len;
  if (num_prompt >= max_len) {
    throw InvalidRequest("messages",
                         str_cat("This model's maximum context length is ", max_len,
                                 " tokens. However, your request has ", num_prompt,
                                 " input tokens. Please reduce the length of the input messages."));
  }
  const auto& max_tokens = sampling.max_tokens;
  if (max_tokens && num_prompt + *max_tokens > max_len) {
    throw InvalidRequest(
        "max_tokens", str_cat("'max_tokens' or 'max_completion_tokens' is too large: ", *max_tokens,
                              ". This model's maximum context length is ", max_len,
                              " tokens and your request has ", num_prompt, " input tokens (",
                              *max_tokens, " > ", max_len, " - ", num_prompt, ")."));
  }
}

}  // namespace hyserve
