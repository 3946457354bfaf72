// One benchmark request in OpenAI's streaming protocol, without the transport: the JSON
// body to send (/v1/completions or /v1/chat/completions, `stream` with usage asked for), and
// the reading of the SSE events that come back into a RequestOutcome, with vLLM's
// timestamps: TTFT at the first chunk carrying output (text, content, reasoning or tool-call
// deltas, or token ids; the chat role chunk and the finish-only chunk carry none), one ITL per
// later such chunk, output tokens from the final usage chunk (else the number of chunks carrying
// output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/bench_dataset.h"
#include "client/bench_metrics.h"

namespace hyserve::client {

struct OpenAIRequestOptions {
  bool chat = false;  // /v1/chat/completions: the prompt as one user message
  std::string model;
  bool ignore_eos = false;  // vLLM's extension: generate exactly max_tokens
  // vLLM's `return_token_ids`: every chunk carries its token ids, so a token whose text is
  // held back (part of a UTF-8 character, a stop-string candidate) still has its chunk and
  // its ITL. Off by default: a server that does not know the field may refuse it.
  bool return_token_ids = false;
};

// The body of the streaming request for `request`.
std::string openai_request_body(const BenchRequest& request, const OpenAIRequestOptions& options);

// The error message of an OpenAI error body ({"error": {"message": ...}}), else the body's
// start.
std::string error_message_of(std::string_view body);

class StreamAccumulator {
 public:
  // dataset_prompt_len: the prompt length when the server reports no usage.
  explicit StreamAccumulator(int64_t dataset_prompt_len) : prompt_len_(dataset_prompt_len) {}

  // One event's data, received t_s seconds after the request was sent. Events after
  // `data: [DONE]` or an error are ignored.
  void on_event(std::string_view data, double t_s);

  // True once [DONE] or an error event was read.
  bool ended() const { return done_ || !error_.empty(); }

  // The outcome of a stream that ended end_s after the send. transport_error: why the
  // connection failed, empty when it did not.
  RequestOutcome finish(double end_s, const std::string& transport_error) const;

 private:
  int64_t prompt_len_;
  std::optional<int64_t> usage_prompt_tokens_;
  std::optional<int64_t> usage_completion_tokens_;
  int64_t num_output_chunks_ = 0;
  double first_s_ = 0, last_s_ = 0;
  std::vector<double> itl_s_;
  std::vector<int32_t> token_ids_;
  bool done_ = false;
  std::string error_;
};

}  // namespace hyserve::client
