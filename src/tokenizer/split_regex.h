// The pre-tokenizer regex: finds the pieces BPE runs on. PCRE2 (UTF + UCP, JIT when the
// library has it) stands in for the engines the Python packages use: Rust's regex /
// fancy-regex (tiktoken) and Oniguruma (tokenizers).
//
// Patterns are written in those engines' syntax and translated where PCRE2 reads the same
// text differently:
//   \s, \S         -> the Unicode White_Space set, spelled out (PCRE2's \s also takes U+180E)
//   \p{Name}       -> \p{sc:Name} for multi-letter names: a script, not PCRE2's default
//                     Script_Extensions (which would put 、 and 。 into \p{Han})
// and refused where a silent difference would follow: `&&` class intersections (rewrite them
// as lookaheads), \S inside a class, and \h / \H (a hex digit in Oniguruma).
//
// Letters assigned after Unicode 14 (PCRE2 10.42's tables) may be classified differently
// than by the Python packages' newer tables.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyserve {

// [begin, end) byte offsets of one match.
using MatchSpan = std::pair<std::size_t, std::size_t>;

class SplitRegex {
 public:
  // Throws InvalidArgument naming the pattern and PCRE2's message when it does not compile.
  explicit SplitRegex(std::string_view pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Every non-empty, non-overlapping match of `text` (valid UTF-8), left to right, each
  // search starting where the previous match ended. Thread-safe.
  std::vector<MatchSpan> find_all(std::string_view text) const;

  // The pattern as given to PCRE2.
  const std::string& pcre2_pattern() const { return pcre2_pattern_; }

 private:
  struct Compiled;
  std::string pcre2_pattern_;
  std::unique_ptr<Compiled> compiled_;
};

// The translation described above; throws InvalidArgument for the refused constructs.
std::string to_pcre2_pattern(std::string_view pattern);

}  // namespace hyserve
