// Request: one generation request as the scheduler sees it. Its tokens are the prompt
// followed by the outputs sampled so far; num_computed_tokens says how many of them have their
// KV / KDA state in the cache. Scheduling only ever moves num_computed_tokens towards
// num_tokens(): a prefill chunk, a decode step, a prefix-cache hit and a recompute after
// preemption are all the same rule (vLLM v1).
//
//   tokens:  [ prompt .................. | outputs ..... | placeholders ]
//            [ computed ..........) next step computes from here; when it reaches
//                                         num_scheduled_tokens() the step samples one more
//
// schedule() advances num_computed_tokens when it schedules a step, and a step that samples
// adds an output placeholder: the token it will sample, unknown until the step's results
// are applied (update_from_output replaces it with the token). Without asynchronous
// scheduling every placeholder is resolved before the next schedule(); with it, the next
// step may already be scheduled on top of one (its input token is then read on the device
// from the step that samples it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sampling_params.h"

namespace hyserve {

struct LoraAdapter;

enum class RequestStatus {
  kWaiting,          // queued, never run
  kRunning,          // holds blocks, scheduled every step it gets budget
  kPreempted,        // blocks freed; queued again, recomputes prompt + outputs on resume
  kFinishedStopped,  // EOS, a stop token id or a stop string
  kFinishedLength,   // max_tokens or max_model_len reached
  kFinishedAborted,  // cancelled by the client
};

bool is_finished(RequestStatus status);
// "waiting", "running", "preempted", "stop", "length", "abort" (OpenAI finish_reason style).
const char* to_string(RequestStatus status);

// A scheduled input whose token is not known yet (Request::num_output_placeholders).
inline constexpr int32_t kPlaceholderToken = -1;

struct Request {
  std::string id{};
  std::vector<int32_t> prompt_token_ids{};
  SamplingParams sampling_params{};
  int32_t priority = 0;       // lower is more urgent (priority policy only)
  double arrival_time = 0.0;  // seconds; breaks priority ties, earlier first
  std::string cache_salt{};   // isolates this request's prefix-cache entries
  // LoRA (issue 48): the adapter it runs with (null: the base model), held until it
  // finishes, and that adapter's identity in the prefix cache (LoraEntry::key).
  std::shared_ptr<const LoraAdapter> lora{};
  std::string lora_key{};

  RequestStatus status = RequestStatus::kWaiting;
  std::vector<int32_t> output_token_ids{};
  int64_t num_computed_tokens = 0;       // tokens whose KV / KDA state is in the cache
  int64_t num_cached_prompt_tokens = 0;  // prefix-cache hit at first admission
  int64_t num_preemptions = 0;
  int64_t num_output_placeholders = 0;  // outputs being sampled by scheduled steps
  int32_t lora_slot = -1;  // its adapter's LoRA slot while running (LoraSlots), else -1
  std::optional<int32_t> stop_token_id{};  // the stop_token_ids entry that finished it, if any
  // Speculative decoding: the drafts proposed for the tokens after the last one, for the next
  // schedule() (which verifies those it has room for, then clears them).
  std::vector<int32_t> spec_token_ids{};

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt_token_ids.size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_token_ids.size()); }
  int64_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  // Known tokens and placeholders: the positions scheduled steps have inputs for.
  int64_t num_scheduled_tokens() const { return num_tokens() + num_output_placeholders; }
  // The index among the outputs of the next token a step samples (placeholders included:
  // the seed's draw index, min_tokens).
  int64_t num_outputs_with_placeholders() const {
    return num_output_tokens() + num_output_placeholders;
  }
  // Token at sequence position `pos` < num_tokens() (prompt, then outputs).
  int32_t token(int64_t pos) const;
  // Tokens [begin, end) of prompt + outputs.
  std::vector<int32_t> tokens(int64_t begin, int64_t end) const;
  // Tokens [begin, end) of prompt + outputs + placeholders, kPlaceholderToken for each
  // placeholder.
  std::vector<int32_t> scheduled_tokens(int64_t begin, int64_t end) const;
  bool is_finished() const { return hyserve::is_finished(status); }
};

// What a request may ask of this engine.
struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;  // prompt + outputs at most
};

// The one validation of a request's prompt and sampling parameters, for the server (a 400
// naming the field) and the engine alike: throws InvalidRequest (util/error.h) naming the
// field when the request can never run (vLLM's messages for the lengths).
void validate_request(std::span<const int32_t> prompt, const SamplingParams& sampling,
                      const RequestLimits& limits);

}  // namespace hyserve
