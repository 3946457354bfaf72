// DeepSeek-V3.2's chat encoding; see deepseek_v32_encoding.h for the layout.
#include "tokenizer/deepseek_v32_encoding.h"

#include "tokenizer/jinja_value.h"
#include "tokenizer/reasoning_parser.h"
#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

// The tool section of the system turn, as the model was trained on it (DeepSeek's
// encoding_dsv32.py TOOLS_SYSTEM_TEMPLATE: no blank lines between its parts); {schemas} is
// the functions' JSON, one per line.
constexpr std::string_view kToolsHead =
    "## Tools\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the "
    "following as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    "while lists and objects should use JSON format. The \"string\" attribute should be set to "
    "\"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
    "arrays, objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "<think>...thinking about results</think>\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsTail = "\n</functions>\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// Python truthiness of a JSON value (kwargs.get(...) in a boolean context).
bool truthy(const ordered_json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return false;
}

const ordered_json* field(const ordered_json& m, const char* key) {
  const auto it = m.find(key);
  return it == m.end() || it->is_null() ? nullptr : &*it;
}

// A message's text: a string, null (""), or text parts joined by newlines (vLLM's
// "string" content format).
std::string content_text(const ordered_json& m) {
  const ordered_json* c = field(m, "content");
  if (c == nullptr) return "";
  if (c->is_string()) return c->get<std::string>();
  std::string out;
  if (c->is_array()) {
    bool first = true;
    for (const auto& part : *c) {
      const ordered_json* text = part.is_object() ? field(part, "text") : nullptr;
      if (text == nullptr || !text->is_string()) continue;
      if (!first) out += '\n';
      out += text->get<std::string>();
      first = false;
    }
  }
  return out;
}

std::string render_tools(const ordered_json& tools) {
  std::string out(kToolsHead);
  bool first = true;
  for (const auto& tool : tools) {
    const ordered_json* fn = tool.is_object() ? field(tool, "function") : nullptr;
    if (!first) out += '\n';
    out += python_json_dumps(fn != nullptr ? *fn : tool);
    first = false;
  }
  out += kToolsTail;
  return out;
}

// A call's arguments (a JSON object, as text or as an object) as DSML parameter lines.
std::string render_arguments(const ordered_json& function) {
  ordered_json args = ordered_json::object();
  if (const ordered_json* a = field(function, "arguments")) {
    if (a->is_string()) {
      try {
        args = ordered_json::parse(a->get<std::string>());
      } catch (const nlohmann::json::exception&) {
        HYSERVE_THROW(InvalidArgument, "tool call arguments are not valid JSON");
      }
    } else {
      args = *a;
    }
  }
  if (!args.is_object()) HYSERVE_THROW(InvalidArgument, "tool call arguments must be an object");
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += '\n';
    first = false;
    const bool is_string = it.value().is_string();
    out += kDsmlParameterBegin;
    out += " name=\"" + it.key() + "\" string=\"" + (is_string ? "true" : "false") + "\">";
    out += is_string ? it.value().get<std::string>() : python_json_dumps(it.value());
    out += kDsmlParameterEnd;
  }
  return out;
}

std::string render_tool_calls(const ordered_json& calls) {
  std::string out = "\n\n";
  out += kDsmlFunctionCallsBegin;
  out += '\n';
  bool first = true;
  for (const auto& call : calls) {
    const ordered_json* fn = call.is_object() ? field(call, "function") : nullptr;
    if (fn == nullptr || !fn->is_object()) {
      HYSERVE_THROW(InvalidArgument, "each tool call needs a function object");
    }
    const ordered_json* name = field(*fn, "name");
    if (!first) out += '\n';
    first = false;
    out += kDsmlInvokeBegin;
    out += " name=\"" + (name != nullptr && name->is_string() ? name->get<std::string>() : "") +
           "\">\n";
    out += render_arguments(*fn);
    out += '\n';
    out += kDsmlInvokeEnd;
  }
  out += '\n';
  out += kDsmlFunctionCallsEnd;
  return out;
}

std::string_view role_of(const ordered_json& m) {
  const ordered_json* r = field(m, "role");
  return r != nullptr && r->is_string() ? r->get_ref<const std::string&>() : std::string_view();
}

size_t num_tool_calls(const ordered_json& m) {
  const ordered_json* calls = field(m, "tool_calls");
  return calls != nullptr && calls->is_array() ? calls->size() : 0;
}

}  // namespace

std::string python_json_dumps(const ordered_json& value) {
  return jinja::json_dumps(jinja::Value::from_json(value), jinja::JsonOptions{});
}

bool deepseek_v32_thinking(const ordered_json& chat_template_kwargs) {
  if (!chat_template_kwargs.is_object()) return false;
  for (const char* key : {"thinking", "enable_thinking"}) {
    const auto it = chat_template_kwargs.find(key);
    if (it != chat_template_kwargs.end() && truthy(*it)) return true;
  }
  return false;
}

std::string encode_deepseek_v32_chat(const ordered_json& messages, const ordered_json& tools,
                                     const ordered_json& chat_template_kwargs) {
  if (!messages.is_array()) HYSERVE_THROW(InvalidArgument, "messages must be an array");
  const bool thinking = deepseek_v32_thinking(chat_template_kwargs);
  // vLLM: the tools are a system turn of their own, first.
  ordered_json msgs = ordered_json::array();
  if (tools.is_array() && !tools.empty()) msgs.push_back({{"role", "system"}, {"tools", tools}});
  const int64_t num_added = static_cast<int64_t>(msgs.size());  // for messages[i] in errors
  for (const auto& m : messages) {
    if (!m.is_object()) HYSERVE_THROW(InvalidArgument, "each message must be an object");
    msgs.push_back(m);
  }
  int64_t last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string_view role = role_of(msgs[i]);
    if (role == "user" || role == "developer") last_user = static_cast<int64_t>(i);
  }
  // Drop-thinking in the reference removes reasoning from turns before the last user turn;
  // those are never rendered with reasoning, so it changes nothing here.
  std::string prompt(kDeepSeekBos);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ordered_json& m = msgs[i];
    const std::string_view role = role_of(m);
    const auto index = static_cast<int64_t>(i);
    if (role == "system") {
      prompt += content_text(m);
      if (const ordered_json* t = field(m, "tools"); t != nullptr && !t->empty()) {
        prompt += "\n\n" + render_tools(*t);
      }
      if (const ordered_json* rf = field(m, "response_format")) {
        prompt += "\n\n" + std::string(kResponseFormatHead) + python_json_dumps(*rf);
      }
    } else if (role == "user" || role == "developer") {
      prompt += kDeepSeekUser;
      prompt += content_text(m);
      prompt += kDeepSeekAssistant;
      prompt += index == last_user && thinking ? kThinkBegin : kThinkEnd;
    } else if (role == "tool") {
      int64_t owner = index - 1;
      while (owner >= 0 && role_of(msgs[owner]) == "tool") --owner;
      const size_t order = static_cast<size_t>(index - owner);
      if (owner < 0 || role_of(msgs[owner]) != "assistant" || num_tool_calls(msgs[owner]) < order) {
        HYSERVE_THROW(InvalidArgument, "messages[", index - num_added,
                      "]: a tool result needs a preceding assistant tool call");
      }
      if (order == 1) prompt += "\n\n<function_results>";
      prompt += "\n<result>" + content_text(m) + "</result>";
      if (order == num_tool_calls(msgs[owner])) {
        prompt += "\n</function_results>\n\n";
        prompt += index >= last_user && thinking ? kThinkBegin : kThinkEnd;
      }
    } else if (role == "assistant") {
      const ordered_json* calls = field(m, "tool_calls");
      const bool has_calls = calls != nullptr && calls->is_array() && !calls->empty();
      if (thinking && index > last_user) {
        const ordered_json* reasoning = field(m, "reasoning");
        if (reasoning == nullptr || (reasoning->is_string() && reasoning->empty()))
          reasoning = field(m, "reasoning_content");
        const bool has_reasoning =
            reasoning != nullptr && reasoning->is_string() && !reasoning->empty();
        if (!has_reasoning && !has_calls) {
          HYSERVE_THROW(InvalidArgument, "messages[", index - num_added,
                        "]: in thinking mode an assistant turn after the last user turn needs "
                        "reasoning or tool calls");
        }
        if (has_reasoning) prompt += reasoning->get<std::string>();
        prompt += kThinkEnd;
      }
      prompt += content_text(m);
      if (has_calls) prompt += render_tool_calls(*calls);
      prompt += kDeepSeekEos;
    } else {
      HYSERVE_THROW(InvalidArgument, "messages[", index - num_added, "]: unknown role '", role,
                    "'");
    }
  }
  return prompt;
}

}  // namespace hyserve
