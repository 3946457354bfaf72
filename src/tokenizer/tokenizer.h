// Text <-> token ids for the served checkpoint, bit-exact with the Python packages the
// checkpoints ship for: tiktoken (Kimi: tiktoken.model) and Hugging Face tokenizers
// (DeepSeek: tokenizer.json, byte-level BPE).
//
// encode() never adds BOS/EOS or other template tokens: the chat template places them.
// Token ids are int32_t; decode() returns raw bytes, which may end inside a UTF-8 character
// (use replace_invalid_utf8 from utf8.h, or StreamingDetokenizer, for text).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace hyserve {

// A tokenizer file that cannot be read or uses a component we do not implement; the message
// names the file and the line or field.
class TokenizerError : public Error {
 public:
  using Error::Error;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads <model_dir>/tiktoken.model (plus tokenizer_config.json when present) if it exists,
  // else <model_dir>/tokenizer.json. Throws TokenizerError.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& model_dir);

  // `text` must be valid UTF-8 (InvalidArgument otherwise). With allow_special, special-token
  // strings in the text become their ids (tiktoken allowed_special="all"; tokenizers'
  // default); without, they are encoded as ordinary text (tiktoken disallowed_special=();
  // tokenizers' encode_special_tokens=True). Non-special added tokens of a tokenizer.json
  // are always matched, as in tokenizers.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special) const = 0;

  // The bytes of `ids` concatenated; special tokens as their text unless skip_special (then
  // dropped). Throws InvalidArgument for an id outside [0, vocab_size()) or unassigned.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;

  // The id of an added/special token given by its exact text, or -1.
  virtual int32_t token_id(std::string_view special) const = 0;

  // True for ids that decode(..., skip_special=true) drops.
  virtual bool is_special(int32_t id) const = 0;

  // True for ids in [0, vocab_size()) that have a token. A checkpoint's embedding may have more
  // rows than its tokenizer has tokens (DeepSeek-V3: 129,280 rows, fewer tokens), so a model
  // can sample an id this is false for.
  virtual bool has_token(int32_t id) const = 0;

  // decode() of the ids that have a token, the others dropped: the text of model output, where
  // an id without a token reads as nothing (as Hugging Face tokenizers' decode and vLLM's
  // detokenizer do) instead of failing the request. Client-given ids use decode().
  std::string decode_output(std::span<const int32_t> ids, bool skip_special) const;

  // One past the largest id.
  virtual int64_t vocab_size() const = 0;

  // The ids a Hugging Face tokenizer's encode(text, add_special_tokens=True) puts before and
  // after the text: tokenizer.json's post-processor (TemplateProcessing), or, for
  // LlamaTokenizer(Fast) in tokenizer_config.json, its add_bos_token (default true) and
  // add_eos_token (default false). vLLM's add_special_tokens (on by default for completions'
  // text prompts and /tokenize's prompt) adds them; none for tiktoken.model.
  const std::vector<int32_t>& special_prefix() const { return special_prefix_; }
  const std::vector<int32_t>& special_suffix() const { return special_suffix_; }
  void set_special_affixes(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
    special_prefix_ = std::move(prefix);
    special_suffix_ = std::move(suffix);
  }
  // encode(text, allow_special), inside the special prefix and suffix when add_special_tokens.
  std::vector<int32_t> encode_prompt(std::string_view text, bool add_special_tokens) const;

 private:
  std::vector<int32_t> special_prefix_, special_suffix_;
};

}  // namespace hyserve
