#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace hyserve {
namespace {

using jinja::Dict;
using jinja::Value;

// transformers' _alias_reasoning_fields: the first non-null of reasoning_content,
// thinking, reasoning is exposed as both "thinking" (first key unless present) and
// "reasoning_content" (in place, or last).
Value alias_reasoning_fields(const Value& message) {
  if (!message.is_mapping()) return message;
  const Dict& m = message.as_dict();
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const Value* v = m.find(key);
    if (v != nullptr && !v->is_none()) {
      reasoning = v;
      break;
    }
  }
  if (reasoning == nullptr) return message;
  Dict out;
  out.set("thinking", *reasoning);
  for (const auto& [k, v] : m.items) out.set(k, v);
  out.set("reasoning_content", *reasoning);
  return Value(std::move(out));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  CHECK_AS(CheckpointError, in.good(), "cannot read ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::ordered_json read_tokenizer_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nullptr;
  try {
    return nlohmann::ordered_json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    HYSERVE_THROW(CheckpointError, path.string(), ": ", e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source) : template_(source) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_kwargs,
                                 const SpecialTokens& special_tokens) const {
  CHECK(messages.is_array(), "messages must be an array, got ", messages.type_name());
  CHECK(extra_kwargs.is_null() || extra_kwargs.is_object(),
        "chat_template_kwargs must be an object, got ", extra_kwargs.type_name());
  jinja::List chat;
  for (const auto& message : messages) {
    CHECK(message.is_object(), "each message must be an object, got ", message.type_name());
    chat.push_back(alias_reasoning_fields(Value::from_json(message)));
  }
  Dict context;
  context.set("messages", Value(std::move(chat)));
  context.set("tools", tools.is_null() ? Value(jinja::None{}) : Value::from_json(tools));
  context.set("documents", Value(jinja::None{}));
  context.set("add_generation_prompt", Value(add_generation_prompt));
  const std::pair<const char*, const std::optional<std::string>*> tokens[] = {
      {"bos_token", &special_tokens.bos_token},
      {"eos_token", &special_tokens.eos_token},
      {"unk_token", &special_tokens.unk_token},
      {"pad_token", &special_tokens.pad_token}};
  for (const auto& [name, token] : tokens) {
    if (token->has_value()) context.set(name, Value(**token));
  }
  if (extra_kwargs.is_object()) {
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) {
      context.set(it.key(), Value::from_json(it.value()));
    }
  }
  return template_.render(context);
}

std::string render_chat(const std::string& template_text, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra_kwargs,
                        const SpecialTokens& special_tokens) {
  return ChatTemplate(template_text)
      .render(messages, tools, add_generation_prompt, extra_kwargs, special_tokens);
}

const std::string& ChatTemplates::select(bool has_tools, const std::string& name) const {
  std::string wanted = name;
  if (wanted.empty()) wanted = has_tools && by_name.count("tool_use") ? "tool_use" : "default";
  const auto it = by_name.find(wanted);
  CHECK(it != by_name.end(), "the model has no chat template named '", wanted, "'");
  return it->second;
}

ChatTemplates load_chat_templates(const std::filesystem::path& model_dir) {
  ChatTemplates out;
  const auto jinja_path = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    out.by_name["default"] = read_file(jinja_path);
    return out;
  }
  const auto config = read_tokenizer_config(model_dir);
  if (!config.is_object() || !config.contains("chat_template")) return out;
  const auto& field = config["chat_template"];
  if (field.is_string()) {
    out.by_name["default"] = field.get<std::string>();
    return out;
  }
  CHECK_AS(CheckpointError, field.is_array(),
           "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
  for (const auto& entry : field) {
    CHECK_AS(CheckpointError,
             entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                 entry.contains("template") && entry["template"].is_string(),
             "tokenizer_config.json: each chat_template entry needs string name and template");
    out.by_name[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
  }
  return out;
}

SpecialTokens load_special_tokens(const std::filesystem::path& model_dir) {
  SpecialTokens out;
  const auto config = read_tokenizer_config(model_dir);
  if (!config.is_object()) return out;
  auto token = [&](const char* key) -> std::optional<std::string> {
    if (!config.contains(key)) return std::nullopt;
    const auto& v = config[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      return v["content"].get<std::string>();
    }
    return std::nullopt;
  };
  out.bos_token = token("bos_token");
  out.eos_token = token("eos_token");
  out.unk_token = token("unk_token");
  out.pad_token = token("pad_token");
  return out;
}

}  // namespace hyserve
