#include "server/generation_run.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/log.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

// Streams or collects the outputs of a generation and answers the HTTP request. Lives on
// the connection's strand: the engine's callbacks only queue outputs (GenerationSession)
// and post drain(); self_ keeps the run alive until it has answered or the client has gone.
class GenerationRun : public std::enable_shared_from_this<GenerationRun> {
 public:
  GenerationRun(Engine& engine, const Tokenizer& tokenizer, ServerMetrics& metrics, Generation g,
                HttpResponseWriter w)
      : engine_(engine),
        tokenizer_(tokenizer),
        metrics_(metrics),
        g_(std::move(g)),
        w_(std::move(w)) {}

  void start() {
    const int32_t num_choices = static_cast<int32_t>(g_.prompts.size()) * g_.n;
    for (int32_t c = 0; c < num_choices; ++c) processors_.emplace_back(tokenizer_, g_.choice);
    num_tokens_.assign(num_choices, 0);
    role_sent_.assign(num_choices, false);
    logprobs_.resize(num_choices);
    token_ids_.resize(num_choices);
    prompt_logprobs_.assign(num_choices, nullptr);
    echo_logprobs_.resize(num_choices);
    echo_sent_.assign(num_choices, false);
    prompt_ids_sent_.assign(num_choices, false);
    stream_offsets_.assign(num_choices, 0);
    finish_.resize(num_choices);
    stop_reason_.resize(num_choices);
    // The engine thread only posts a drain (weakly: a run that is gone is not revived).
    session_.emplace(engine_, [w = w_, weak = weak_from_this()]() mutable {
      w.post([weak] {
        if (auto run = weak.lock()) run->drain();
      });
    });
    for (int32_t c = 0; c < num_choices; ++c) {
      Request r;
      r.id = g_.engine_id + "-" + std::to_string(c);
      r.prompt_token_ids = g_.prompts[c / g_.n];
      r.sampling_params = g_.sampling;
      if (r.sampling_params.seed && c % g_.n > 0) *r.sampling_params.seed += c % g_.n;
      r.priority = g_.priority;
      r.cache_salt = g_.cache_salt.value_or("");
      // An adapter unloaded since the route looked it up is gone: as an unknown model.
      if (!g_.lora_name.empty() &&
          (engine_.loras() == nullptr || !engine_.loras()->attach(g_.lora_name, r))) {
        throw InvalidRequest("model", "The model `" + g_.lora_name + "` does not exist.");
      }
      session_->add(c, std::move(r));  // InvalidArgument -> 400 by the caller
    }
    if (g_.stream) {
      HttpHeaders headers;
      headers.add("Cache-Control", "no-cache");
      if (!w_.start_stream(200, "text/event-stream", headers)) {
        session_->abort_all();
        return;
      }
    }
    self_ = shared_from_this();
    w_.on_disconnect([weak = weak_from_this()] {
      if (auto run = weak.lock()) run->cancel();
    });
  }

 private:
  // On the strand: handles every output queued so far; answers once all choices are done.
  void drain() {
    if (!self_) return;
    try {
      for (const GenerationSession::Event& e : session_->take()) {
        if (g_.stream) {
          if (!stream_event(e)) return cancel();
        } else {
          process(e);
        }
      }
      if (num_finished_ < processors_.size()) return;
      if (g_.stream) {
        end_stream();
      } else {
        send_response();
      }
    } catch (const std::exception& e) {
      // As the server answers a handler that throws: 500, or a stream cut short.
      log::error("{} failed: {}", g_.meta.id, e.what());
      session_->abort_all();
      if (w_.streaming()) {
        w_.abort_stream();
      } else if (!w_.responded()) {
        w_.send_error(500, std::string("Internal server error: ") + e.what());
      }
    }
    self_.reset();
  }

  // The client is gone: abort what is unfinished, answer nothing more.
  void cancel() {
    if (session_) session_->abort_all();
    self_.reset();
  }

  // Processes one engine output; returns its delta.
  ChoiceDelta process(const GenerationSession::Event& e) {
    const int32_t c = e.choice;
    ChoiceProcessor& p = processors_[c];
    if (p.finished()) return {};
    num_tokens_[c] += std::ssize(e.output.new_tokens);
    if (!e.output.prompt_logprobs.empty() && prompt_logprobs_[c].is_null()) {
      prompt_logprobs_[c] = prompt_logprobs_json(e.output.prompt_logprobs);
      if (g_.echo_logprobs) {
        echo_logprobs_[c] = p.prompt_token_logprobs(g_.prompts[c / g_.n], e.output.prompt_logprobs,
                                                    g_.sampling.logprobs.value_or(0));
      }
    }
    ChoiceDelta d = p.feed(e.output);
    if (d.stop_string_hit) session_->abort(c, "stop");
    if (g_.score_prompt) {
      d.content.clear();
      d.logprobs.clear();
      d.token_ids.clear();
      if (d.finished) {
        d.finish_reason = "length";  // max_tokens 0 reached
        d.stop_reason = nullptr;
      }
    }
    for (auto& lp : d.logprobs) logprobs_[c].push_back(lp);
    token_ids_[c].insert(token_ids_[c].end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finished) {
      finish_[c] = d.finish_reason;
      stop_reason_[c] = d.stop_reason;
      ++num_finished_;
      if (num_finished_ == processors_.size()) {
        metrics_.generation_request(g_.n,
                                    *std::max_element(num_tokens_.begin(), num_tokens_.end()));
      }
    }
    return d;
  }

  // Output tokens of choice c the response counts (none when scoring the prompt).
  int64_t num_output_tokens(size_t c) const {
    return g_.score_prompt ? 0 : processors_[c].num_tokens();
  }

  ordered_json prompt_logprobs_json(const std::vector<std::optional<OutputToken>>& entries) const {
    ordered_json out = ordered_json::array();
    for (const auto& e : entries) {
      if (!e) {
        out.push_back(nullptr);
        continue;
      }
      ordered_json pos = ordered_json::object();
      auto add = [&](int32_t token, float logprob, int64_t rank) {
        const std::string key = std::to_string(token);
        if (pos.contains(key)) return;
        const int32_t ids[1] = {token};
        pos[key] = {{"logprob", logprob},
                    {"rank", rank},
                    {"decoded_token", g_.detokenize ? ordered_json(replace_invalid_utf8(
                                                          tokenizer_.decode_output(ids, false)))
                                                    : ordered_json(nullptr)}};
      };
      int64_t rank = 1;
      for (const LogprobEntry& t : e->top_logprobs) add(t.token, t.logprob, rank++);
      add(e->token, e->logprob, e->rank);
      out.push_back(std::move(pos));
    }
    return out;
  }

  // Adds prompt_logprobs to each choice of a response body, when asked.
  void add_prompt_logprobs(ordered_json& body) const {
    if (!g_.sampling.prompt_logprobs) return;
    for (size_t c = 0; c < prompt_logprobs_.size() && c < body["choices"].size(); ++c)
      body["choices"][c]["prompt_logprobs"] = prompt_logprobs_[c];
  }

  // vLLM's return_token_ids: each choice's prompt and output ids; chat puts the prompt's
  // at the top level.
  void add_token_ids(ordered_json& body) const {
    if (!g_.return_token_ids) return;
    if (g_.chat) body["prompt_token_ids"] = g_.prompts[0];
    for (size_t c = 0; c < token_ids_.size() && c < body["choices"].size(); ++c) {
      if (!g_.chat) body["choices"][c]["prompt_token_ids"] = g_.prompts[c / g_.n];
      body["choices"][c]["token_ids"] = token_ids_[c];
    }
  }

  // One choice's usage so far (stream_options.continuous_usage_stats).
  Usage choice_usage(size_t c) const {
    Usage u;
    u.prompt_tokens = static_cast<int64_t>(g_.prompts[c / g_.n].size());
    u.completion_tokens = num_output_tokens(c);
    u.cached_tokens = processors_[c].num_cached_tokens();
    return u;
  }

  Usage usage() const {
    Usage u;
    for (const auto& p : g_.prompts) u.prompt_tokens += static_cast<int64_t>(p.size());
    for (size_t c = 0; c < processors_.size(); ++c) u.completion_tokens += num_output_tokens(c);
    // Cached prompt tokens: each prompt once (its n choices share the prompt).
    for (size_t prompt = 0; prompt < g_.prompts.size(); ++prompt) {
      int64_t cached = 0;
      for (int32_t c = 0; c < g_.n; ++c)
        cached = std::max(cached, processors_[prompt * g_.n + c].num_cached_tokens());
      u.cached_tokens += cached;
    }
    return u;
  }

  void send_response() {
    const size_t num_choices = processors_.size();
    if (g_.chat) {
      std::vector<ChatChoice> choices;
      for (size_t c = 0; c < num_choices; ++c) {
        const ChoiceProcessor& p = processors_[c];
        ChatChoice ch;
        ch.index = static_cast<int32_t>(c);
        ch.role = g_.role;
        ch.content = (g_.echo.empty() ? std::string() : g_.echo[0]) + p.all_content();
        if (g_.choice.parse_reasoning && !p.all_reasoning().empty())
          ch.reasoning = p.all_reasoning();
        ch.tool_calls = p.all_tool_calls();
        if (!ch.tool_calls.empty() && ch.content->empty()) ch.content.reset();
        if (g_.choice.logprobs) ch.logprobs = logprobs_[c];
        ch.finish_reason = finish_[c];
        ch.stop_reason = stop_reason_[c];
        choices.push_back(std::move(ch));
      }
      ordered_json body = chat_completion_json(g_.meta, choices, usage());
      add_prompt_logprobs(body);
      add_token_ids(body);
      w_.send(200, "application/json", dump_json(body));
    } else {
      std::vector<CompletionChoice> choices;
      for (size_t c = 0; c < num_choices; ++c) {
        CompletionChoice ch;
        ch.index = static_cast<int32_t>(c);
        const std::string& echo = g_.echo.empty() ? std::string() : g_.echo[c / g_.n];
        ch.text = echo + (g_.score_prompt ? std::string() : processors_[c].all_content());
        if (g_.choice.logprobs) {
          // text_offset: into `text`, echoed prompt included.
          ch.logprobs = echo_logprobs_[c];
          ch.logprobs->insert(ch.logprobs->end(), logprobs_[c].begin(), logprobs_[c].end());
        }
        ch.text_offset = 0;
        ch.finish_reason = finish_[c];
        ch.stop_reason = stop_reason_[c];
        choices.push_back(std::move(ch));
      }
      ordered_json body = completion_json(g_.meta, choices, usage());
      add_prompt_logprobs(body);
      add_token_ids(body);
      w_.send(200, "application/json", dump_json(body));
    }
  }

  // Writes one SSE event; false once the client is gone.
  bool write(const ordered_json& j) { return w_.write_chunk(sse_event(j)); }
  // A chunk of one choice, with that choice's usage so far when asked (vLLM's
  // continuous_usage_stats); the role and echo chunks count no output yet.
  bool write_choice(ordered_json j, size_t c, bool before_output) {
    if (g_.continuous_usage) {
      Usage u = choice_usage(c);
      if (before_output) u.completion_tokens = 0;
      j["usage"] = usage_json(u);
    }
    return write(j);
  }
  // A completion chunk's logprobs continue the choice's text_offset.
  void set_offsets(CompletionChunkChoice& ch) {
    ch.text_offset = stream_offsets_[ch.index];
    if (!ch.logprobs) return;
    for (const TokenLogprob& t : *ch.logprobs)
      stream_offsets_[ch.index] += num_code_points(t.token);
  }

  // Streams the chunks of one engine output; false once the client is gone.
  bool stream_event(const GenerationSession::Event& e) {
    const int32_t c = e.choice;
    if (processors_[c].finished()) return true;
    ChoiceDelta d = process(e);
    const bool send_ids = g_.return_token_ids && !d.token_ids.empty();
    if (g_.chat) {
      if (!role_sent_[c]) {
        role_sent_[c] = true;
        ordered_json role = chat_role_chunk_json(g_.meta, c, g_.role);
        if (g_.return_token_ids) role["prompt_token_ids"] = g_.prompts[0];
        if (!write_choice(std::move(role), c, true)) return false;
        if (!g_.echo.empty() && !g_.echo[0].empty()) {
          ChatChunkChoice ch;
          ch.index = c;
          ch.delta.content = g_.echo[0];
          if (!write_choice(chat_chunk_json(g_.meta, {ch}), c, true)) return false;
        }
      }
      const bool has_delta = !d.content.empty() || !d.reasoning.empty() || !d.tool_calls.empty() ||
                             !d.logprobs.empty() || send_ids;
      if (!has_delta && !d.finished) return true;
      ChatChunkChoice ch;
      ch.index = c;
      if (!d.content.empty()) ch.delta.content = d.content;
      if (!d.reasoning.empty()) ch.delta.reasoning = d.reasoning;
      ch.delta.tool_calls = d.tool_calls;
      if (g_.choice.logprobs && !d.logprobs.empty()) ch.logprobs = d.logprobs;
      if (d.finished) {
        ch.finish_reason = d.finish_reason;
        ch.stop_reason = d.stop_reason;
      }
      ordered_json chunk = chat_chunk_json(g_.meta, {ch});
      if (g_.return_token_ids) chunk["choices"][0]["token_ids"] = d.token_ids;
      return write_choice(std::move(chunk), c, false);
    }
    // Echo: the prompt first, once its logprobs (with the first output) are known.
    if (!g_.echo.empty() && !echo_sent_[c]) {
      echo_sent_[c] = true;
      CompletionChunkChoice ch;
      ch.index = c;
      ch.text = g_.echo[c / g_.n];
      if (g_.echo_logprobs) ch.logprobs = echo_logprobs_[c];
      set_offsets(ch);
      if (!write_choice(completion_chunk_json(g_.meta, {ch}), c, true)) return false;
    }
    if (d.content.empty() && d.logprobs.empty() && !d.finished && !send_ids) return true;
    CompletionChunkChoice ch;
    ch.index = c;
    ch.text = d.content;
    if (g_.choice.logprobs && !d.logprobs.empty()) ch.logprobs = d.logprobs;
    set_offsets(ch);
    if (d.finished) {
      ch.finish_reason = d.finish_reason;
      ch.stop_reason = d.stop_reason;
    }
    ordered_json chunk = completion_chunk_json(g_.meta, {ch});
    if (g_.return_token_ids) {
      if (!prompt_ids_sent_[c]) chunk["choices"][0]["prompt_token_ids"] = g_.prompts[c / g_.n];
      prompt_ids_sent_[c] = true;
      chunk["choices"][0]["token_ids"] = d.token_ids;
    }
    return write_choice(std::move(chunk), c, false);
  }

  // Every choice is done: the usage chunk when asked, [DONE], the end of the body.
  void end_stream() {
    if (g_.include_usage) {
      const ordered_json u = g_.chat ? chat_usage_chunk_json(g_.meta, usage())
                                     : completion_usage_chunk_json(g_.meta, usage());
      if (!write(u)) return;
    }
    if (w_.write_chunk(kSseDone)) w_.end_stream();
  }

  Engine& engine_;
  const Tokenizer& tokenizer_;
  ServerMetrics& metrics_;
  Generation g_;
  HttpResponseWriter w_;
  std::optional<GenerationSession> session_;
  std::shared_ptr<GenerationRun> self_;  // set while answering
  std::vector<ChoiceProcessor> processors_;
  std::vector<int64_t> num_tokens_;  // per choice, tokens the engine produced
  std::vector<bool> role_sent_;
  std::vector<std::vector<TokenLogprob>> logprobs_;
  std::vector<std::vector<int32_t>> token_ids_;           // per choice, every output token
  std::vector<ordered_json> prompt_logprobs_;             // per choice, when asked
  std::vector<std::vector<TokenLogprob>> echo_logprobs_;  // per choice, the prompt's (echo)
  std::vector<bool> echo_sent_;                           // streaming: echo chunk written
  std::vector<bool> prompt_ids_sent_;    // streaming completions: prompt_token_ids written
  std::vector<int64_t> stream_offsets_;  // streaming: text_offset of the next logprob token
  std::vector<std::string> finish_;
  std::vector<ordered_json> stop_reason_;
  size_t num_finished_ = 0;
};

}  // namespace

void run_generation(Engine& engine, const Tokenizer& tokenizer, ServerMetrics& metrics,
                    Generation g, HttpResponseWriter& w) {
  std::make_shared<GenerationRun>(engine, tokenizer, metrics, std::move(g), w)->start();
}

}  // namespace hyserve
