// VocabTrie: a tokenizer's vocabulary as a byte trie laid out in preorder, built once per
// tokenizer. Guided decoding walks it with a matcher state to find the allowed tokens of a
// step: nodes are visited in array order and a rejected node skips its whole subtree
// (next[node]), so a step costs one matcher byte per live trie node, and the tokens sharing a
// prefix share its matching.
//
//   node i: byte[i] on the edge from its parent, depth[i] (1 = child of the root),
//           subtree = [i, next[i]), tokens ending here = token_ids[token_begin[i] ..
//           token_begin[i + 1]); the subtree's tokens are token_ids[token_begin[i] ..
//           token_begin[next[i]])
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace hyserve {

struct VocabTrie {
  int64_t vocab_size = 0;  // ids are < vocab_size
  size_t max_depth = 0;    // bytes of the longest token
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<int32_t> next;
  std::vector<int32_t> token_begin;  // [num_nodes + 1]
  std::vector<int32_t> token_ids;
  // Bit u of string_safe[i]: from UTF-8 state u (JsonMatcher::utf8_next) before byte[i],
  // every path through node i's subtree stays inside a JSON string body (plain bytes, valid
  // UTF-8). Inside a string the walk then allows the subtree's tokens without visiting it.
  std::vector<uint8_t> string_safe;
  std::vector<std::string> token_bytes;  // [vocab_size]; empty: left out

  // The bytes of an ordinary token; empty for ids left out or out of range.
  std::string_view bytes_of(int32_t token) const {
    return token >= 0 && token < vocab_size
               ? std::string_view(token_bytes[static_cast<size_t>(token)])
               : std::string_view();
  }

  size_t num_nodes() const { return byte.size(); }

  // token_bytes[id]: the bytes of token id; an empty string leaves the id out (it is never
  // allowed inside a structure). Tokens longer than 65,535 bytes are left out.
  static VocabTrie build(std::span<const std::string> token_bytes);
  // The ordinary tokens of `tokenizer` with their bytes; added and special tokens (<think>,
  // <|im_end|>, ...) and unassigned ids are left out. vocab_size: the model's (>= the
  // tokenizer's; ids beyond the tokenizer's are left out).
  static VocabTrie from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size);
};

}  // namespace hyserve
