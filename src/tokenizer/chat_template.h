// Chat templates: turns an OpenAI-style conversation into the prompt text a model was
// trained on, by rendering the checkpoint's Hugging Face Jinja chat template the way
// transformers' apply_chat_template does (the same variables, reasoning-field aliasing,
// special tokens and chat_template_kwargs), so prompts match vLLM's byte for byte.
//
// JSON arrives as nlohmann::ordered_json: Python keeps the key order the client sent, and
// templates print tool schemas with tojson, so a sorted-key json would change the prompt.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_template.h"

namespace hyserve {

// Special tokens passed to the template as variables; absent ones stay undefined there
// (transformers passes only the tokens the tokenizer has).
struct SpecialTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> pad_token;
};

// A compiled chat template, rendered once per request.
class ChatTemplate {
 public:
  // Compiles the template; throws jinja::TemplateError (with line and column) when it
  // cannot be parsed or uses a filter, test or tag the interpreter does not have.
  explicit ChatTemplate(const std::string& source);

  // messages: array of message objects; tools: array or null; extra_kwargs: object
  // (chat_template_kwargs, e.g. {"thinking": false}) or null, whose entries override the
  // special tokens. Throws jinja::TemplateError when rendering fails, including a
  // template's raise_exception(msg) (then message() == msg), and InvalidArgument when
  // messages is not an array of objects.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
                     const SpecialTokens& special_tokens) const;

 private:
  jinja::Template template_;
};

// Compiles and renders in one call (see ChatTemplate).
std::string render_chat(const std::string& template_text, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra_kwargs,
                        const SpecialTokens& special_tokens);

// The chat templates a model folder ships, by name ("default", "tool_use", ...):
// chat_template.jinja (as "default") if present, else tokenizer_config.json's
// "chat_template", a string ("default") or a list of {"name", "template"}.
struct ChatTemplates {
  std::map<std::string, std::string> by_name;
  // A chat encoding built into hyserve, for a checkpoint that ships Python instead of a
  // template: "deepseek_v32" (tokenizer/deepseek_v32_encoding.h), or empty.
  std::string builtin;

  bool empty() const { return by_name.empty() && builtin.empty(); }
  // The template transformers would pick: `name` when given; else "tool_use" when tools
  // are given and it exists; else "default". Throws InvalidArgument when missing.
  const std::string& select(bool has_tools, const std::string& name = "") const;
};

// Throws CheckpointError when a file exists but is malformed; empty when there is none.
ChatTemplates load_chat_templates(const std::filesystem::path& model_dir);

// bos/eos/unk/pad tokens from tokenizer_config.json (strings or {"content": ...} objects);
// all empty when the file is absent.
SpecialTokens load_special_tokens(const std::filesystem::path& model_dir);

}  // namespace hyserve
