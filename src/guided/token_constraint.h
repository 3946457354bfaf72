// Guided decoding at the token level. TokenConstraint is what a request carries (shared by
// its n choices, immutable): a compiled Grammar and the tokenizer's VocabTrie.
// ConstraintState is one sequence's progress (the engine keeps one per request): a
// JsonMatcher advanced over the request's accepted output tokens, never over anything else,
// so a request preempted and recomputed keeps its state.
//
// Each step, compute_mask() marks the allowed ids: the ordinary tokens whose bytes the matcher
// accepts (found by walking the VocabTrie, skipping rejected subtrees), and the terminators
// (the request's EOS and stop token ids) exactly when the text so far is complete. When the
// structure is finished only terminators are allowed. A state that cannot continue (no token
// fits, which a sound grammar never reaches) allows the terminators so the request ends.
//
// With start_after_token (the reasoning end marker, `</think>`, when a reasoning parser is
// on), nothing is constrained until that token has been generated, as vLLM does; the bytes
// after it must match the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "guided/grammar.h"
#include "guided/json_matcher.h"
#include "guided/vocab_trie.h"

namespace hyserve {

class TokenConstraint {
 public:
  TokenConstraint(Grammar grammar, std::shared_ptr<const VocabTrie> vocab,
                  std::optional<int32_t> start_after_token = std::nullopt);

  const Grammar& grammar() const { return grammar_; }
  const VocabTrie& vocab() const { return *vocab_; }
  std::optional<int32_t> start_after_token() const { return start_after_token_; }

 private:
  Grammar grammar_;
  std::shared_ptr<const VocabTrie> vocab_;
  std::optional<int32_t> start_after_token_;
};

class ConstraintState {
 public:
  explicit ConstraintState(std::shared_ptr<const TokenConstraint> constraint);

  // Advances over output_token_ids[num_consumed()..]: the outputs appended since the last
  // call. `terminators`: the ids that end the request (EOS unless ignore_eos, stop ids).
  void sync(std::span<const int32_t> output_token_ids, std::span<const int32_t> terminators);
  int64_t num_consumed() const { return num_consumed_; }

  bool active() const { return started_; }  // false before start_after_token
  bool accepting() const { return matcher_.accepting(); }
  bool finished() const { return matcher_.finished(); }
  bool dead() const { return failed_ || matcher_.dead(); }

  // allowed[id] = 1 for every allowed id, 0 otherwise; allowed.size() == vocab size.
  void compute_mask(std::span<const int32_t> terminators, std::vector<uint8_t>& allowed);

 private:
  void accept(int32_t token, std::span<const int32_t> terminators);
  bool walk(std::vector<uint8_t>& allowed);  // marks the ordinary tokens; false if none

  std::shared_ptr<const TokenConstraint> constraint_;
  JsonMatcher matcher_;
  int64_t num_consumed_ = 0;
  bool started_ = true;
  bool terminated_ = false;  // a terminator was accepted: nothing more to match
  bool failed_ = false;      // a token outside the grammar was accepted
  // Vocabulary walk scratch, [max_depth + 1] each, reused across steps.
  std::vector<JsonMatcher> walk_;
  std::vector<int> utf8_;
  std::vector<uint32_t> chars_;
  std::vector<size_t> full_;
};

}  // namespace hyserve
