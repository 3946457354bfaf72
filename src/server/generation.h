// The server side of one generation: GenerationSession submits a request's choices to
// the engine and queues their outputs for the connection's executor; ChoiceProcessor turns one
// choice's tokens into text deltas (streaming detokenization, stop strings with the
// hold-back vLLM uses, the reasoning and tool-call parsers, logprob entries).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/forced_tool_calls.h"
#include "server/openai_protocol.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_call_parser.h"

namespace hyserve {

struct ChoiceOptions {
  bool skip_special_tokens = true;
  bool parse_reasoning = false;              // --reasoning-parser
  std::string reasoning_parser = "kimi_k3";  // its name (tokenizer/parser_registry.h)
  bool thinking_enabled = true;
  bool parse_tool_calls = false;             // --enable-auto-tool-choice with tools in the request
  std::string tool_call_parser = "kimi_k3";  // --tool-call-parser
  // tool_choice "required" / a named function: the (constrained) content is the calls.
  ForcedToolMode forced_tools = ForcedToolMode::kNone;
  std::string forced_function;        // kNamed's tool
  int32_t first_tool_call_index = 0;  // forced call ids: calls in earlier assistant turns
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // reported as stop_reason; their text is left out
  bool include_stop_str_in_output = false;
  bool logprobs = false;
  bool tokens_as_ids = false;  // logprob tokens as "token_id:N" (return_tokens_as_token_ids)
};

struct ChoiceDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;
  std::vector<TokenLogprob> logprobs;
  std::vector<int32_t> token_ids;  // the output's new tokens (return_token_ids)
  bool finished = false;
  std::string finish_reason;
  nlohmann::ordered_json stop_reason;  // the stop string or stop token id, else null
  bool stop_string_hit = false;        // the caller aborts the engine request
};

class ChoiceProcessor {
 public:
  ChoiceProcessor(const Tokenizer& tokenizer, ChoiceOptions options);

  // Consumes one engine output of this choice.
  ChoiceDelta feed(const RequestOutput& out);
  int64_t num_tokens() const { return num_tokens_; }
  // Prompt tokens the engine served from the prefix cache for this choice.
  int64_t num_cached_tokens() const { return num_cached_tokens_; }
  bool finished() const { return finished_; }
  // Everything emitted so far, as one message (non-streaming responses).
  const std::string& all_content() const { return all_content_; }
  const std::string& all_reasoning() const { return all_reasoning_; }
  const std::vector<ToolCall>& all_tool_calls() const { return tool_calls_; }
  // The prompt's tokens as logprob entries (completions' echo): `entries` is the engine's
  // prompt_logprobs, the first empty (its entry has a null logprob); each keeps the `top_n`
  // best alternatives.
  std::vector<TokenLogprob> prompt_token_logprobs(
      std::span<const int32_t> prompt, const std::vector<std::optional<OutputToken>>& entries,
      int32_t top_n) const;

 private:
  void emit(std::string_view text, ChoiceDelta& d);
  // A token as logprobs show it: its text, or "token_id:N" (return_tokens_as_token_ids).
  std::string token_text(int32_t id) const;
  // Content after the reasoning parser: through the tool-call parser, forced or not.
  void emit_content(std::string content, ChoiceDelta& d);

  const Tokenizer& tokenizer_;
  ChoiceOptions options_;
  StreamingDetokenizer detok_;
  std::optional<ReasoningStreamParser> reasoning_;
  std::unique_ptr<ToolCallStreamParser> tools_;
  std::optional<ForcedToolCallParser> forced_;
  std::string text_;     // detokenized output so far
  size_t emitted_ = 0;   // bytes of text_ passed on
  size_t max_stop_ = 0;  // longest stop string
  int64_t num_tokens_ = 0;
  int64_t num_cached_tokens_ = 0;
  bool finished_ = false;
  std::string all_content_, all_reasoning_;
  std::vector<ToolCall> tool_calls_;
};

// One HTTP request's engine requests (n choices, or several prompts x n), with a queue
// of their outputs. The engine's callbacks only append to the queue and, when it was
// empty, call `wake` (on the engine thread, under the queue's lock: it should just post
// the work that take()s the outputs to the connection's executor).
class GenerationSession {
 public:
  struct Event {
    int32_t choice = 0;
    RequestOutput output;
  };

  GenerationSession(Engine& engine, std::function<void()> wake);
  // Aborts the unfinished choices; `wake` is never called after this begins.
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // Submits one choice; throws InvalidArgument when the engine refuses it.
  void add(int32_t choice, Request request);
  // Every output queued so far, in arrival order; the next output calls `wake` again.
  std::vector<Event> take();
  // Aborts one choice's engine request (stop string) or all unfinished ones.
  void abort(int32_t choice, const std::string& reason);
  void abort_all();
  size_t num_choices() const { return ids_.size(); }

 private:
  struct Queue {
    std::mutex mu;
    std::vector<Event> events;
    std::function<void()> wake;  // null once the session is gone
    bool woken = false;          // wake was called and take() has not run since
  };
  Engine& engine_;
  std::shared_ptr<Queue> queue_;
  std::vector<std::string> ids_;
  std::vector<bool> done_;
};

}  // namespace hyserve
