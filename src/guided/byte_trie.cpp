#include "guided/byte_trie.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

int32_t ByteTrie::add_root() {
  nodes_.emplace_back();
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t ByteTrie::append(const ByteTrie& other) {
  const auto offset = static_cast<int32_t>(nodes_.size());
  for (Node node : other.nodes_) {
    for (auto& edge : node.edges) edge.second += offset;
    nodes_.push_back(std::move(node));
  }
  return offset;
}

int32_t ByteTrie::child(int32_t node, uint8_t byte) const {
  const auto& edges = nodes_[static_cast<size_t>(node)].edges;
  const auto it = std::lower_bound(edges.begin(), edges.end(), byte,
                                   [](const auto& e, uint8_t b) { return e.first < b; });
  return it != edges.end() && it->first == byte ? it->second : -1;
}

bool ByteTrie::insert(int32_t root, std::string_view bytes, int32_t value) {
  CHECK(root >= 0 && root < static_cast<int32_t>(nodes_.size()), "ByteTrie: bad root ", root);
  CHECK(value >= 0, "ByteTrie: values must be >= 0, got ", value);
  int32_t node = root;
  for (const char ch : bytes) {
    node = child(node, static_cast<uint8_t>(ch));
    if (node < 0) break;
  }
  if (node >= 0 && nodes_[static_cast<size_t>(node)].value >= 0) return false;
  const uint64_t bit = value < 64 ? uint64_t{1} << value : 0;
  node = root;
  nodes_[static_cast<size_t>(node)].subtree_values |= bit;
  for (const char ch : bytes) {
    const auto byte = static_cast<uint8_t>(ch);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& edges = nodes_[static_cast<size_t>(node)].edges;
      const auto it = std::lower_bound(edges.begin(), edges.end(), byte,
                                       [](const auto& e, uint8_t b) { return e.first < b; });
      edges.insert(it, {byte, next});
    }
    node = next;
    nodes_[static_cast<size_t>(node)].subtree_values |= bit;
  }
  nodes_[static_cast<size_t>(node)].value = value;
  return true;
}

}  // namespace hyserve
