// Kimi's tokenizer: a tiktoken-format byte-level BPE, bit-exact with
// tiktoken.Encoding(pat_str=<Kimi split regex>, mergeable_ranks=..., special_tokens=...).
//
// Files (in the model folder):
//   tiktoken.model         one "base64(token bytes) rank" per line; ranks 0..N-1, dense, every
//                          single byte present
//   tokenizer_config.json  optional; "added_tokens_decoder" {"<id>": {"content", "special"}}
//                          names the reserved special tokens
//
// Ids:
//   [0, N)         the base vocabulary: id = rank
//   [N, N + 256)   reserved special tokens. Named by added_tokens_decoder when the config has
//                  it (other slots "<|reserved_token_<id>|>", as tokenization_kimi.py does),
//                  else by Kimi K2's layout (kKimiDefaultSpecialTokens below).
//
// Encoding: text is split at special tokens (when allowed), each ordinary segment is cut into
// pieces by the split regex, and each piece becomes one token when its bytes are in the
// vocabulary, else BPE: repeatedly merge the adjacent pair whose concatenation has the lowest
// rank (leftmost on ties) until no adjacent pair is in the vocabulary.
// Unlike tokenization_kimi.py, runs longer than 25,000 characters are not cut before encoding
// (tiktoken itself, which this matches, does not cut them).
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

// Kimi's split regex (tokenization_kimi.py) with the `&&[^\p{Han}]` class intersections
// rewritten as (?!\p{Han}) lookaheads; to_pcre2_pattern() translates the rest.
extern const std::string_view kKimiSplitPattern;

struct KimiSpecialToken {
  int offset;  // id - N
  std::string_view content;
  bool special;  // false: decode(skip_special=true) keeps it
};

// The named slots when tokenizer_config.json gives none (Kimi K2's ids with N = 163,584:
// [BOS] 163584, [EOS] 163585, <|im_end|> 163586, ..., <think> 163606, </think> 163607).
// <think> and </think> are not skipped by skip_special, so reasoning parsers still see them.
extern const std::array<KimiSpecialToken, 23> kKimiDefaultSpecialTokens;

class TiktokenTokenizer final : public Tokenizer {
 public:
  static constexpr int kNumReservedSpecial = 256;

  // Throws TokenizerError naming the file and line or field.
  static std::unique_ptr<TiktokenTokenizer> load(const std::filesystem::path& model_dir);

  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t token_id(std::string_view special) const override;
  bool is_special(int32_t id) const override;
  bool has_token(int32_t id) const override;
  int64_t vocab_size() const override { return num_base_ + kNumReservedSpecial; }

  // The pieces BPE runs on for ordinary text (no special-token handling): the split regex's
  // matches (text between matches is dropped, as in tiktoken; Kimi's regex matches everything).
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

  // N: the number of ranks in tiktoken.model.
  int32_t num_base_tokens() const { return num_base_; }

 private:
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct SpecialToken {
    std::string content;
    bool special;
  };

  TiktokenTokenizer();
  void encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  int32_t rank_of(std::string_view bytes) const;  // -1 when absent

  int32_t num_base_ = 0;
  std::vector<std::string> token_bytes_;  // [N] bytes of each base id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;
  std::vector<SpecialToken> specials_;  // [256] slot i is id N + i
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> special_ids_;
  SpecialMatcher special_matcher_;
  SplitRegex split_regex_;
};

}  // namespace hyserve
