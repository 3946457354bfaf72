#include "guided/grammar.h"

#include "util/error.h"

namespace hyserve {

int32_t Grammar::add_node(GrammarNode node) {
  nodes.push_back(std::move(node));
  return static_cast<int32_t>(nodes.size() - 1);
}

int32_t Grammar::add_any_value() {
  const int32_t id = add_node({});
  GrammarNode& n = nodes[static_cast<size_t>(id)];
  n.additional = id;
  n.items = id;
  return id;
}

int32_t Grammar::embed(const Grammar& other) {
  CHECK(!other.raw_root && other.root >= 0, "Grammar::embed: a JSON grammar with a root");
  const auto node_offset = static_cast<int32_t>(nodes.size());
  const int32_t trie_offset = trie.append(other.trie);
  const auto shift = [](int32_t& id, int32_t offset) {
    if (id >= 0) id += offset;
  };
  for (GrammarNode node : other.nodes) {
    for (int32_t& id : node.property_nodes) shift(id, node_offset);
    for (int32_t& id : node.prefix_items) shift(id, node_offset);
    for (int32_t& id : node.alternatives) shift(id, node_offset);
    shift(node.additional, node_offset);
    shift(node.items, node_offset);
    shift(node.key_trie, trie_offset);
    shift(node.literal_trie, trie_offset);
    nodes.push_back(std::move(node));
  }
  return other.root + node_offset;
}

Grammar Grammar::any_value() {
  Grammar g;
  g.root = g.add_any_value();
  return g;
}

Grammar Grammar::any_object() {
  Grammar g;
  const int32_t any = g.add_any_value();
  GrammarNode object;
  object.types = kJsonObject;
  object.additional = any;
  g.root = g.add_node(std::move(object));
  return g;
}

Grammar Grammar::choices(const std::vector<std::string>& choices) {
  CHECK(!choices.empty(), "guided_choice must list at least one choice");
  Grammar g;
  GrammarNode node;
  node.kind = NodeKind::kLiterals;
  node.literal_trie = g.trie.add_root();
  for (size_t i = 0; i < choices.size(); ++i) {
    CHECK(!choices[i].empty(), "guided_choice: choice ", i, " is an empty string");
    g.trie.insert(node.literal_trie, choices[i], static_cast<int32_t>(i));
  }
  g.root = g.add_node(std::move(node));
  g.raw_root = true;
  return g;
}

}  // namespace hyserve
