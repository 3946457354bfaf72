#include "server/forced_tool_calls.h"

#include "guided/json_schema.h"
#include "server/openai_protocol.h"
#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Tool i's `parameters` compiled; a 400 names the offending keyword under it.
Grammar compile_parameters(const ordered_json& tools, size_t i) {
  const ordered_json& function = tools[i]["function"];
  const std::string param = str_cat("tools[", i, "].function.parameters");
  // No parameters: a function of no arguments (OpenAI's rule), `{}`.
  ordered_json schema = {{"type", "object"}, {"properties", ordered_json::object()}};
  if (function.contains("parameters") && !function["parameters"].is_null())
    schema = function["parameters"];
  try {
    return compile_json_schema(schema);
  } catch (const SchemaError& e) {
    const std::string p = e.path().empty() ? param : param + "." + e.path();
    throw RequestError(
        p, "Invalid or unsupported JSON Schema at '" + p + "': " + client_message(e.what()));
  }
}

std::string tool_name(const ordered_json& tools, size_t i) {
  return tools[i]["function"]["name"].get<std::string>();
}

// {"name": NAME, "parameters": <tool i's schema>}, both required, no other key.
int32_t add_call_object(Grammar& g, const ordered_json& tools, size_t i) {
  const int32_t parameters = g.embed(compile_parameters(tools, i));
  GrammarNode name;
  name.kind = NodeKind::kLiterals;
  name.literal_trie = g.trie.add_root();
  g.trie.insert(name.literal_trie, ordered_json(tool_name(tools, i)).dump(), 0);
  const int32_t name_node = g.add_node(std::move(name));
  GrammarNode call;
  call.types = kJsonObject;
  call.property_nodes = {name_node, parameters};
  call.required = 0b11;
  call.key_trie = g.trie.add_root();
  g.trie.insert(call.key_trie, "name", 0);
  g.trie.insert(call.key_trie, "parameters", 1);
  return g.add_node(std::move(call));
}

}  // namespace

Grammar forced_tool_call_grammar(const ordered_json& tools, ForcedToolMode mode,
                                 const std::string& function_name) {
  CHECK(mode != ForcedToolMode::kNone && tools.is_array() && !tools.empty(),
        "forced_tool_call_grammar: a forced mode and tools");
  if (mode == ForcedToolMode::kNamed) {
    for (size_t i = 0; i < tools.size(); ++i) {
      if (tool_name(tools, i) == function_name) return compile_parameters(tools, i);
    }
    throw RequestError("tool_choice", "The tool specified in `tool_choice` ('" + function_name +
                                          "') does not match any of the specified `tools`.");
  }
  Grammar g;
  GrammarNode any_call;
  any_call.kind = NodeKind::kAnyOf;
  for (size_t i = 0; i < tools.size(); ++i)
    any_call.alternatives.push_back(add_call_object(g, tools, i));
  GrammarNode array;
  array.types = kJsonArray;
  array.items = any_call.alternatives.size() == 1 ? any_call.alternatives[0]
                                                  : g.add_node(std::move(any_call));
  array.min_items = 1;
  g.root = g.add_node(std::move(array));
  return g;
}

ForcedToolCallParser::ForcedToolCallParser(ForcedToolMode mode, std::string function_name,
                                           int32_t first_id_index)
    : mode_(mode), function_name_(std::move(function_name)), first_id_index_(first_id_index) {
  CHECK(mode_ != ForcedToolMode::kNone, "ForcedToolCallParser: a forced mode");
}

std::string ForcedToolCallParser::call_id(const std::string& name) const {
  return str_cat("functions.", name, ":", first_id_index_ + index_);
}

std::vector<ToolCallDelta> ForcedToolCallParser::feed(std::string_view text) {
  std::vector<ToolCallDelta> out;
  if (mode_ == ForcedToolMode::kNamed) {
    if (arguments_.empty()) {
      while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    }
    if (text.empty()) return out;
    ToolCallDelta d;
    if (!header_sent_) {
      d.id = call_id(function_name_);
      d.name = function_name_;
      header_sent_ = true;
    }
    d.arguments = std::string(text);
    out.push_back(std::move(d));
    arguments_ += text;
    calls_ = {{call_id(function_name_), function_name_, arguments_}};
    return out;
  }
  for (const char c : text) feed_required(c, out);
  // One delta per call and piece of text: join the argument bytes sent one by one.
  std::vector<ToolCallDelta> joined;
  for (ToolCallDelta& d : out) {
    if (!joined.empty() && !d.id && joined.back().index == d.index) {
      joined.back().arguments += d.arguments;
    } else {
      joined.push_back(std::move(d));
    }
  }
  return joined;
}

void ForcedToolCallParser::feed_required(char c, std::vector<ToolCallDelta>& out) {
  if (in_string_) {
    if (capture_ == Capture::kKey) key_ += c;
    if (capture_ == Capture::kName) name_raw_ += c;
    if (in_parameters_) emit_arguments(std::string_view(&c, 1), out);
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
      end_string(out);
    }
    return;
  }
  if (in_parameters_) {
    if (scalar_parameters_ && depth_ == 2 && (c == ',' || c == '}' || is_space(c))) {
      end_parameters();  // and `c` is read as part of the call object below
    } else {
      parameters_char(c, out);
      if ((c == '}' || c == ']') && --depth_ == 2) end_parameters();
      return;
    }
  }
  if (depth_ == 0) {
    if (c == '[') depth_ = 1;
    return;
  }
  if (depth_ == 1) {
    if (c == '{') depth_ = 2;
    return;
  }
  if (is_space(c)) return;
  if (expect_value_) {
    expect_value_ = false;
    if (key_ == "\"name\"" && c == '"') {
      in_string_ = true;
      capture_ = Capture::kName;
      name_raw_ = "\"";
    } else if (key_ == "\"parameters\"") {
      in_parameters_ = true;
      scalar_parameters_ = c != '{' && c != '[' && c != '"';
      parameters_char(c, out);
    }
    return;
  }
  if (c == '"') {
    in_string_ = true;
    capture_ = Capture::kKey;
    key_ = "\"";
  } else if (c == ':') {
    expect_value_ = true;
  } else if (c == '}') {
    end_call();
    depth_ = 1;
  }
}

void ForcedToolCallParser::end_string(std::vector<ToolCallDelta>& out) {
  const Capture captured = capture_;
  capture_ = Capture::kNone;
  if (captured == Capture::kName) {
    // Valid JSON by the grammar; a name the parse refuses stays unknown.
    const ordered_json name = ordered_json::parse(name_raw_, nullptr, /*allow_exceptions=*/false);
    if (!name.is_string()) return;
    name_ = name.get<std::string>();
    ToolCallDelta d;
    d.index = index_;
    d.id = call_id(name_);
    d.name = name_;
    d.arguments = std::move(pending_);
    pending_.clear();
    header_sent_ = true;
    out.push_back(std::move(d));
  } else if (captured == Capture::kParameters && depth_ == 2) {
    end_parameters();
  }
}

void ForcedToolCallParser::end_parameters() {
  in_parameters_ = false;
  scalar_parameters_ = false;
}

void ForcedToolCallParser::end_call() {
  if (!name_.empty()) {
    calls_.push_back({call_id(name_), name_, arguments_});
    ++index_;
  }
  key_.clear();
  name_raw_.clear();
  name_.clear();
  arguments_.clear();
  pending_.clear();
  header_sent_ = false;
  expect_value_ = false;
}

void ForcedToolCallParser::parameters_char(char c, std::vector<ToolCallDelta>& out) {
  emit_arguments(std::string_view(&c, 1), out);
  if (c == '"') {
    in_string_ = true;
    capture_ = Capture::kParameters;
  } else if (c == '{' || c == '[') {
    ++depth_;
  }
}

void ForcedToolCallParser::emit_arguments(std::string_view text, std::vector<ToolCallDelta>& out) {
  arguments_ += text;
  if (!header_sent_) {
    pending_ += text;
    return;
  }
  ToolCallDelta d;
  d.index = index_;
  d.arguments = std::string(text);
  out.push_back(std::move(d));
}

}  // namespace hyserve
