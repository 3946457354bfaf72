// OpenAI request parsing: bodies of the chat, completion, tokenize and detokenize
// endpoints checked into structs; see openai_protocol.h.
#include "server/openai_protocol.h"

#include "server/json_body.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hyserve {
namespace {

using nlohmann::ordered_json;

// The engine's text (validate_request) for an empty prompt, whatever form it came in.
constexpr const char* kEmptyPrompt = "The prompt is empty.";

[[noreturn]] void fail(const std::string& param, const std::string& message) {
  throw RequestError(param, message);
}

std::string_view json_type_name(const ordered_json& value) {
  if (value.is_string()) return "string";
  if (value.is_boolean()) return "boolean";
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  if (value.is_array()) return "array";
  if (value.is_object()) return "object";
  return "null";
}

[[noreturn]] void fail_type(const std::string& param, std::string_view expected,
                            const ordered_json& value) {
  fail(param, str_cat("'", param, "': Input should be a valid ", expected, ", got ",
                      json_type_name(value)));
}

bool present(const ordered_json& object, std::string_view key) {
  const auto it = object.find(key);
  return it != object.end() && !it->is_null();
}

std::string get_string(const ordered_json& value, const std::string& param) {
  if (!value.is_string()) fail_type(param, "string", value);
  return value.get<std::string>();
}

bool get_bool(const ordered_json& value, const std::string& param) {
  if (!value.is_boolean()) fail_type(param, "boolean", value);
  return value.get<bool>();
}

double get_number(const ordered_json& value, const std::string& param) {
  if (!value.is_number()) fail_type(param, "number", value);
  return value.get<double>();
}

// An integer; a float with an integral value is accepted, as pydantic does.
int64_t get_int(const ordered_json& value, const std::string& param) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(param, str_cat("'", param, "': integer out of range"));
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::floor(d) == d && std::abs(d) < 9.2e18) return static_cast<int64_t>(d);
  }
  fail_type(param, "integer", value);
}

int32_t get_int32(const ordered_json& value, const std::string& param) {
  const int64_t v = get_int(value, param);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    fail(param, str_cat("'", param, "': integer out of range, got ", v));
  }
  return static_cast<int32_t>(v);
}

std::vector<int32_t> get_token_ids(const ordered_json& value, const std::string& param) {
  if (!value.is_array()) fail_type(param, "list of integers", value);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < value.size(); ++i) {
    ids.push_back(get_int32(value[i], str_cat(param, "[", i, "]")));
  }
  return ids;
}

std::vector<std::string> get_stop(const ordered_json& value) {
  if (value.is_string()) return {value.get<std::string>()};
  if (!value.is_array()) fail_type("stop", "string or list of strings", value);
  std::vector<std::string> stop;
  for (size_t i = 0; i < value.size(); ++i) {
    stop.push_back(get_string(value[i], str_cat("stop[", i, "]")));
  }
  return stop;
}

std::vector<std::pair<int32_t, float>> get_logit_bias(const ordered_json& value) {
  if (!value.is_object()) fail_type("logit_bias", "object", value);
  std::vector<std::pair<int32_t, float>> bias;
  for (const auto& [key, v] : value.items()) {
    size_t used = 0;
    long long token = -1;
    try {
      token = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || token < 0 ||
        token > std::numeric_limits<int32_t>::max()) {
      fail("logit_bias", str_cat("logit_bias: key '", key, "' is not a token id"));
    }
    bias.emplace_back(static_cast<int32_t>(token),
                      static_cast<float>(get_number(v, str_cat("logit_bias.", key))));
  }
  return bias;
}

// A JSON Schema given as an object (or a boolean), or as a string holding one.
ordered_json get_schema(const ordered_json& value, const std::string& param) {
  if (value.is_object() || value.is_boolean()) return value;
  if (!value.is_string()) fail_type(param, "JSON Schema object", value);
  try {
    ordered_json schema = ordered_json::parse(value.get<std::string>());
    if (schema.is_object() || schema.is_boolean()) return schema;
  } catch (const ordered_json::parse_error&) {
  }
  fail(param, str_cat("'", param, "' is not a JSON Schema object"));
}

std::vector<std::string> get_choices(const ordered_json& value, const std::string& param) {
  if (!value.is_array() || value.empty()) fail_type(param, "non-empty list of strings", value);
  std::vector<std::string> choices;
  for (size_t i = 0; i < value.size(); ++i) {
    choices.push_back(get_string(value[i], str_cat(param, "[", i, "]")));
    if (choices.back().empty()) fail(str_cat(param, "[", i, "]"), "a choice cannot be empty");
  }
  return choices;
}

[[noreturn]] void fail_unsupported_guided(const std::string& param) {
  fail(param, str_cat("'", param,
                      "' is not supported: guided decoding supports JSON Schema "
                      "(response_format json_schema, guided_json), JSON objects (response_format "
                      "json_object) and choices (guided_choice), not regular expressions or "
                      "grammars"));
}

// response_format (already read) and vLLM's guided decoding fields into request.guided; at
// most one of them may ask for guided decoding.
void read_guided(BodyReader& body, GenerationRequest& request) {
  std::vector<GuidedDecoding> asked;
  const auto add = [&](GuidedDecoding::Kind kind, std::string param) {
    GuidedDecoding g;
    g.kind = kind;
    g.param = std::move(param);
    asked.push_back(std::move(g));
    return &asked.back();
  };
  const ResponseFormat& rf = request.response_format;
  if (rf.type == "json_object") add(GuidedDecoding::Kind::kJsonObject, "response_format");
  if (rf.type == "json_schema") {
    const auto& js = rf.json_schema;
    if (!present(js, "schema")) {
      fail("response_format.json_schema.schema",
           "response_format.json_schema.schema is required (the JSON Schema to follow)");
    }
    add(GuidedDecoding::Kind::kJsonSchema, "response_format.json_schema.schema")->schema =
        get_schema(js["schema"], "response_format.json_schema.schema");
  }
  if (const auto* v = body.get("guided_json")) {
    add(GuidedDecoding::Kind::kJsonSchema, "guided_json")->schema = get_schema(*v, "guided_json");
  }
  if (const auto* v = body.get("guided_choice")) {
    add(GuidedDecoding::Kind::kChoice, "guided_choice")->choices = get_choices(*v, "guided_choice");
  }
  for (const char* key : {"guided_regex", "guided_grammar"}) {
    if (body.get(key)) fail_unsupported_guided(key);
  }
  if (const auto* v = body.get("structured_outputs")) {
    if (!v->is_object()) fail_type("structured_outputs", "object", *v);
    for (const char* key : {"regex", "grammar", "structural_tag"}) {
      if (present(*v, key)) fail_unsupported_guided(str_cat("structured_outputs.", key));
    }
    if (present(*v, "json")) {
      add(GuidedDecoding::Kind::kJsonSchema, "structured_outputs.json")->schema =
          get_schema((*v)["json"], "structured_outputs.json");
    }
    if (present(*v, "choice")) {
      add(GuidedDecoding::Kind::kChoice, "structured_outputs.choice")->choices =
          get_choices((*v)["choice"], "structured_outputs.choice");
    }
    if (present(*v, "json_object") &&
        get_bool((*v)["json_object"], "structured_outputs.json_object")) {
      add(GuidedDecoding::Kind::kJsonObject, "structured_outputs.json_object");
    }
  }
  if (asked.size() > 1) {
    fail(asked[1].param, str_cat("'", asked[0].param, "' and '", asked[1].param,
                                 "' both ask for guided decoding; give one"));
  }
  if (!asked.empty()) request.guided = std::move(asked[0]);
}

// Fields common to both endpoints; `logprobs` is endpoint-specific and read by the caller.
void read_common(BodyReader& body, GenerationRequest& request) {
  SamplingParams& s = request.sampling;
  if (const auto* v = body.get("model")) request.model = get_string(*v, "model");
  if (const auto* v = body.get("max_tokens")) s.max_tokens = get_int(*v, "max_tokens");
  if (const auto* v = body.get("max_completion_tokens")) {
    s.max_tokens = get_int(*v, "max_completion_tokens");
  }
  if (const auto* v = body.get("temperature")) {
    s.temperature = static_cast<float>(get_number(*v, "temperature"));
  }
  if (const auto* v = body.get("top_p")) s.top_p = static_cast<float>(get_number(*v, "top_p"));
  if (const auto* v = body.get("top_k")) s.top_k = get_int32(*v, "top_k");
  if (const auto* v = body.get("min_p")) s.min_p = static_cast<float>(get_number(*v, "min_p"));
  if (const auto* v = body.get("seed")) s.seed = static_cast<uint64_t>(get_int(*v, "seed"));
  if (const auto* v = body.get("n")) request.n = get_int32(*v, "n");
  if (request.n < 1) fail("n", str_cat("n must be at least 1, got ", request.n, "."));
  if (const auto* v = body.get("stop")) s.stop = get_stop(*v);
  if (const auto* v = body.get("stop_token_ids")) {
    s.stop_token_ids = get_token_ids(*v, "stop_token_ids");
  }
  if (const auto* v = body.get("add_special_tokens")) {
    request.add_special_tokens = get_bool(*v, "add_special_tokens");
  }
  if (const auto* v = body.get("bad_words")) {
    if (!v->is_array()) fail_type("bad_words", "list of strings", *v);
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string param = str_cat("bad_words[", i, "]");
      std::string word = get_string((*v)[i], param);
      word.erase(0, std::min(word.find_first_not_of(" \t\n\r\f\v"), word.size()));
      if (word.empty()) fail(param, "bad_words cannot contain an empty (or blank) word");
      request.bad_words.push_back(std::move(word));
    }
  }
  if (const auto* v = body.get("allowed_token_ids")) {
    s.allowed_token_ids = get_token_ids(*v, "allowed_token_ids");
    if (s.allowed_token_ids.empty()) fail("allowed_token_ids", "Empty allowed_token_ids provided.");
  }
  if (const auto* v = body.get("ignore_eos")) s.ignore_eos = get_bool(*v, "ignore_eos");
  if (const auto* v = body.get("min_tokens")) s.min_tokens = get_int(*v, "min_tokens");
  if (const auto* v = body.get("stream")) request.stream = get_bool(*v, "stream");
  if (const auto* v = body.get("stream_options")) {
    if (!v->is_object()) fail_type("stream_options", "object", *v);
    if (!request.stream) {
      fail("stream_options", "Stream options can only be defined when `stream=True`.");
    }
    if (present(*v, "include_usage")) {
      request.include_usage = get_bool((*v)["include_usage"], "stream_options.include_usage");
    }
    // vLLM: usage on every chunk, only when the closing usage chunk is asked for too.
    if (present(*v, "continuous_usage_stats")) {
      request.continuous_usage =
          request.include_usage &&
          get_bool((*v)["continuous_usage_stats"], "stream_options.continuous_usage_stats");
    }
  }
  if (const auto* v = body.get("prompt_logprobs")) {
    s.prompt_logprobs = get_int32(*v, "prompt_logprobs");
  }
  if (const auto* v = body.get("echo")) request.echo = get_bool(*v, "echo");
  if (const auto* v = body.get("return_tokens_as_token_ids")) {
    request.tokens_as_ids = get_bool(*v, "return_tokens_as_token_ids");
  }
  if (const auto* v = body.get("return_token_ids")) {
    request.return_token_ids = get_bool(*v, "return_token_ids");
  }
  if (const auto* v = body.get("request_id")) request.request_id = get_string(*v, "request_id");
  if (const auto* v = body.get("presence_penalty")) {
    s.presence_penalty = static_cast<float>(get_number(*v, "presence_penalty"));
  }
  if (const auto* v = body.get("frequency_penalty")) {
    s.frequency_penalty = static_cast<float>(get_number(*v, "frequency_penalty"));
  }
  if (const auto* v = body.get("repetition_penalty")) {
    s.repetition_penalty = static_cast<float>(get_number(*v, "repetition_penalty"));
  }
  if (const auto* v = body.get("logit_bias")) s.logit_bias = get_logit_bias(*v);
  if (const auto* v = body.get("response_format")) {
    if (!v->is_object()) fail_type("response_format", "object", *v);
    if (!present(*v, "type")) fail("response_format.type", "response_format.type is required");
    const std::string type = get_string((*v)["type"], "response_format.type");
    if (type != "text" && type != "json_object" && type != "json_schema") {
      fail("response_format.type",
           str_cat("response_format.type must be one of text, json_object, json_schema; got '",
                   type, "'"));
    }
    request.response_format.type = type;
    if (type == "json_schema") {
      if (!present(*v, "json_schema") || !(*v)["json_schema"].is_object()) {
        fail("response_format.json_schema",
             "response_format.json_schema must be an object when type is json_schema");
      }
      request.response_format.json_schema = (*v)["json_schema"];
    }
  }
  read_guided(body, request);
  if (const auto* v = body.get("skip_special_tokens")) {
    s.skip_special_tokens = get_bool(*v, "skip_special_tokens");
  }
  if (const auto* v = body.get("include_stop_str_in_output")) {
    s.include_stop_str_in_output = get_bool(*v, "include_stop_str_in_output");
  }
  if (const auto* v = body.get("user")) request.user = get_string(*v, "user");
  if (const auto* v = body.get("priority")) request.priority = get_int32(*v, "priority");
  if (const auto* v = body.get("cache_salt")) request.cache_salt = get_string(*v, "cache_salt");
  if (const auto* v = body.get("truncate_prompt_tokens")) {
    const int64_t k = get_int(*v, "truncate_prompt_tokens");
    if (k < -1 || k == 0) {
      fail("truncate_prompt_tokens", str_cat("truncate_prompt_tokens must be -1 or >= 1, got ", k));
    }
    request.truncate_prompt_tokens = k;
  }
}

std::optional<std::string> get_message_content(const ordered_json& value,
                                               const std::string& param) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) fail_type(param, "string or list of content parts", value);
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string part_param = str_cat(param, "[", i, "]");
    const auto& part = value[i];
    if (!part.is_object()) fail_type(part_param, "object", part);
    const std::string type =
        present(part, "type") ? get_string(part["type"], part_param + ".type") : "";
    if (type == "image_url" || type == "video_url" || type == "input_image" ||
        type == "input_audio" || type == "image" || type == "video") {
      // The published Kimi K3 has a vision tower; hyserve serves its text model only.
      fail(part_param + ".type",
           str_cat("Unsupported content part type '", type,
                   "': this server runs the text model only (no image, video or audio input); "
                   "send 'text' parts"));
    }
    if (type != "text") {
      fail(part_param + ".type",
           str_cat("Unsupported content part type '", type, "': only 'text' is supported"));
    }
    if (!present(part, "text")) fail(part_param + ".text", part_param + ".text is required");
    if (i > 0) text += "\n";
    text += get_string(part["text"], part_param + ".text");
  }
  return text;
}

std::vector<ToolCall> get_message_tool_calls(const ordered_json& value, const std::string& param) {
  if (!value.is_array()) fail_type(param, "list", value);
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string call_param = str_cat(param, "[", i, "]");
    const auto& call = value[i];
    if (!call.is_object()) fail_type(call_param, "object", call);
    if (!present(call, "function") || !call["function"].is_object()) {
      fail(call_param + ".function", call_param + ".function must be an object");
    }
    const auto& function = call["function"];
    ToolCall parsed;
    if (present(call, "id")) parsed.id = get_string(call["id"], call_param + ".id");
    if (!present(function, "name")) {
      fail(call_param + ".function.name", call_param + ".function.name is required");
    }
    parsed.name = get_string(function["name"], call_param + ".function.name");
    if (present(function, "arguments")) {
      const auto& arguments = function["arguments"];
      parsed.arguments = arguments.is_string() ? arguments.get<std::string>() : arguments.dump();
    }
    calls.push_back(std::move(parsed));
  }
  return calls;
}

ChatMessage get_message(const ordered_json& value, const std::string& param) {
  if (!value.is_object()) fail_type(param, "object", value);
  ChatMessage message;
  if (!present(value, "role")) fail(param + ".role", param + ".role is required");
  message.role = get_string(value["role"], param + ".role");
  if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
      message.role != "tool" && message.role != "developer") {
    fail(param + ".role", str_cat("Unsupported message role '", message.role,
                                  "': expected system, developer, user, assistant or tool"));
  }
  // OpenAI's newer name for the system turn; chat templates know only "system" (vLLM maps it).
  if (message.role == "developer") message.role = "system";
  if (value.contains("content")) {
    message.content = get_message_content(value["content"], param + ".content");
  }
  if (present(value, "name")) message.name = get_string(value["name"], param + ".name");
  if (present(value, "tool_calls")) {
    message.tool_calls = get_message_tool_calls(value["tool_calls"], param + ".tool_calls");
  }
  if (present(value, "tool_call_id")) {
    message.tool_call_id = get_string(value["tool_call_id"], param + ".tool_call_id");
  }
  for (const char* key : {"reasoning", "reasoning_content"}) {
    if (present(value, key)) message.reasoning = get_string(value[key], param + "." + key);
  }
  return message;
}

// Checks each tool is {"type": "function", "function": {"name": ...}}; returns the names.
std::vector<std::string> get_tool_names(const ordered_json& tools) {
  if (!tools.is_array()) fail_type("tools", "list", tools);
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = str_cat("tools[", i, "]");
    const auto& tool = tools[i];
    if (!tool.is_object()) fail_type(param, "object", tool);
    if (present(tool, "type") && get_string(tool["type"], param + ".type") != "function") {
      fail(param + ".type", param + ".type must be 'function'");
    }
    if (!present(tool, "function") || !tool["function"].is_object()) {
      fail(param + ".function", param + ".function must be an object");
    }
    if (!present(tool["function"], "name")) {
      fail(param + ".function.name", param + ".function.name is required");
    }
    names.push_back(get_string(tool["function"]["name"], param + ".function.name"));
  }
  return names;
}

ToolChoice get_tool_choice(const ordered_json& value) {
  ToolChoice choice;
  if (value.is_string()) {
    const std::string mode = value.get<std::string>();
    if (mode == "none") {
      choice.mode = ToolChoiceMode::kNone;
    } else if (mode == "auto") {
      choice.mode = ToolChoiceMode::kAuto;
    } else if (mode == "required") {
      choice.mode = ToolChoiceMode::kRequired;
    } else {
      fail("tool_choice", str_cat("tool_choice must be 'none', 'auto', 'required' or a named "
                                  "function, got '",
                                  mode, "'"));
    }
    return choice;
  }
  if (!value.is_object()) fail_type("tool_choice", "string or object", value);
  if (!present(value, "function") || !value["function"].is_object() ||
      !present(value["function"], "name")) {
    fail("tool_choice",
         "tool_choice object must be {\"type\": \"function\", \"function\": "
         "{\"name\": ...}}");
  }
  if (present(value, "type") && get_string(value["type"], "tool_choice.type") != "function") {
    fail("tool_choice.type", "tool_choice.type must be 'function'");
  }
  choice.mode = ToolChoiceMode::kNamed;
  choice.function_name = get_string(value["function"]["name"], "tool_choice.function.name");
  return choice;
}

// The messages checked into `parsed`; returns them as sent, with developer turns as system
// turns, for the chat template.
ordered_json get_messages(const ordered_json& value, std::vector<ChatMessage>& parsed) {
  if (!value.is_array()) fail_type("messages", "list", value);
  if (value.empty()) {
    fail("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
  }
  ordered_json messages = value;
  for (size_t i = 0; i < value.size(); ++i) {
    parsed.push_back(get_message(value[i], str_cat("messages[", i, "]")));
    messages[i]["role"] = parsed.back().role;
  }
  return messages;
}

// add_generation_prompt and continue_final_message (vLLM's chat fields). Sending only
// continue_final_message turns the generation prompt off; both true is refused, as in vLLM.
void read_template_options(BodyReader& body, bool& add_generation_prompt,
                           bool& continue_final_message) {
  const auto* add = body.get("add_generation_prompt");
  if (add) add_generation_prompt = get_bool(*add, "add_generation_prompt");
  if (const auto* v = body.get("continue_final_message")) {
    continue_final_message = get_bool(*v, "continue_final_message");
  }
  if (!continue_final_message) return;
  if (add && add_generation_prompt) {
    fail("continue_final_message",
         "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  }
  add_generation_prompt = false;
}

}  // namespace

bool ChatCompletionRequest::thinking_enabled() const {
  if (!chat_template_kwargs.is_object()) return true;
  const auto it = chat_template_kwargs.find("thinking");
  return it == chat_template_kwargs.end() || !it->is_boolean() || it->get<bool>();
}

ChatCompletionRequest parse_chat_completion_request(std::string_view body_text) {
  BodyReader body(body_text);
  ChatCompletionRequest request;
  read_common(body, request);

  const auto* messages = body.get("messages");
  if (!messages) fail("messages", "'messages': Field required");
  request.messages_json = get_messages(*messages, request.messages);
  read_template_options(body, request.add_generation_prompt, request.continue_final_message);

  if (const auto* v = body.get("logprobs")) request.logprobs = get_bool(*v, "logprobs");
  if (const auto* v = body.get("top_logprobs")) {
    request.top_logprobs = get_int32(*v, "top_logprobs");
    if (*request.top_logprobs < 0) fail("top_logprobs", "`top_logprobs` must be a positive value.");
    if (*request.top_logprobs > SamplingParams::kMaxLogprobs) {
      fail("top_logprobs", str_cat("`top_logprobs` must be at most ", SamplingParams::kMaxLogprobs,
                                   ", got ", *request.top_logprobs, "."));
    }
    if (!request.logprobs) {
      fail("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.");
    }
  }
  if (request.logprobs) request.sampling.logprobs = request.top_logprobs.value_or(0);

  std::vector<std::string> tool_names;
  if (const auto* v = body.get("tools")) {
    tool_names = get_tool_names(*v);
    request.tools = *v;
  }
  request.tool_choice.mode = tool_names.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
  if (const auto* v = body.get("tool_choice")) request.tool_choice = get_tool_choice(*v);
  const ToolChoiceMode mode = request.tool_choice.mode;
  if ((mode == ToolChoiceMode::kRequired || mode == ToolChoiceMode::kNamed) && tool_names.empty()) {
    fail("tool_choice", "When using `tool_choice`, `tools` must be set.");
  }
  if (mode == ToolChoiceMode::kNamed &&
      std::find(tool_names.begin(), tool_names.end(), request.tool_choice.function_name) ==
          tool_names.end()) {
    fail("tool_choice",
         str_cat("The tool specified in `tool_choice` ('", request.tool_choice.function_name,
                 "') does not match any of the specified `tools`."));
  }
  if (const auto* v = body.get("chat_template_kwargs")) {
    if (!v->is_object()) fail_type("chat_template_kwargs", "object", *v);
    request.chat_template_kwargs = *v;
  }
  if (const auto* v = body.get("chat_template")) {
    request.chat_template = get_string(*v, "chat_template");
  }
  request.unknown_fields = body.unknown_fields();
  return request;
}

CompletionRequest parse_completion_request(std::string_view body_text) {
  BodyReader body(body_text);
  CompletionRequest request;
  read_common(body, request);

  const auto* prompt = body.get("prompt");
  if (!prompt) fail("prompt", "'prompt': Field required");
  if (prompt->is_string()) {
    request.prompts.emplace_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_string()) {
    for (size_t i = 0; i < prompt->size(); ++i) {
      request.prompts.emplace_back(get_string((*prompt)[i], str_cat("prompt[", i, "]")));
    }
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_array()) {
    for (size_t i = 0; i < prompt->size(); ++i) {
      request.prompts.emplace_back(get_token_ids((*prompt)[i], str_cat("prompt[", i, "]")));
    }
  } else if (prompt->is_array() && !prompt->empty()) {
    request.prompts.emplace_back(get_token_ids(*prompt, "prompt"));
  } else if (!prompt->is_array()) {
    fail_type("prompt", "string, list of strings, or token ids", *prompt);
  }
  // "", [], [[]] and [""] alike: the engine's text for an empty prompt.
  const auto is_empty = [](const CompletionPrompt& p) {
    return std::visit([](const auto& v) { return v.empty(); }, p);
  };
  if (request.prompts.empty() ||
      std::any_of(request.prompts.begin(), request.prompts.end(), is_empty)) {
    fail("prompt", kEmptyPrompt);
  }
  if (body.get("suffix")) fail("suffix", "suffix is not currently supported");
  if (const auto* v = body.get("best_of")) {
    const int32_t best_of = get_int32(*v, "best_of");
    if (best_of < request.n) {
      fail("best_of", str_cat("best_of must be greater than or equal to n, got n=", request.n,
                              " and best_of=", best_of, "."));
    }
    // vLLM V1 has no best_of beyond n (it would sample best_of and return the n best).
    if (best_of > request.n) {
      fail("best_of", str_cat("best_of > n is not supported (got best_of=", best_of,
                              ", n=", request.n, "); omit best_of or set it to n."));
    }
  }
  // Absent: 16 (OpenAI's and vLLM's default); an explicit null: up to the context's end.
  if (!body.sent("max_tokens") && !body.sent("max_completion_tokens")) {
    request.sampling.max_tokens = kDefaultCompletionMaxTokens;
  }
  // Prompt scoring (echo with max_tokens 0): the engine samples one token that the response
  // leaves out, as vLLM does. Without echo, 0 stays out of range.
  if (request.echo && request.sampling.max_tokens == 0) {
    if (request.sampling.min_tokens > 0) {
      fail("min_tokens",
           str_cat("min_tokens must be <= max_tokens, got ", request.sampling.min_tokens, " > 0"));
    }
    request.score_prompt = true;
    request.sampling.max_tokens = 1;
  }

  if (const auto* v = body.get("logprobs")) {
    const int32_t logprobs = get_int32(*v, "logprobs");
    if (logprobs < 0) fail("logprobs", "`logprobs` must be a positive value.");
    if (logprobs > SamplingParams::kMaxLogprobs) {
      fail("logprobs",
           str_cat("Requested sample logprobs of ", logprobs,
                   ", which is greater than max allowed: ", SamplingParams::kMaxLogprobs));
    }
    request.sampling.logprobs = logprobs;
  }
  request.unknown_fields = body.unknown_fields();
  return request;
}

TokenizeRequest parse_tokenize_request(std::string_view body_text) {
  BodyReader body(body_text);
  TokenizeRequest request;
  if (const auto* v = body.get("add_special_tokens")) {
    request.add_special_tokens = get_bool(*v, "add_special_tokens");
  }
  if (const auto* messages = body.get("messages")) {
    std::vector<ChatMessage> parsed;
    request.messages_json = get_messages(*messages, parsed);
    read_template_options(body, request.add_generation_prompt, request.continue_final_message);
    if (const auto* v = body.get("tools")) {
      get_tool_names(*v);
      request.tools = *v;
    }
    if (const auto* v = body.get("chat_template_kwargs")) {
      if (!v->is_object()) fail_type("chat_template_kwargs", "object", *v);
      request.chat_template_kwargs = *v;
    }
    if (const auto* v = body.get("chat_template")) {
      request.chat_template = get_string(*v, "chat_template");
    }
  } else if (const auto* v = body.get("prompt")) {
    request.prompt = get_string(*v, "prompt");
  } else {
    fail("prompt", "give 'prompt' (a string) or 'messages'");
  }
  return request;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body_text) {
  BodyReader body(body_text);
  const auto* tokens = body.get("tokens");
  if (!tokens) fail("tokens", "'tokens': Field required");
  return get_token_ids(*tokens, "tokens");
}

std::string cut_after_final_message(const std::string& rendered, const ordered_json& messages) {
  // transformers' rule: continue the last message's content (its last text part), found as
  // the last occurrence of its stripped text; keep its trailing whitespace when the
  // template kept it.
  std::string content;
  const ordered_json& last = messages.back();
  if (present(last, "content") && last["content"].is_string()) {
    content = last["content"].get<std::string>();
  } else if (present(last, "content") && last["content"].is_array()) {
    for (const auto& part : last["content"]) {
      if (part.is_object() && present(part, "text") && part["text"].is_string()) {
        content = part["text"].get<std::string>();
      }
    }
  }
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  size_t begin = 0, end = content.size();
  while (begin < end && is_space(content[begin])) ++begin;
  while (end > begin && is_space(content[end - 1])) --end;
  const std::string stripped = content.substr(begin, end - begin);
  const size_t at = stripped.empty() ? std::string::npos : rendered.rfind(stripped);
  if (at == std::string::npos) {
    fail("continue_final_message",
         "continue_final_message is set but the final message's content does not appear in the "
         "prompt the chat template renders");
  }
  const std::string_view with_trailing = std::string_view(content).substr(begin);
  if (std::string_view(rendered).substr(at, with_trailing.size()) == with_trailing) {
    return rendered.substr(0, at + with_trailing.size());
  }
  return rendered.substr(0, at + stripped.size());
}

std::string client_message(std::string_view what) {
  // CHECK's text is "check failed: <cond>: <message> [<file>:<line>]"; clients get the
  // message.
  std::string message(what);
  const std::string prefix = "check failed: ";
  if (message.rfind(prefix, 0) == 0) {
    const size_t colon = message.find(": ", prefix.size());
    if (colon != std::string::npos) message = message.substr(colon + 2);
  }
  const size_t location = message.rfind(" [");
  if (location != std::string::npos && message.back() == ']') message.resize(location);
  return message;
}

void truncate_prompt(std::vector<int32_t>& prompt, std::optional<int64_t> k,
                     int64_t max_model_len) {
  if (!k) return;
  const int64_t keep = *k == -1 ? max_model_len : *k;
  if (keep > max_model_len) {
    fail("truncate_prompt_tokens",
         str_cat("truncate_prompt_tokens value (", keep, ") is greater than max_model_len (",
                 max_model_len, "). Please, select a smaller truncation size."));
  }
  if (std::ssize(prompt) > keep) prompt.erase(prompt.begin(), prompt.end() - keep);
}

void validate_prompt(std::span<const int32_t> prompt, const SamplingParams& params,
                     const RequestLimits& limits) {
  try {
    validate_request(prompt, params, limits);
  } catch (const InvalidRequest& e) {
    throw RequestError(e.param(), e.what());
  }
}

}  // namespace hyserve
