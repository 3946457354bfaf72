#include "server/openai_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "guided/json_schema.h"
#include "guided/token_constraint.h"
#include "server/generation.h"
#include "server/openai_protocol.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(50);

void send_json(HttpResponseWriter& w, int status, const std::string& body) {
  w.send(status, "application/json", body);
}

void send_request_error(HttpResponseWriter& w, const RequestError& e) {
  send_json(w, e.status(), error_body(e));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What one HTTP generation request asks for, whichever route it came from.
struct Generation {
  bool chat = true;
  ResponseMeta meta;
  std::vector<std::vector<int32_t>> prompts;  // one per prompt
  std::vector<std::string> echo;              // completions with echo: the prompt text
  int32_t n = 1;
  SamplingParams sampling;
  int32_t priority = 0;
  std::optional<std::string> cache_salt;
  bool stream = false;
  bool include_usage = false;
  ChoiceOptions choice;
};

}  // namespace

OpenAIServer::OpenAIServer(OpenAIServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                           ChatTemplates templates, SpecialTokens special_tokens)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      templates_(std::move(templates)),
      special_tokens_(std::move(special_tokens)),
      vocab_(std::make_shared<const VocabTrie>(
          VocabTrie::from_tokenizer(tokenizer, engine.model().config().vocab_size))),
      metrics_(options_.served_model_name),
      http_([&] {
        HttpServerOptions o;
        o.host = options_.host;
        o.port = options_.port;
        return o;
      }()),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  http_.route("POST", "/v1/chat/completions",
              [this](const HttpRequest& r, HttpResponseWriter& w) { chat_completions(r, w); });
  http_.route("POST", "/v1/completions",
              [this](const HttpRequest& r, HttpResponseWriter& w) { completions(r, w); });
  http_.route("GET", "/v1/models",
              [this](const HttpRequest& r, HttpResponseWriter& w) { models(r, w); });
  http_.route("POST", "/tokenize",
              [this](const HttpRequest& r, HttpResponseWriter& w) { tokenize(r, w); });
  http_.route("POST", "/detokenize",
              [this](const HttpRequest& r, HttpResponseWriter& w) { detokenize(r, w); });
  http_.route("GET", "/health", [this](const HttpRequest&, HttpResponseWriter& w) {
    if (engine_.alive()) {
      w.send(200, "text/plain", "");
    } else {
      send_json(w, 503, error_body(503, "the engine is dead"));
    }
  });
  http_.route("GET", "/metrics", [this](const HttpRequest&, HttpResponseWriter& w) {
    w.send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(engine_.stats()));
  });
}

OpenAIServer::~OpenAIServer() {
  stop();
}

void OpenAIServer::start() {
  http_.start();
}
void OpenAIServer::stop() {
  http_.stop();
}
void OpenAIServer::wait() {
  http_.wait();
}

bool OpenAIServer::authorized(const HttpRequest& req, HttpResponseWriter& w) const {
  if (options_.api_key.empty()) return true;
  const std::string auth = req.headers.get_or("Authorization", "");
  if (auth == "Bearer " + options_.api_key) return true;
  send_json(w, 401, error_body(401, "Unauthorized: a valid API key is required"));
  return false;
}

void OpenAIServer::models(const HttpRequest& req, HttpResponseWriter& w) {
  if (!authorized(req, w)) return;
  ModelCard card;
  card.id = options_.served_model_name;
  card.root = options_.model_root;
  card.max_model_len = engine_.config().scheduler.max_model_len;
  card.created = created_;
  send_json(w, 200, models_json({card}).dump());
}

namespace {

// Streams or collects the outputs of a generation and answers the HTTP request.
class GenerationRun {
 public:
  GenerationRun(Engine& engine, const Tokenizer& tokenizer, ServerMetrics& metrics, Generation g)
      : engine_(engine),
        tokenizer_(tokenizer),
        metrics_(metrics),
        g_(std::move(g)),
        session_(engine) {}

  void run(HttpResponseWriter& w) {
    const int32_t num_choices = static_cast<int32_t>(g_.prompts.size()) * g_.n;
    for (int32_t c = 0; c < num_choices; ++c) processors_.emplace_back(tokenizer_, g_.choice);
    first_token_.assign(num_choices, Clock::time_point{});
    last_token_.assign(num_choices, Clock::time_point{});
    role_sent_.assign(num_choices, false);
    logprobs_.resize(num_choices);
    prompt_logprobs_.assign(num_choices, nullptr);
    finish_.resize(num_choices);
    stop_reason_.resize(num_choices);
    for (int32_t c = 0; c < num_choices; ++c) {
      Request r;
      r.id = g_.meta.id + "-" + std::to_string(c);
      r.prompt_token_ids = g_.prompts[c / g_.n];
      r.sampling_params = g_.sampling;
      if (r.sampling_params.seed && c % g_.n > 0) *r.sampling_params.seed += c % g_.n;
      r.priority = g_.priority;
      r.cache_salt = g_.cache_salt.value_or("");
      session_.add(c, std::move(r));  // InvalidArgument -> 400 by the caller
    }
    if (g_.stream) {
      stream(w);
    } else {
      collect(w);
    }
  }

 private:
  // Processes one engine output; returns its delta.
  ChoiceDelta process(const GenerationSession::Event& e) {
    const int32_t c = e.choice;
    ChoiceProcessor& p = processors_[c];
    if (p.finished()) return {};
    const auto now = Clock::now();
    if (!e.output.new_tokens.empty()) {
      if (first_token_[c] == Clock::time_point{}) {
        first_token_[c] = now;
        metrics_.queue_time(e.output.queue_time_s);
        metrics_.first_token(std::chrono::duration<double>(now - start_).count());
      } else {
        metrics_.inter_token(std::chrono::duration<double>(now - last_token_[c]).count() /
                             static_cast<double>(e.output.new_tokens.size()));
      }
      last_token_[c] = now;
    }
    if (!e.output.prompt_logprobs.empty() && prompt_logprobs_[c].is_null()) {
      prompt_logprobs_[c] = prompt_logprobs_json(e.output.prompt_logprobs);
    }
    ChoiceDelta d = p.feed(e.output);
    if (d.stop_string_hit) session_.abort(c, "stop");
    for (auto& lp : d.logprobs) logprobs_[c].push_back(lp);
    if (d.finished) {
      finish_[c] = d.finish_reason;
      stop_reason_[c] = d.stop_reason;
      ++num_finished_;
      metrics_.request_finished(d.finish_reason == "tool_calls" ? "stop" : d.finish_reason,
                                seconds_since(start_));
    }
    return d;
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
                    {"decoded_token", replace_invalid_utf8(tokenizer_.decode(ids, false))}};
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

  Usage usage() const {
    Usage u;
    for (const auto& p : g_.prompts) u.prompt_tokens += static_cast<int64_t>(p.size());
    for (const auto& p : processors_) u.completion_tokens += p.num_tokens();
    // Cached prompt tokens: each prompt once (its n choices share the prompt).
    for (size_t prompt = 0; prompt < g_.prompts.size(); ++prompt) {
      int64_t cached = 0;
      for (int32_t c = 0; c < g_.n; ++c)
        cached = std::max(cached, processors_[prompt * g_.n + c].num_cached_tokens());
      u.cached_tokens += cached;
    }
    return u;
  }

  // Waits for the next output; false when the client went away (requests aborted).
  std::optional<GenerationSession::Event> next(HttpResponseWriter& w) {
    for (;;) {
      if (auto e = session_.next(kPoll)) return e;
      if (w.client_disconnected()) {
        session_.abort_all();
        return std::nullopt;
      }
    }
  }

  void collect(HttpResponseWriter& w) {
    const size_t num_choices = processors_.size();
    while (num_finished_ < num_choices) {
      auto e = next(w);
      if (!e) return;
      process(*e);
    }
    if (g_.chat) {
      std::vector<ChatChoice> choices;
      for (size_t c = 0; c < num_choices; ++c) {
        const ChoiceProcessor& p = processors_[c];
        ChatChoice ch;
        ch.index = static_cast<int32_t>(c);
        ch.content = p.all_content();
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
      send_json(w, 200, body.dump());
    } else {
      std::vector<CompletionChoice> choices;
      for (size_t c = 0; c < num_choices; ++c) {
        CompletionChoice ch;
        ch.index = static_cast<int32_t>(c);
        const std::string& echo = g_.echo.empty() ? std::string() : g_.echo[c / g_.n];
        ch.text = echo + processors_[c].all_content();
        if (g_.choice.logprobs) ch.logprobs = logprobs_[c];
        ch.text_offset = 0;
        ch.finish_reason = finish_[c];
        ch.stop_reason = stop_reason_[c];
        choices.push_back(std::move(ch));
      }
      ordered_json body = completion_json(g_.meta, choices, usage());
      add_prompt_logprobs(body);
      send_json(w, 200, body.dump());
    }
  }

  void stream(HttpResponseWriter& w) {
    HttpHeaders headers;
    headers.add("Cache-Control", "no-cache");
    if (!w.start_stream(200, "text/event-stream", headers)) {
      session_.abort_all();
      return;
    }
    const size_t num_choices = processors_.size();
    auto write = [&](const ordered_json& j) {
      if (!w.write_chunk(sse_event(j))) {
        session_.abort_all();
        return false;
      }
      return true;
    };
    if (!g_.chat && !g_.echo.empty()) {
      for (size_t c = 0; c < num_choices; ++c) {
        CompletionChunkChoice ch;
        ch.index = static_cast<int32_t>(c);
        ch.text = g_.echo[c / g_.n];
        if (!write(completion_chunk_json(g_.meta, {ch}))) return;
      }
    }
    while (num_finished_ < num_choices) {
      auto e = next(w);
      if (!e) return;
      const int32_t c = e->choice;
      if (processors_[c].finished()) continue;
      ChoiceDelta d = process(*e);
      if (g_.chat) {
        if (!role_sent_[c]) {
          role_sent_[c] = true;
          if (!write(chat_role_chunk_json(g_.meta, c))) return;
        }
        const bool has_delta = !d.content.empty() || !d.reasoning.empty() ||
                               !d.tool_calls.empty() || !d.logprobs.empty();
        if (has_delta || d.finished) {
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
          if (!write(chat_chunk_json(g_.meta, {ch}))) return;
        }
      } else if (!d.content.empty() || !d.logprobs.empty() || d.finished) {
        CompletionChunkChoice ch;
        ch.index = c;
        ch.text = d.content;
        if (g_.choice.logprobs && !d.logprobs.empty()) ch.logprobs = d.logprobs;
        if (d.finished) {
          ch.finish_reason = d.finish_reason;
          ch.stop_reason = d.stop_reason;
        }
        if (!write(completion_chunk_json(g_.meta, {ch}))) return;
      }
    }
    if (g_.include_usage) {
      const ordered_json u = g_.chat ? chat_usage_chunk_json(g_.meta, usage())
                                     : completion_usage_chunk_json(g_.meta, usage());
      if (!write(u)) return;
    }
    if (w.write_chunk(kSseDone)) w.end_stream();
  }

  Engine& engine_;
  const Tokenizer& tokenizer_;
  ServerMetrics& metrics_;
  Generation g_;
  GenerationSession session_;
  Clock::time_point start_ = Clock::now();
  std::vector<ChoiceProcessor> processors_;
  std::vector<Clock::time_point> first_token_, last_token_;
  std::vector<bool> role_sent_;
  std::vector<std::vector<TokenLogprob>> logprobs_;
  std::vector<ordered_json> prompt_logprobs_;  // per choice, when asked
  std::vector<std::string> finish_;
  std::vector<ordered_json> stop_reason_;
  size_t num_finished_ = 0;
};

// The fields chat and completion requests share.
void fill_generation(const GenerationRequest& r, Generation& g) {
  g.n = r.n;
  g.sampling = r.sampling;
  g.priority = r.priority;
  g.cache_salt = r.cache_salt;
  g.stream = r.stream;
  g.include_usage = r.include_usage;
  g.choice.skip_special_tokens = r.sampling.skip_special_tokens;
  g.choice.stop = r.sampling.stop;
  g.choice.stop_token_ids = r.sampling.stop_token_ids;
  g.choice.include_stop_str_in_output = r.sampling.include_stop_str_in_output;
  g.choice.tokens_as_ids = r.tokens_as_ids;
}

}  // namespace

bool OpenAIServer::admit(const GenerationRequest& r, HttpResponseWriter& w) const {
  if (!r.model.empty() && r.model != options_.served_model_name) {
    send_json(w, 404, error_body(404, "The model `" + r.model + "` does not exist.", "model"));
    return false;
  }
  if (!engine_.alive()) {
    send_json(w, 503, error_body(503, "the engine is not running"));
    return false;
  }
  return true;
}

std::shared_ptr<const TokenConstraint> OpenAIServer::make_constraint(const GuidedDecoding& guided,
                                                                     bool after_reasoning) const {
  Grammar grammar;
  switch (guided.kind) {
    case GuidedDecoding::Kind::kNone:
      return nullptr;
    case GuidedDecoding::Kind::kJsonObject:
      grammar = Grammar::any_object();
      break;
    case GuidedDecoding::Kind::kJsonSchema:
      try {
        grammar = compile_json_schema(guided.schema);
      } catch (const SchemaError& e) {
        const std::string param = e.path().empty() ? guided.param : guided.param + "." + e.path();
        throw RequestError(param, "Invalid or unsupported JSON Schema at '" + param +
                                      "': " + client_message(e.what()));
      }
      break;
    case GuidedDecoding::Kind::kChoice:
      grammar = Grammar::choices(guided.choices);
      break;
  }
  std::optional<int32_t> start_after;
  if (after_reasoning) {
    const int32_t id = tokenizer_.token_id(kThinkEnd);
    if (id >= 0) start_after = id;
  }
  return std::make_shared<const TokenConstraint>(std::move(grammar), vocab_, start_after);
}

void OpenAIServer::chat_completions(const HttpRequest& req, HttpResponseWriter& w) {
  if (!authorized(req, w)) return;
  try {
    const ChatCompletionRequest r = parse_chat_completion_request(req.body);
    if (!admit(r, w)) return;
    if (templates_.empty()) {
      throw RequestError("messages", "this model has no chat template; use /v1/completions");
    }
    const bool has_tools = r.tools.is_array() && !r.tools.empty();
    std::string prompt;
    try {
      const ChatTemplate tmpl(templates_.select(has_tools));
      prompt = tmpl.render(r.messages_json, r.tools, /*add_generation_prompt=*/true,
                           r.chat_template_kwargs, special_tokens_);
    } catch (const jinja::TemplateError& e) {
      throw RequestError("messages", std::string("chat template: ") + e.message());
    }
    Generation g;
    g.chat = true;
    g.meta = make_response_meta("chatcmpl", options_.served_model_name);
    g.prompts.push_back(tokenizer_.encode(prompt, /*allow_special=*/true));
    validate_prompt(g.prompts[0], r.sampling, limits());
    fill_generation(r, g);
    g.choice.parse_reasoning = options_.reasoning_parser == "kimi_k3";
    g.choice.thinking_enabled = r.thinking_enabled();
    g.choice.parse_tool_calls = options_.enable_auto_tool_choice && has_tools &&
                                r.tool_choice.mode != ToolChoiceMode::kNone;
    g.choice.logprobs = r.logprobs;
    g.sampling.constraint =
        make_constraint(r.guided, g.choice.parse_reasoning && g.choice.thinking_enabled);
    GenerationRun(engine_, tokenizer_, metrics_, std::move(g)).run(w);
  } catch (const RequestError& e) {
    if (!w.responded()) send_request_error(w, e);
  } catch (const InvalidRequest& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, e.what(), e.param()));
  } catch (const InvalidArgument& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, client_message(e.what())));
  }
}

void OpenAIServer::completions(const HttpRequest& req, HttpResponseWriter& w) {
  if (!authorized(req, w)) return;
  try {
    const CompletionRequest r = parse_completion_request(req.body);
    if (!admit(r, w)) return;
    Generation g;
    g.chat = false;
    g.meta = make_response_meta("cmpl", options_.served_model_name);
    for (const CompletionPrompt& p : r.prompts) {
      if (const auto* text = std::get_if<std::string>(&p)) {
        g.prompts.push_back(tokenizer_.encode(*text, /*allow_special=*/true));
        if (r.echo) g.echo.push_back(*text);
      } else {
        const auto& ids = std::get<std::vector<int32_t>>(p);
        g.prompts.push_back(ids);
        if (r.echo) g.echo.push_back(tokenizer_.decode(ids, r.sampling.skip_special_tokens));
      }
      validate_prompt(g.prompts.back(), r.sampling, limits());
    }
    fill_generation(r, g);
    g.choice.logprobs = r.sampling.logprobs.has_value();
    g.sampling.constraint = make_constraint(r.guided, /*after_reasoning=*/false);
    GenerationRun(engine_, tokenizer_, metrics_, std::move(g)).run(w);
  } catch (const RequestError& e) {
    if (!w.responded()) send_request_error(w, e);
  } catch (const InvalidRequest& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, e.what(), e.param()));
  } catch (const InvalidArgument& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, client_message(e.what())));
  }
}

void OpenAIServer::tokenize(const HttpRequest& req, HttpResponseWriter& w) {
  if (!authorized(req, w)) return;
  ordered_json body;
  try {
    body = ordered_json::parse(req.body);
  } catch (const std::exception&) {
    send_json(w, 400, error_body(400, "invalid JSON body"));
    return;
  }
  std::string text;
  if (body.contains("messages")) {
    try {
      // `tools` as in a chat request (vLLM's tokenize takes them too): the prompt's count
      // then equals the chat request's usage.prompt_tokens.
      const ordered_json tools = body.value("tools", ordered_json());
      if (!tools.is_null() && !tools.is_array()) {
        send_json(w, 400, error_body(400, "'tools' must be a list", "tools"));
        return;
      }
      const ChatTemplate tmpl(templates_.select(!tools.empty()));
      text =
          tmpl.render(body["messages"], tools, body.value("add_generation_prompt", true),
                      body.value("chat_template_kwargs", ordered_json::object()), special_tokens_);
    } catch (const Error& e) {
      send_json(w, 400, error_body(400, client_message(e.what()), "messages"));
      return;
    }
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    text = body["prompt"].get<std::string>();
  } else {
    send_json(w, 400, error_body(400, "give 'prompt' (a string) or 'messages'", "prompt"));
    return;
  }
  const std::vector<int32_t> ids = tokenizer_.encode(text, true);
  ordered_json out;
  out["count"] = ids.size();
  out["max_model_len"] = engine_.config().scheduler.max_model_len;
  out["tokens"] = ids;
  send_json(w, 200, out.dump());
}

void OpenAIServer::detokenize(const HttpRequest& req, HttpResponseWriter& w) {
  if (!authorized(req, w)) return;
  try {
    const ordered_json body = ordered_json::parse(req.body);
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw RequestError("tokens", "'tokens' must be a list of token ids");
    std::vector<int32_t> ids;
    for (const auto& t : body["tokens"]) {
      if (!t.is_number_integer())
        throw RequestError("tokens", "'tokens' must be a list of token ids");
      ids.push_back(t.get<int32_t>());
    }
    ordered_json out;
    out["prompt"] = replace_invalid_utf8(tokenizer_.decode(ids, false));
    send_json(w, 200, out.dump());
  } catch (const RequestError& e) {
    send_request_error(w, e);
  } catch (const nlohmann::json::exception&) {
    send_json(w, 400, error_body(400, "invalid JSON body"));
  } catch (const InvalidArgument& e) {
    send_json(w, 400, error_body(400, client_message(e.what()), "tokens"));
  }
}

}  // namespace hyserve
