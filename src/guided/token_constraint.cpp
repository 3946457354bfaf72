#include "guided/token_constraint.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

TokenConstraint::TokenConstraint(Grammar grammar, std::shared_ptr<const VocabTrie> vocab,
                                 std::optional<int32_t> start_after_token)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      start_after_token_(start_after_token) {
  CHECK(vocab_ != nullptr, "TokenConstraint: no vocabulary");
}

ConstraintState::ConstraintState(std::shared_ptr<const TokenConstraint> constraint)
    : constraint_(std::move(constraint)), matcher_(constraint_->grammar()) {
  started_ = !constraint_->start_after_token().has_value();
}

void ConstraintState::accept(int32_t token, std::span<const int32_t> terminators) {
  if (!started_) {
    started_ = token == *constraint_->start_after_token();
    return;
  }
  if (terminated_ || dead()) return;
  if (std::find(terminators.begin(), terminators.end(), token) != terminators.end()) {
    terminated_ = true;
    return;
  }
  const std::string_view bytes = constraint_->vocab().bytes_of(token);
  // A token outside the mask (a special token, or bytes the matcher rejects) leaves the
  // state dead: only terminators from now on.
  if (bytes.empty() || !matcher_.advance(bytes)) failed_ = true;
}

void ConstraintState::sync(std::span<const int32_t> output_token_ids,
                           std::span<const int32_t> terminators) {
  CHECK(static_cast<int64_t>(output_token_ids.size()) >= num_consumed_,
        "ConstraintState: the outputs shrank from ", num_consumed_, " to ", output_token_ids.size(),
        " tokens");
  for (size_t i = static_cast<size_t>(num_consumed_); i < output_token_ids.size(); ++i)
    accept(output_token_ids[i], terminators);
  num_consumed_ = static_cast<int64_t>(output_token_ids.size());
}

// Preorder over the trie: walk_[d] is the matcher after the path to the current node at depth
// d. Inside a plain string the walk follows UTF-8 states only (utf8_[d], chars_[d]) and keeps
// the last full matcher's depth in full_[d]; a matcher is materialized only for bytes that
// leave the plain string, and subtrees that never leave it (VocabTrie::string_safe) are
// allowed whole without a visit.
bool ConstraintState::walk(std::vector<uint8_t>& allowed) {
  const VocabTrie& vocab = constraint_->vocab();
  const size_t levels = vocab.max_depth + 1;
  if (walk_.size() < levels) {
    walk_.assign(levels, matcher_);
    utf8_.assign(levels, -1);
    chars_.assign(levels, 0);
    full_.assign(levels, 0);
  }
  walk_[0] = matcher_;
  utf8_[0] = matcher_.plain_string_utf8();
  chars_[0] = 0;
  full_[0] = 0;
  bool any = false;
  const size_t num_nodes = vocab.num_nodes();
  for (size_t i = 0; i < num_nodes;) {
    const size_t d = vocab.depth[i];
    const uint8_t b = vocab.byte[i];
    if (utf8_[d - 1] >= 0 && ((vocab.string_safe[i] >> utf8_[d - 1]) & 1)) {
      // The whole subtree stays inside the string: allow its tokens, skip it.
      const int32_t end = vocab.token_begin[static_cast<size_t>(vocab.next[i])];
      for (int32_t k = vocab.token_begin[i]; k < end; ++k)
        allowed[static_cast<size_t>(vocab.token_ids[static_cast<size_t>(k)])] = 1;
      any = any || end > vocab.token_begin[i];
      i = static_cast<size_t>(vocab.next[i]);
      continue;
    }
    if (utf8_[d - 1] >= 0 && JsonMatcher::is_plain_string_byte(b)) {
      const int next = JsonMatcher::utf8_next(static_cast<uint8_t>(utf8_[d - 1]), b);
      if (next < 0) {
        i = static_cast<size_t>(vocab.next[i]);
        continue;
      }
      utf8_[d] = next;
      chars_[d] = chars_[d - 1] + (next == 0 ? 1 : 0);
      full_[d] = full_[d - 1];
    } else {
      const size_t base = full_[d - 1];
      walk_[d] = walk_[base];
      if (base != d - 1) {
        walk_[d].add_plain_string_progress(static_cast<uint8_t>(utf8_[d - 1]), chars_[d - 1]);
      }
      if (!walk_[d].advance(b)) {
        i = static_cast<size_t>(vocab.next[i]);
        continue;
      }
      utf8_[d] = walk_[d].plain_string_utf8();
      chars_[d] = 0;
      full_[d] = d;
    }
    for (int32_t k = vocab.token_begin[i]; k < vocab.token_begin[i + 1]; ++k) {
      allowed[static_cast<size_t>(vocab.token_ids[static_cast<size_t>(k)])] = 1;
      any = true;
    }
    ++i;
  }
  return any;
}

void ConstraintState::compute_mask(std::span<const int32_t> terminators,
                                   std::vector<uint8_t>& allowed) {
  const VocabTrie& vocab = constraint_->vocab();
  if (!started_) {
    allowed.assign(static_cast<size_t>(vocab.vocab_size), 1);
    return;
  }
  allowed.assign(static_cast<size_t>(vocab.vocab_size), 0);
  bool any = false;
  if (!terminated_ && !dead() && !matcher_.finished()) any = walk(allowed);
  const bool stop_ok = terminated_ || dead() || matcher_.accepting() || !any;
  for (int32_t t : terminators) {
    if (t < 0 || t >= vocab.vocab_size) continue;
    allowed[static_cast<size_t>(t)] = stop_ok ? 1 : 0;
  }
}

}  // namespace hyserve
