#include "server/openai_server.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "engine/weight_transfer.h"
#include "guided/json_schema.h"
#include "guided/token_constraint.h"
#include "server/control_queue.h"
#include "server/forced_tool_calls.h"
#include "server/generation.h"
#include "server/generation_run.h"
#include "server/openai_protocol.h"
#include "tokenizer/deepseek_v32_encoding.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/log.h"
#include "util/version.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

void send_json(HttpResponseWriter& w, int status, const std::string& body) {
  w.send(status, "application/json", body);
}

void send_request_error(HttpResponseWriter& w, const RequestError& e) {
  send_json(w, e.status(), error_body(e));
}

// The response id and the engine ids: the client's X-Request-Id (vLLM's name for it), else
// the body's request_id, else random.
void set_ids(Generation& g, std::string_view prefix, const std::string& model,
             const HttpRequest& req, const GenerationRequest& r) {
  std::string client_id(req.headers.get("X-Request-Id").value_or(""));
  if (client_id.empty()) client_id = r.request_id.value_or("");
  g.meta = make_response_meta(prefix, model, client_id);
  g.engine_id = client_id.empty() ? g.meta.id : g.meta.id + "-" + random_hex(8);
}

}  // namespace

OpenAIServer::OpenAIServer(OpenAIServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                           ChatTemplates templates, SpecialTokens special_tokens)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      templates_(std::move(templates)),
      special_tokens_(std::move(special_tokens)),
      vocab_(options_.skip_tokenizer_init
                 ? nullptr
                 : std::make_shared<const VocabTrie>(
                       VocabTrie::from_tokenizer(tokenizer, engine.model().config().vocab_size))),
      cors_(options_.cors),
      metrics_(options_.served_model_names.at(0), engine.config().scheduler.max_model_len,
               engine.config().scheduler.max_num_batched_tokens),
      http_([&] {
        HttpServerOptions o;
        o.host = options_.host;
        o.port = options_.port;
        o.max_connections = options_.max_connections;
        o.idle_timeout_ms = options_.idle_timeout_ms;
        return o;
      }()),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  engine_.set_observer(&metrics_);
  http_.observe(
      [this](const std::string& handler, const std::string& method, int status, double seconds) {
        metrics_.http_request(handler, method, status, seconds);
      });
  const EngineConfig& ec = engine_.config();
  metrics_.set_cache_config(
      {{"block_size", std::to_string(engine_.model().cache_plan(ec.min_block_size).block_size)},
       {"cache_dtype",
        std::string(latent_cache_dtype_name(engine_.model().options().latent_cache))},
       {"enable_prefix_caching", ec.enable_prefix_caching ? "True" : "False"},
       {"num_gpu_blocks", std::to_string(ec.num_blocks)}});
  http_.use([this](const HttpRequest& r, HttpResponseWriter& w) { middleware(r, w); });
  http_.route("POST", "/v1/chat/completions",
              [this](const HttpRequest& r, HttpResponseWriter& w) { chat_completions(r, w); });
  http_.route("POST", "/v1/completions",
              [this](const HttpRequest& r, HttpResponseWriter& w) { completions(r, w); });
  http_.route("GET", "/v1/models",
              [this](const HttpRequest& r, HttpResponseWriter& w) { models(r, w); });
  if (options_.allow_runtime_lora_updating) {
    http_.route("POST", "/v1/load_lora_adapter",
                [this](const HttpRequest& r, HttpResponseWriter& w) { load_lora_adapter(r, w); });
    http_.route("POST", "/v1/unload_lora_adapter",
                [this](const HttpRequest& r, HttpResponseWriter& w) { unload_lora_adapter(r, w); });
  }
  if (options_.dev_mode) add_control_routes();
  http_.route("POST", "/tokenize",
              [this](const HttpRequest& r, HttpResponseWriter& w) { tokenize(r, w); });
  http_.route("POST", "/detokenize",
              [this](const HttpRequest& r, HttpResponseWriter& w) { detokenize(r, w); });
  const auto health = [this](const HttpRequest&, HttpResponseWriter& w) {
    if (engine_.alive()) {
      w.send(200, "text/plain", "");
    } else {
      send_json(w, 503, error_body(503, "the engine is dead"));
    }
  };
  http_.route("GET", "/health", health);
  // vLLM's /ping (SageMaker's liveness probe, GET and POST): /health's answer.
  http_.route("GET", "/ping", health);
  http_.route("POST", "/ping", health);
  http_.route("GET", "/version", [](const HttpRequest&, HttpResponseWriter& w) {
    send_json(w, 200, nlohmann::json{{"version", kVersion}}.dump());
  });
  http_.route("GET", "/metrics", [this](const HttpRequest&, HttpResponseWriter& w) {
    w.send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(engine_.stats()));
  });
}

OpenAIServer::~OpenAIServer() {
  stop();
  control_.reset();               // finishes the control in progress, answers the queued ones
  engine_.set_observer(nullptr);  // no event reaches metrics_ after this
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

void OpenAIServer::middleware(const HttpRequest& req, HttpResponseWriter& w) const {
  if (const auto id = req.headers.get("X-Request-Id"))
    w.add_header("X-Request-Id", std::string(*id));
  if (CorsPolicy::is_preflight(req)) {
    const CorsPreflight p = cors_.preflight(req);
    w.send(p.status, "text/plain; charset=utf-8", p.body, p.headers);
    return;
  }
  const HttpHeaders cors = cors_.response_headers(req);
  for (const auto& [name, value] : cors.fields()) w.add_header(name, value);
  // vLLM's rule: the key guards /v1/* only; preflights never carry it.
  if (options_.api_key.empty() || !req.path.starts_with("/v1")) return;
  if (req.headers.get_or("Authorization", "") == "Bearer " + options_.api_key) return;
  send_json(w, 401, error_body(401, "Unauthorized: a valid API key is required"));
}

void OpenAIServer::models(const HttpRequest&, HttpResponseWriter& w) {
  std::vector<ModelCard> cards;
  for (const std::string& name : options_.served_model_names) {
    ModelCard card;
    card.id = name;
    card.root = options_.model_root;
    card.max_model_len = engine_.config().scheduler.max_model_len;
    card.created = created_;
    cards.push_back(std::move(card));
  }
  add_lora_cards(cards);
  send_json(w, 200, dump_json(models_json(cards)));
}

std::string OpenAIServer::render_chat(const ordered_json& messages, const ordered_json& tools,
                                      bool add_generation_prompt, bool continue_final_message,
                                      const ordered_json& chat_template_kwargs,
                                      const std::optional<std::string>& request_template) const {
  if (request_template && !options_.trust_request_chat_template) {
    // vLLM's rule and words: a request's own template runs only on a server that trusts them.
    throw RequestError("chat_template",
                       "Chat template is passed with request, but --trust-request-chat-template "
                       "is not set. Refused request with untrusted chat template.");
  }
  if (templates_.empty() && !request_template) {
    throw RequestError("messages", "this model has no chat template; use /v1/completions");
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  std::string prompt;
  try {
    if (!request_template && templates_.by_name.empty() && templates_.builtin == "deepseek_v32") {
      prompt = encode_deepseek_v32_chat(messages, tools, chat_template_kwargs);
      return continue_final_message ? cut_after_final_message(prompt, messages) : prompt;
    }
    const ChatTemplate tmpl(request_template ? *request_template : templates_.select(has_tools));
    prompt =
        tmpl.render(messages, tools, add_generation_prompt, chat_template_kwargs, special_tokens_);
  } catch (const jinja::TemplateError& e) {
    throw RequestError("messages", std::string("chat template: ") + e.message());
  } catch (const InvalidArgument& e) {
    throw RequestError("messages", "chat template: " + client_message(e.what()));
  }
  return continue_final_message ? cut_after_final_message(prompt, messages) : prompt;
}

namespace {

// tool_choice "required" / named: the constrained output is parsed as the calls, not by the
// model's tool-call markers; ids continue the numbering of the conversation's earlier calls.
void force_tool_calls(const ChatCompletionRequest& r, ChoiceOptions& choice) {
  choice.parse_tool_calls = false;
  choice.forced_tools = r.tool_choice.mode == ToolChoiceMode::kNamed ? ForcedToolMode::kNamed
                                                                     : ForcedToolMode::kRequired;
  choice.forced_function = r.tool_choice.function_name;
  choice.first_tool_call_index = 0;
  for (const ChatMessage& m : r.messages) {
    if (m.role == "assistant")
      choice.first_tool_call_index += static_cast<int32_t>(m.tool_calls.size());
  }
}

// The fields chat and completion requests share.
// vLLM's bad_words ids: each word as it starts the text, and as it follows a space when that
// gives another first token and as many tokens (the word in mid-text).
std::vector<std::vector<int32_t>> bad_words_ids(const Tokenizer& tokenizer,
                                                const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    std::vector<int32_t> plain = tokenizer.encode(word, /*allow_special=*/true);
    std::vector<int32_t> spaced = tokenizer.encode(" " + word, /*allow_special=*/true);
    if (plain.empty()) continue;
    const bool add_spaced =
        !spaced.empty() && spaced[0] != plain[0] && spaced.size() == plain.size();
    out.push_back(std::move(plain));
    if (add_spaced) out.push_back(std::move(spaced));
  }
  return out;
}

void fill_generation(const GenerationRequest& r, Generation& g) {
  g.n = r.n;
  g.sampling = r.sampling;
  g.priority = r.priority;
  g.cache_salt = r.cache_salt;
  g.stream = r.stream;
  g.include_usage = r.include_usage;
  g.continuous_usage = r.continuous_usage;
  g.return_token_ids = r.return_token_ids;
  g.choice.skip_special_tokens = r.sampling.skip_special_tokens;
  g.choice.stop = r.sampling.stop;
  g.choice.stop_token_ids = r.sampling.stop_token_ids;
  g.choice.include_stop_str_in_output = r.sampling.include_stop_str_in_output;
  g.choice.tokens_as_ids = r.tokens_as_ids;
}

}  // namespace

void OpenAIServer::set_bad_words(const GenerationRequest& r, Generation& g) const {
  if (r.bad_words.empty()) return;
  if (options_.skip_tokenizer_init) {
    throw RequestError("bad_words",
                       "bad_words need the tokenizer, and this server runs with "
                       "--skip-tokenizer-init");
  }
  g.sampling.bad_words_token_ids = bad_words_ids(tokenizer_, r.bad_words);
  for (const std::vector<int32_t>& word : g.sampling.bad_words_token_ids) {
    for (const int32_t id : word) {
      if (id < 0 || id >= limits().vocab_size) {
        throw RequestError("bad_words", str_cat("bad_words: token id ", id,
                                                " is outside the model's vocabulary [0, ",
                                                limits().vocab_size, ")"));
      }
    }
  }
}

bool OpenAIServer::admit(const GenerationRequest& r, HttpResponseWriter& w) const {
  if (!r.unknown_fields.empty()) {
    // vLLM's line for fields it does not read (SERVING.md: ignored with a log line).
    std::string names;
    for (const std::string& f : r.unknown_fields) names += (names.empty() ? "" : ", ") + f;
    log::warn("The following fields were present in the request but ignored: {{{}}}", names);
  }
  const auto& names = options_.served_model_names;
  if (!r.model.empty() && std::find(names.begin(), names.end(), r.model) == names.end() &&
      adapter_name(r.model).empty()) {
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
  if (guided.kind != GuidedDecoding::Kind::kNone && !vocab_) {
    throw RequestError(guided.param, "'" + guided.param +
                                         "': guided decoding needs the tokenizer, and this "
                                         "server runs with --skip-tokenizer-init");
  }
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
  return constrain(std::move(grammar), after_reasoning);
}

std::shared_ptr<const TokenConstraint> OpenAIServer::constrain(Grammar grammar,
                                                               bool after_reasoning) const {
  std::optional<int32_t> start_after;
  if (after_reasoning) {
    const int32_t id = tokenizer_.token_id(kThinkEnd);
    if (id >= 0) start_after = id;
  }
  return std::make_shared<const TokenConstraint>(std::move(grammar), vocab_, start_after);
}

void OpenAIServer::chat_completions(const HttpRequest& req, HttpResponseWriter& w) {
  try {
    const ChatCompletionRequest r = parse_chat_completion_request(req.body);
    if (!admit(r, w)) return;
    if (options_.skip_tokenizer_init) {
      throw RequestError("messages",
                         "chat completions need the tokenizer, and this server runs with "
                         "--skip-tokenizer-init: send token ids to /v1/completions");
    }
    const bool has_tools = r.tools.is_array() && !r.tools.empty();
    // vLLM's rule: tools with tool_choice "auto" (the default when tools are given) need
    // the server's tool-call parser; without it the tools would be silently ignored.
    if (has_tools && r.tool_choice.mode == ToolChoiceMode::kAuto &&
        !options_.enable_auto_tool_choice) {
      throw RequestError("tool_choice",
                         "\"auto\" tool choice requires --enable-auto-tool-choice and "
                         "--tool-call-parser to be set");
    }
    const std::string prompt =
        render_chat(r.messages_json, r.tools, r.add_generation_prompt, r.continue_final_message,
                    r.chat_template_kwargs, r.chat_template);
    check_num_sequences(1, r.n);
    Generation g;
    g.chat = true;
    g.lora_name = adapter_name(r.model);
    set_ids(g, "chatcmpl", g.lora_name.empty() ? model_name() : g.lora_name, req, r);
    // vLLM: the response speaks as the assistant, or, without a generation prompt, as the
    // last message's author; echo starts the content with that message when they match.
    const ChatMessage& last = r.messages.back();
    g.role = r.add_generation_prompt ? "assistant" : last.role;
    if (r.echo && last.role == g.role && last.content) g.echo.push_back(*last.content);
    g.prompts.push_back(tokenizer_.encode_prompt(prompt, r.add_special_tokens.value_or(false)));
    truncate_prompt(g.prompts[0], r.truncate_prompt_tokens, limits().max_model_len);
    validate_prompt(g.prompts[0], r.sampling, limits());
    fill_generation(r, g);
    set_bad_words(r, g);
    g.choice.parse_reasoning = !options_.reasoning_parser.empty();
    g.choice.reasoning_parser = options_.reasoning_parser;
    g.choice.tool_call_parser = options_.tool_call_parser;
    // deepseek_v3 reads thinking mode as DeepSeek-V3.2's encoding does (off by default).
    g.choice.thinking_enabled = options_.reasoning_parser == "deepseek_v3"
                                    ? deepseek_v32_thinking(r.chat_template_kwargs)
                                    : r.thinking_enabled();
    g.choice.parse_tool_calls = options_.enable_auto_tool_choice && has_tools &&
                                r.tool_choice.mode != ToolChoiceMode::kNone;
    g.choice.logprobs = r.logprobs;
    const bool after_reasoning = g.choice.parse_reasoning && g.choice.thinking_enabled;
    if (r.tool_choice.mode == ToolChoiceMode::kRequired ||
        r.tool_choice.mode == ToolChoiceMode::kNamed) {
      force_tool_calls(r, g.choice);
      // As in vLLM, the tools' schemas replace any response_format / guided decoding: the
      // output is the calls, with no content for those to shape.
      g.sampling.constraint = constrain(
          forced_tool_call_grammar(r.tools, g.choice.forced_tools, g.choice.forced_function),
          after_reasoning);
    } else {
      g.sampling.constraint = make_constraint(r.guided, after_reasoning);
    }
    run_generation(engine_, tokenizer_, metrics_, std::move(g), w);
  } catch (const RequestError& e) {
    if (!w.responded()) send_request_error(w, e);
  } catch (const InvalidRequest& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, e.what(), e.param()));
  } catch (const InvalidArgument& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, client_message(e.what())));
  }
}

void OpenAIServer::completions(const HttpRequest& req, HttpResponseWriter& w) {
  try {
    const CompletionRequest r = parse_completion_request(req.body);
    if (!admit(r, w)) return;
    if (options_.skip_tokenizer_init) {
      // Without a tokenizer only token ids go in and out (vLLM's rules for text prompts
      // and stop strings; echo would need the prompt's text).
      for (const CompletionPrompt& p : r.prompts) {
        if (std::holds_alternative<std::string>(p)) {
          throw RequestError("prompt",
                             "You cannot pass text prompts when --skip-tokenizer-init is set "
                             "(the server has no tokenizer): send token ids");
        }
      }
      if (!r.sampling.stop.empty()) {
        throw RequestError("stop",
                           "stop strings need the tokenizer, and this server runs with "
                           "--skip-tokenizer-init: use stop_token_ids");
      }
      if (r.echo) {
        throw RequestError("echo",
                           "echo needs the tokenizer, and this server runs with "
                           "--skip-tokenizer-init");
      }
    }
    check_num_sequences(std::ssize(r.prompts), r.n);
    Generation g;
    g.chat = false;
    g.lora_name = adapter_name(r.model);
    set_ids(g, "cmpl", g.lora_name.empty() ? model_name() : g.lora_name, req, r);
    for (const CompletionPrompt& p : r.prompts) {
      const auto* text = std::get_if<std::string>(&p);
      std::vector<int32_t> ids =
          text != nullptr ? tokenizer_.encode_prompt(*text, r.add_special_tokens.value_or(true))
                          : std::get<std::vector<int32_t>>(p);
      const size_t before = ids.size();
      truncate_prompt(ids, r.truncate_prompt_tokens, limits().max_model_len);
      if (r.echo) {
        // The prompt as sent, or (ids, or cut by truncate_prompt_tokens) the text of the ids
        // the model reads; they may end (or start) inside a character: U+FFFD, as vLLM's
        // detokenizer.
        g.echo.push_back(
            text != nullptr && ids.size() == before
                ? *text
                : replace_invalid_utf8(tokenizer_.decode(ids, r.sampling.skip_special_tokens)));
      }
      g.prompts.push_back(std::move(ids));
      validate_prompt(g.prompts.back(), r.sampling, limits());
    }
    fill_generation(r, g);
    set_bad_words(r, g);
    g.detokenize = !options_.skip_tokenizer_init;
    g.choice.tokens_as_ids = r.tokens_as_ids || options_.skip_tokenizer_init;
    g.choice.logprobs = r.sampling.logprobs.has_value();
    g.score_prompt = r.score_prompt;
    g.echo_logprobs = r.echo && g.choice.logprobs;
    if (g.echo_logprobs) {
      // vLLM: echo with logprobs scores the prompt with as many alternatives.
      g.sampling.prompt_logprobs =
          std::max(g.sampling.prompt_logprobs.value_or(0), *g.sampling.logprobs);
    }
    g.sampling.constraint = make_constraint(r.guided, /*after_reasoning=*/false);
    run_generation(engine_, tokenizer_, metrics_, std::move(g), w);
  } catch (const RequestError& e) {
    if (!w.responded()) send_request_error(w, e);
  } catch (const InvalidRequest& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, e.what(), e.param()));
  } catch (const InvalidArgument& e) {
    if (!w.responded()) send_json(w, 400, error_body(400, client_message(e.what())));
  }
}

void OpenAIServer::check_num_sequences(int64_t num_prompts, int64_t n) const {
  const int64_t cap = options_.max_sequences_per_request;
  if (num_prompts * n <= cap) return;
  throw RequestError(num_prompts > 1 ? "prompt" : "n",
                     str_cat("The request asks for ", num_prompts, " prompt(s) x n = ", n, ", ",
                             num_prompts * n, " sequences; this server takes at most ", cap,
                             " per request (--max-sequences-per-request)."));
}

// /tokenize and /detokenize are open without the API key, as in vLLM (the middleware
// guards /v1/* only).
void OpenAIServer::tokenize(const HttpRequest& req, HttpResponseWriter& w) {
  try {
    const TokenizeRequest r = parse_tokenize_request(req.body);
    if (options_.skip_tokenizer_init) {
      throw RequestError("",
                         "/tokenize needs the tokenizer, and this server runs with "
                         "--skip-tokenizer-init");
    }
    // `tools` as in a chat request (vLLM's tokenize takes them too): the prompt's count
    // then equals the chat request's usage.prompt_tokens.
    const std::string text =
        r.prompt ? *r.prompt
                 : render_chat(r.messages_json, r.tools, r.add_generation_prompt,
                               r.continue_final_message, r.chat_template_kwargs, r.chat_template);
    const std::vector<int32_t> ids =
        tokenizer_.encode_prompt(text, r.add_special_tokens.value_or(r.prompt.has_value()));
    ordered_json out;
    out["count"] = ids.size();
    out["max_model_len"] = engine_.config().scheduler.max_model_len;
    out["tokens"] = ids;
    send_json(w, 200, dump_json(out));
  } catch (const RequestError& e) {
    send_request_error(w, e);
  } catch (const InvalidArgument& e) {
    send_json(w, 400, error_body(400, client_message(e.what()), "prompt"));
  }
}

void OpenAIServer::detokenize(const HttpRequest& req, HttpResponseWriter& w) {
  try {
    const std::vector<int32_t> ids = parse_detokenize_request(req.body);
    if (options_.skip_tokenizer_init) {
      throw RequestError("",
                         "/detokenize needs the tokenizer, and this server runs with "
                         "--skip-tokenizer-init");
    }
    ordered_json out;
    out["prompt"] = replace_invalid_utf8(tokenizer_.decode(ids, false));
    send_json(w, 200, dump_json(out));
  } catch (const RequestError& e) {
    send_request_error(w, e);
  } catch (const InvalidArgument& e) {
    send_json(w, 400, error_body(400, client_message(e.what()), "tokens"));
  }
}

}  // namespace hyserve
