#include "engine/request.h"

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

}  // namespace hyserve
