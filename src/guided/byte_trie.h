// ByteTrie: a small trie of byte strings with an integer value at each string's end, used by
// guided decoding for the literal values of enum / const / guided_choice and for an object
// schema's property names. Several tries share one node array; each has its own root.
// Each node also keeps the set of values (those < 64) ending in its subtree, so a matcher can
// tell whether a path still leads to a property it may write.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace hyserve {

class ByteTrie {
 public:
  int32_t add_root();
  // Inserts `bytes` below `root` with `value` (>= 0) at its end. Returns false, and changes
  // nothing, when the string is already there.
  bool insert(int32_t root, std::string_view bytes, int32_t value);
  // Appends every node of `other` (all its tries); returns the offset added to its node ids,
  // so a root r of `other` is r + offset here.
  int32_t append(const ByteTrie& other);

  int32_t child(int32_t node, uint8_t byte) const;  // -1 when there is no such edge
  int32_t value(int32_t node) const { return nodes_[static_cast<size_t>(node)].value; }
  bool has_children(int32_t node) const { return !nodes_[static_cast<size_t>(node)].edges.empty(); }
  // Bit v set when a string with value v < 64 ends in the node's subtree (the node included).
  uint64_t subtree_values(int32_t node) const {
    return nodes_[static_cast<size_t>(node)].subtree_values;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // sorted by byte
    int32_t value = -1;
    uint64_t subtree_values = 0;
  };
  std::vector<Node> nodes_;
};

}  // namespace hyserve
