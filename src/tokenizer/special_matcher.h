// Finds special/added token strings in text: the leftmost occurrence, the longest one among
// those starting there (tokenizers' aho-corasick LeftmostLongest; tiktoken's alternation of
// special tokens, whose set has no token that is a prefix of another in practice).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve {

class SpecialMatcher {
 public:
  struct Match {
    std::size_t begin;  // byte offset in the text
    std::size_t length;
    int32_t id;
  };

  void add(std::string content, int32_t id);
  bool empty() const { return num_tokens_ == 0; }

  // The first match at or after `from`.
  std::optional<Match> find(std::string_view text, std::size_t from) const;

 private:
  struct Entry {
    std::string content;
    int32_t id;
  };
  std::array<std::vector<Entry>, 256> by_first_byte_;  // each sorted longest first
  std::size_t num_tokens_ = 0;
};

}  // namespace hyserve
