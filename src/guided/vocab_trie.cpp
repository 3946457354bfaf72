#include "guided/vocab_trie.h"

#include <algorithm>
#include <numeric>

#include "guided/json_matcher.h"
#include "util/error.h"

namespace hyserve {

VocabTrie VocabTrie::build(std::span<const std::string> token_bytes) {
  VocabTrie t;
  t.vocab_size = static_cast<int64_t>(token_bytes.size());
  std::vector<int32_t> order;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (!token_bytes[id].empty() && token_bytes[id].size() <= 65535)
      order.push_back(static_cast<int32_t>(id));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)] ||
           (token_bytes[static_cast<size_t>(a)] == token_bytes[static_cast<size_t>(b)] && a < b);
  });
  // Sorted order is preorder: a prefix comes before its extensions. `path` holds the nodes of
  // the previous token; a node's subtree ends when it leaves the path.
  std::vector<int32_t> path;
  std::string_view previous;
  for (int32_t id : order) {
    const std::string_view bytes = token_bytes[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < bytes.size() && common < previous.size() && bytes[common] == previous[common])
      ++common;
    while (path.size() > common) {
      t.next[static_cast<size_t>(path.back())] = static_cast<int32_t>(t.byte.size());
      path.pop_back();
    }
    for (size_t d = common; d < bytes.size(); ++d) {
      path.push_back(static_cast<int32_t>(t.byte.size()));
      t.byte.push_back(static_cast<uint8_t>(bytes[d]));
      t.depth.push_back(static_cast<uint16_t>(d + 1));
      t.next.push_back(-1);
      t.token_begin.push_back(static_cast<int32_t>(t.token_ids.size()));
    }
    t.token_ids.push_back(id);
    t.max_depth = std::max(t.max_depth, bytes.size());
    previous = bytes;
  }
  for (int32_t node : path) t.next[static_cast<size_t>(node)] = static_cast<int32_t>(t.byte.size());
  t.token_begin.push_back(static_cast<int32_t>(t.token_ids.size()));
  // string_safe, children before parents: node i is safe from u when byte[i] is plain, valid
  // from u, and every child is safe from the state after it.
  t.string_safe.assign(t.byte.size(), 0);
  for (size_t i = t.byte.size(); i-- > 0;) {
    if (!JsonMatcher::is_plain_string_byte(t.byte[i])) continue;
    uint8_t safe = 0;
    for (uint8_t u = 0; u < 8; ++u) {
      const int v = JsonMatcher::utf8_next(u, t.byte[i]);
      if (v < 0) continue;
      bool ok = true;
      for (size_t c = i + 1; ok && c < static_cast<size_t>(t.next[i]);
           c = static_cast<size_t>(t.next[c])) {
        ok = (t.string_safe[c] >> v) & 1;
      }
      if (ok) safe = static_cast<uint8_t>(safe | (1u << u));
    }
    t.string_safe[i] = safe;
  }
  t.token_bytes.resize(token_bytes.size());
  for (int32_t id : order)
    t.token_bytes[static_cast<size_t>(id)] = token_bytes[static_cast<size_t>(id)];
  return t;
}

VocabTrie VocabTrie::from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size) {
  CHECK(vocab_size >= 0, "VocabTrie: negative vocab size ", vocab_size);
  const int64_t n = std::min(vocab_size, tokenizer.vocab_size());
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  for (int64_t id = 0; id < n; ++id) {
    const int32_t ids[1] = {static_cast<int32_t>(id)};
    if (!tokenizer.has_token(ids[0])) continue;  // an id without a token
    std::string b = tokenizer.decode(ids, /*skip_special=*/false);
    // An added or special token decodes to its text, which token_id() maps back to it.
    if (tokenizer.is_special(ids[0]) || tokenizer.token_id(b) == ids[0]) continue;
    bytes[static_cast<size_t>(id)] = std::move(b);
  }
  return build(bytes);
}

}  // namespace hyserve
