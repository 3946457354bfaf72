// One HTTP generation request answered from the engine's outputs: run_generation submits
// its choices and returns; each batch of outputs the engine queues wakes the connection's
// strand, where GenerationRun (generation_run.cpp) detokenizes, parses and formats them
// and writes the SSE chunks, or the whole body once every choice is done. No thread waits
// for a stream; a client that disconnects has its engine requests aborted at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/generation.h"
#include "server/http_response.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace hyserve {

// What one HTTP generation request asks for, whichever route it came from.
struct Generation {
  bool chat = true;
  ResponseMeta meta;
  // The engine request ids are "<engine_id>-<choice>": meta.id, plus a random suffix when
  // the client chose the id (X-Request-Id), so that two requests sharing one never collide.
  std::string engine_id;
  std::string role = "assistant";             // chat: the response message's role
  std::vector<std::vector<int32_t>> prompts;  // one per prompt
  // With echo: completions, each prompt's text; chat, the last message's content (when its
  // role is the response's), which the response content starts with.
  std::vector<std::string> echo;
  int32_t n = 1;
  SamplingParams sampling;
  int32_t priority = 0;
  std::optional<std::string> cache_salt;
  std::string lora_name;  // the LoRA adapter `model` named; empty: the base model
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // usage on every streamed chunk
  bool return_token_ids = false;
  bool detokenize = true;  // false under --skip-tokenizer-init
  // Completions: echo with logprobs puts the prompt's tokens first in `logprobs`, the first
  // with a null logprob (vLLM, OpenAI); score_prompt: echo with max_tokens 0, the engine's
  // one sampled token is left out of the response.
  bool echo_logprobs = false;
  bool score_prompt = false;
  ChoiceOptions choice;
};

// Submits g's choices and answers the request through `w` as their outputs arrive (the
// streamed events or the whole response). Throws InvalidArgument, answering nothing, when
// the engine refuses a choice. The engine, tokenizer and metrics must outlive the HTTP
// server whose writer this is.
void run_generation(Engine& engine, const Tokenizer& tokenizer, ServerMetrics& metrics,
                    Generation g, HttpResponseWriter& w);

}  // namespace hyserve
