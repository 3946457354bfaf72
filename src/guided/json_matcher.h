// JsonMatcher: a byte-level incremental recognizer for a Grammar (grammar.h). advance() takes
// one byte and says whether the bytes so far are still a prefix of some text the grammar
// accepts; accepting() says whether they already are such a text (EOS may follow), finished()
// whether nothing but EOS may follow. Feeding a text in one call or byte by byte gives the same
// answers. The vocabulary walk copies matchers often, so the state is a few small vectors of
// plain frames.
//
// The state is a pushdown stack of frames, one per open value (object, key, array, string,
// number, keyword, literal); a frame's phase says what may come next. anyOf runs its
// alternatives side by side: the stack is forked when a value of an anyOf node starts, each
// copy continues with one alternative, copies that reject a byte are dropped and identical
// copies are merged.
//
// Text accepted (choices documented in docs/DECISIONS.md):
//   - JSON (RFC 8259) with at most kMaxWhitespace bytes of whitespace in each gap between
//     tokens, none after the top-level value; strings are valid UTF-8 without control bytes;
//     \u escapes take any 4 hex digits.
//   - at most kMaxDepth objects and arrays open at once (the matcher state stays small);
//   - numbers have at most kMaxNumberBytes bytes (plus an exponent that must be finished);
//     an "integer" is written without fraction or exponent.
//   - enum / const values and guided choices match their compact JSON text (raw bytes for
//     choices) exactly.
//   - objects of a schema with listed properties: only listed keys (unless additional
//     properties are allowed), written in their JSON-escaped form, each at most once; the
//     object closes only when every required key is present.
//   - string length limits count characters (an escape is one character).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "guided/grammar.h"

namespace hyserve {

class JsonMatcher {
 public:
  static constexpr int kMaxWhitespace = 4;
  static constexpr uint32_t kMaxNumberBytes = 32;
  static constexpr size_t kMaxDepth = 64;  // open objects and arrays at most

  // `grammar` must outlive the matcher and its copies.
  explicit JsonMatcher(const Grammar& grammar);

  // Consumes one byte; false (and the matcher is dead from then on) when no accepted text
  // continues with it.
  bool advance(uint8_t byte);
  // Consumes the bytes in order; false at the first rejected one.
  bool advance(std::string_view bytes);

  bool accepting() const;
  bool finished() const;
  bool dead() const { return threads_.empty(); }

  // The fast path of the vocabulary walk. Inside a string body (or an extra property's
  // name) with no maxLength, a plain byte (>= 0x20, not '"' or '\') changes only the pending
  // UTF-8 state and the character count. plain_string_utf8() is that UTF-8 state when the
  // matcher is one thread in such a place (-1 otherwise); the walk then follows plain bytes
  // with utf8_next() alone and hands the result back with add_plain_string_progress().
  int plain_string_utf8() const;
  void add_plain_string_progress(uint8_t utf8, uint32_t num_chars);
  static bool is_plain_string_byte(uint8_t b) { return b >= 0x20 && b != '"' && b != '\\'; }
  // The UTF-8 state after byte b (RFC 3629: no overlongs or surrogates); -1 if invalid.
  static int utf8_next(uint8_t state, uint8_t b);

  struct Frame {
    uint8_t kind = 0;
    uint8_t phase = 0;
    uint8_t ws = 0;    // whitespace bytes in the current gap
    uint8_t utf8 = 0;  // strings and keys: the pending UTF-8 sequence (0: none)
    int32_t node = -1;
    int32_t aux = -1;    // literal / key trie node, property index, keyword, integer-only flag
    uint32_t count = 0;  // characters, items, number or keyword bytes
    uint64_t seen = 0;   // objects: listed properties written
    bool operator==(const Frame&) const = default;
  };

 private:
  // kFork: the top frame is an anyOf node (the caller splits the thread); kRetry (between
  // step() and its helpers only): the top frame changed and takes the same byte.
  enum class Step : uint8_t { kOk, kReject, kFork, kRetry };
  using Stack = std::vector<Frame>;

  // Feeds one byte to the frame on top of the stack; one helper per frame kind.
  Step step(Stack& stack, uint8_t byte) const;
  Step step_value(Stack& stack, uint8_t byte) const;
  Step step_literal(Stack& stack, uint8_t byte) const;
  Step step_keyword(Stack& stack, uint8_t byte) const;
  Step step_number(Stack& stack, uint8_t byte) const;
  Step step_string(Stack& stack, uint8_t byte) const;
  Step step_key(Stack& stack, uint8_t byte) const;
  Step step_object(Stack& stack, uint8_t byte) const;
  Step step_array(Stack& stack, uint8_t byte) const;
  bool start_value(Frame& frame, uint8_t byte, size_t depth) const;
  const GrammarNode& node(int32_t id) const { return grammar_->nodes[static_cast<size_t>(id)]; }
  bool advance_forking(uint8_t byte);

  const Grammar* grammar_;
  std::vector<Stack> threads_;  // the alternatives still alive; one without anyOf
};

}  // namespace hyserve
