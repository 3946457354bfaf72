// DeepSeek's tokenizer: a Hugging Face tokenizer.json with a byte-level BPE model, bit-exact
// with tokenizers' Tokenizer.encode(text, add_special_tokens=False) and decode().
//
// Supported (anything else is refused with a TokenizerError naming the field):
//   normalizer     null, or a Sequence with no normalizers
//   pre_tokenizer  ByteLevel(add_prefix_space=false, use_regex=true|false), alone or last in
//                  a Sequence after Split(pattern {Regex|String}, behavior Isolated,
//                  invert false) steps
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token,
//                  ignore_merges; dropout null, no byte_fallback / fuse_unk / subword affixes
//   added_tokens   {id, content, special, normalized}; single_word / lstrip / rstrip false
//   decoder        ByteLevel
//   post_processor ignored: encode() adds no BOS/EOS (the chat template places them)
//
// Encoding: the text is split at added tokens (those with normalized=false first, then the
// others in what remains; leftmost-longest), each remaining segment is cut by the Split
// regexes in turn (matches and the gaps between them both become pieces) and by GPT-2's
// regex when ByteLevel has use_regex; each piece's bytes are BPE-merged by merge rank
// (lowest rank first, leftmost on ties). Working on bytes is the same as tokenizers working
// on the GPT-2 byte-to-unicode characters, one per byte.
#pragma once

#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/special_matcher.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"

namespace hyserve {

class HfBpeTokenizer final : public Tokenizer {
 public:
  // Throws TokenizerError naming the file and field.
  static std::unique_ptr<HfBpeTokenizer> load(const std::filesystem::path& tokenizer_json);

  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t token_id(std::string_view special) const override;
  bool is_special(int32_t id) const override;
  bool has_token(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }

  // The pieces BPE runs on for text without added tokens (tokenizers'
  // pre_tokenizer.pre_tokenize_str, as bytes rather than byte-level characters).
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

 private:
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Token {
    std::string bytes;  // what decode() emits
    bool assigned = false;
    bool special = false;
  };
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  class Loader;  // load()'s steps, in hf_bpe_tokenizer.cpp

  HfBpeTokenizer() = default;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  std::vector<Token> tokens_;  // [vocab_size] by id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> byte_vocab_;  // bytes->id
  std::array<int32_t, 256> byte_ids_{};         // id of each single byte, -1 when absent
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids_;
  SpecialMatcher raw_added_;                         // added tokens with normalized=false
  SpecialMatcher normalized_added_;                  // the others
  std::vector<std::unique_ptr<SplitRegex>> splits_;  // applied in order, Isolated
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
};

}  // namespace hyserve
