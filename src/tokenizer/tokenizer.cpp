// Tokenizer::load: picks the format the checkpoint ships.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tokenizer/hf_bpe_tokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"

namespace hyserve {

namespace {

// A special token of tokenizer_config.json: a string or {"content": ...}; empty when absent.
std::string config_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// LlamaTokenizer(Fast) builds its post-processor from add_bos_token (default true) and
// add_eos_token (default false), in place of tokenizer.json's.
void apply_llama_affixes(const std::filesystem::path& model_dir, Tokenizer& tok) {
  const std::filesystem::path path = model_dir / "tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    HYSERVE_THROW(TokenizerError, path.string(), ": ", e.what());
  }
  if (!config.is_object()) return;
  const std::string cls = config.value("tokenizer_class", std::string());
  if (cls != "LlamaTokenizerFast" && cls != "LlamaTokenizer") return;
  const auto flag = [&](const char* key, bool fallback) {
    if (!config.contains(key) || config[key].is_null()) return fallback;
    if (!config[key].is_boolean()) {
      HYSERVE_THROW(TokenizerError, path.string(), ": ", key, ": expected true or false");
    }
    return config[key].get<bool>();
  };
  std::vector<int32_t> prefix, suffix;
  const auto id_of = [&](const char* key) {
    const std::string text = config_token(config, key);
    const int32_t id = text.empty() ? -1 : tok.token_id(text);
    if (id < 0) {
      HYSERVE_THROW(TokenizerError, path.string(), ": ", key, " '", text,
                    "' is not a token of the tokenizer");
    }
    return id;
  };
  if (flag("add_bos_token", true)) prefix.push_back(id_of("bos_token"));
  if (flag("add_eos_token", false)) suffix.push_back(id_of("eos_token"));
  tok.set_special_affixes(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  if (std::filesystem::exists(model_dir / "tiktoken.model")) {
    return TiktokenTokenizer::load(model_dir);
  }
  if (std::filesystem::exists(model_dir / "tokenizer.json")) {
    std::unique_ptr<Tokenizer> tok = HfBpeTokenizer::load(model_dir / "tokenizer.json");
    apply_llama_affixes(model_dir, *tok);
    return tok;
  }
  HYSERVE_THROW(TokenizerError, model_dir.string(),
                ": no tokenizer (neither tiktoken.model nor tokenizer.json)");
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text,
                                              bool add_special_tokens) const {
  std::vector<int32_t> ids = encode(text, /*allow_special=*/true);
  if (!add_special_tokens) return ids;
  ids.insert(ids.begin(), special_prefix_.begin(), special_prefix_.end());
  ids.insert(ids.end(), special_suffix_.begin(), special_suffix_.end());
  return ids;
}

std::string Tokenizer::decode_output(std::span<const int32_t> ids, bool skip_special) const {
  if (std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return has_token(id); })) {
    return decode(ids, skip_special);
  }
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (const int32_t id : ids) {
    if (has_token(id)) known.push_back(id);
  }
  return decode(known, skip_special);
}

}  // namespace hyserve
