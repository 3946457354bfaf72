#include "server/generation.h"

#include <algorithm>
#include <utility>

#include "tokenizer/parser_registry.h"
#include "tokenizer/utf8.h"

namespace hyserve {

ChoiceProcessor::ChoiceProcessor(const Tokenizer& tokenizer, ChoiceOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      // The parsers need their markers, which are special tokens.
      detok_(tokenizer, options_.skip_special_tokens && !options_.parse_reasoning &&
                            !options_.parse_tool_calls) {
  if (options_.parse_reasoning)
    reasoning_.emplace(make_reasoning_parser(options_.reasoning_parser, options_.thinking_enabled));
  if (options_.parse_tool_calls) tools_ = make_tool_call_parser(options_.tool_call_parser);
  if (options_.forced_tools != ForcedToolMode::kNone) {
    forced_.emplace(options_.forced_tools, options_.forced_function,
                    options_.first_tool_call_index);
  }
  for (const std::string& s : options_.stop) max_stop_ = std::max(max_stop_, s.size());
}

std::string ChoiceProcessor::token_text(int32_t id) const {
  if (options_.tokens_as_ids) return "token_id:" + std::to_string(id);
  const int32_t ids[1] = {id};
  return replace_invalid_utf8(tokenizer_.decode_output(ids, false));
}

std::vector<TokenLogprob> ChoiceProcessor::prompt_token_logprobs(
    std::span<const int32_t> prompt, const std::vector<std::optional<OutputToken>>& entries,
    int32_t top_n) const {
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    TokenLogprob t;
    t.token = token_text(prompt[i]);
    if (i < entries.size() && entries[i]) {
      t.logprob = entries[i]->logprob;
      const auto& top = entries[i]->top_logprobs;
      for (size_t k = 0; k < top.size() && k < static_cast<size_t>(top_n); ++k)
        t.top_logprobs.push_back({token_text(top[k].token), top[k].logprob});
    }
    out.push_back(std::move(t));
  }
  return out;
}

void ChoiceProcessor::emit(std::string_view text, ChoiceDelta& d) {
  std::string content(text);
  if (reasoning_) {
    const ReasoningSplit r = reasoning_->feed(content);
    d.reasoning += r.reasoning;
    all_reasoning_ += r.reasoning;
    content = r.content;
  }
  emit_content(std::move(content), d);
}

void ChoiceProcessor::emit_content(std::string content, ChoiceDelta& d) {
  if (forced_) {
    for (ToolCallDelta& c : forced_->feed(content)) d.tool_calls.push_back(std::move(c));
    return;
  }
  if (tools_) {
    ToolParserDelta t = tools_->feed(content);
    content = t.content;
    for (ToolCallDelta& c : t.tool_calls) d.tool_calls.push_back(std::move(c));
  }
  d.content += content;
  all_content_ += content;
}

ChoiceDelta ChoiceProcessor::feed(const RequestOutput& out) {
  ChoiceDelta d;
  if (finished_) return d;
  num_cached_tokens_ = std::max(num_cached_tokens_, out.num_cached_tokens);
  // The token that stopped the request, EOS or a stop_token_ids entry, ends the output
  // without its text (as vLLM does, unless include_stop_str_in_output). That matters when
  // the parsers keep special tokens: <|im_end|> is not content. Only a stop_token_ids entry
  // is reported as the stop_reason.
  const bool stop_terminated = out.finished && out.stop_token_id.has_value();
  const bool by_stop_token =
      stop_terminated && std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(),
                                   *out.stop_token_id) != options_.stop_token_ids.end();
  for (size_t i = 0; i < out.new_tokens.size(); ++i) {
    const OutputToken& t = out.new_tokens[i];
    ++num_tokens_;
    d.token_ids.push_back(t.token);
    const bool last = i + 1 == out.new_tokens.size();
    if (!(last && stop_terminated && !options_.include_stop_str_in_output))
      text_ += detok_.push(t.token);
    if (options_.logprobs) {
      TokenLogprob lp;
      lp.token = token_text(t.token);
      lp.logprob = t.logprob;
      for (const auto& top : t.top_logprobs)
        lp.top_logprobs.push_back({token_text(top.token), top.logprob});
      d.logprobs.push_back(std::move(lp));
    }
  }
  if (out.finished) text_ += detok_.finish();

  // Stop strings: search the not-yet-emitted text (and the tail that may start one).
  size_t stop_at = std::string::npos, stop_len = 0;
  if (max_stop_ > 0) {
    const size_t from = emitted_ >= max_stop_ ? emitted_ - max_stop_ + 1 : 0;
    for (const std::string& s : options_.stop) {
      const size_t p = text_.find(s, from);
      if (p != std::string::npos && p + s.size() > emitted_ &&
          (stop_at == std::string::npos || p < stop_at)) {
        stop_at = p;
        stop_len = s.size();
        d.stop_reason = s;
      }
    }
  }
  if (stop_at != std::string::npos) {
    const size_t end = options_.include_stop_str_in_output ? stop_at + stop_len : stop_at;
    if (end > emitted_) emit(std::string_view(text_).substr(emitted_, end - emitted_), d);
    emitted_ = std::max(emitted_, end);
    d.finished = true;
    d.finish_reason = "stop";
    d.stop_string_hit = true;
  } else {
    // Hold back what could still become a stop string, unless this is the end.
    size_t end = text_.size();
    if (!out.finished && max_stop_ > 1)
      end = text_.size() > max_stop_ - 1 ? text_.size() - (max_stop_ - 1) : 0;
    // Never split a UTF-8 character while holding back.
    while (end > emitted_ && end < text_.size() &&
           (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80)
      --end;
    if (end > emitted_) emit(std::string_view(text_).substr(emitted_, end - emitted_), d);
    emitted_ = std::max(emitted_, end);
    if (out.finished) {
      d.finished = true;
      d.finish_reason = out.finish_reason;
      if (by_stop_token) d.stop_reason = *out.stop_token_id;
    }
  }
  if (d.finished) {
    if (reasoning_) {
      const ReasoningSplit r = reasoning_->finish();
      d.reasoning += r.reasoning;
      all_reasoning_ += r.reasoning;
      emit_content(r.content, d);
    }
    if (tools_) {
      ToolParserDelta t = tools_->finish();
      d.content += t.content;
      all_content_ += t.content;
      for (ToolCallDelta& c : t.tool_calls) d.tool_calls.push_back(std::move(c));
      // The whole message's calls, for non-streaming responses.
      tool_calls_ = tools_->calls();
    }
    if (forced_) tool_calls_ = forced_->calls();
    // vLLM (and OpenAI): "tool_calls" for calls the model chose or "required" forced, "stop"
    // for a named function.
    if (!tool_calls_.empty() && d.finish_reason == "stop" &&
        options_.forced_tools != ForcedToolMode::kNamed)
      d.finish_reason = "tool_calls";
    finished_ = true;
  }
  return d;
}

GenerationSession::GenerationSession(Engine& engine, std::function<void()> wake)
    : engine_(engine), queue_(std::make_shared<Queue>()) {
  queue_->wake = std::move(wake);
}

GenerationSession::~GenerationSession() {
  {
    std::lock_guard<std::mutex> lk(queue_->mu);
    queue_->wake = nullptr;
    queue_->events.clear();
  }
  abort_all();
}

void GenerationSession::add(int32_t choice, Request request) {
  const std::string id = request.id;
  std::weak_ptr<Queue> weak = queue_;
  engine_.add_request(std::move(request), [weak, choice](const RequestOutput& out) {
    const std::shared_ptr<Queue> q = weak.lock();
    if (!q) return;
    std::lock_guard<std::mutex> lk(q->mu);
    if (!q->wake) return;
    q->events.push_back({choice, out});
    if (!std::exchange(q->woken, true)) q->wake();
  });
  if (static_cast<size_t>(choice) >= ids_.size()) {
    ids_.resize(choice + 1);
    done_.resize(choice + 1, false);
  }
  ids_[choice] = id;
}

std::vector<GenerationSession::Event> GenerationSession::take() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lk(queue_->mu);
    queue_->woken = false;
    events.swap(queue_->events);
  }
  for (const Event& e : events) {
    if (e.output.finished && static_cast<size_t>(e.choice) < done_.size()) done_[e.choice] = true;
  }
  return events;
}

void GenerationSession::abort(int32_t choice, const std::string& reason) {
  if (static_cast<size_t>(choice) < ids_.size() && !done_[choice]) {
    engine_.abort_request(ids_[choice], reason);
  }
}

void GenerationSession::abort_all() {
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (!done_[i] && !ids_[i].empty()) engine_.abort_request(ids_[i]);
  }
}

}  // namespace hyserve
