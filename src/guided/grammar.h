// Grammar: the compiled form of what guided decoding enforces, a graph of value nodes that a
// JsonMatcher walks byte by byte. Built from a JSON Schema (json_schema.h), for "any JSON
// object" (response_format json_object), any JSON value, or a list of literal choices
// (guided_choice).
//
// A node is one of:
//   typed     a set of JSON types, each with its constraints: object (listed properties, which
//             are required, what extra properties may hold), array (prefix items, items,
//             min/max count), string (min/max length in characters)
//   literals  a fixed set of byte strings: the compact JSON text (nlohmann dump) of each
//             enum / const value, or the raw choices of guided_choice
//   any_of    one of several nodes (anyOf, oneOf as anyOf)
// Nodes refer to each other by index, so recursive schemas ($ref to an ancestor) are graphs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "guided/byte_trie.h"

namespace hyserve {

enum JsonType : uint8_t {
  kJsonObject = 1,
  kJsonArray = 2,
  kJsonString = 4,
  kJsonNumber = 8,
  kJsonInteger = 16,  // an integer written without fraction or exponent
  kJsonBoolean = 32,
  kJsonNull = 64,
};
inline constexpr uint8_t kAnyJsonType = 127;

enum class NodeKind : uint8_t { kTyped, kLiterals, kAnyOf };

struct GrammarNode {
  NodeKind kind = NodeKind::kTyped;
  uint8_t types = kAnyJsonType;  // kTyped: JsonType bits

  // object
  std::vector<int32_t> property_nodes;  // [num properties] value node of property i
  uint64_t required = 0;                // bit i: property i must appear
  int32_t key_trie = -1;    // Grammar::trie root of the properties' JSON-escaped names (value i)
  int32_t additional = -1;  // node of properties not listed; -1: none allowed
  // array
  std::vector<int32_t> prefix_items;  // item i < size: this node
  int32_t items = -1;                 // later items; -1: none allowed
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: no limit
  // string
  int64_t min_length = 0;
  int64_t max_length = -1;  // -1: no limit
  // literals
  int32_t literal_trie = -1;  // Grammar::trie root
  // any_of
  std::vector<int32_t> alternatives;

  uint64_t all_properties() const {
    return property_nodes.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << property_nodes.size()) - 1;
  }
};

struct Grammar {
  static constexpr size_t kMaxProperties = 64;  // per object schema (a 64-bit seen set)

  std::vector<GrammarNode> nodes;
  ByteTrie trie;
  int32_t root = -1;
  // The root is a literals node matched as raw bytes (guided_choice): no JSON whitespace
  // before it.
  bool raw_root = false;

  int32_t add_node(GrammarNode node);
  // A typed node accepting any JSON value (objects with any keys, arrays of anything).
  int32_t add_any_value();
  // Copies every node of `other` (a JSON grammar, not raw) into this grammar; returns the
  // node its root became. Composes compiled schemas (forced tool calls: one per tool).
  int32_t embed(const Grammar& other);

  // Any JSON value / any JSON object (response_format json_object) / one of `choices`
  // exactly (guided_choice; InvalidArgument when empty or a choice is empty).
  static Grammar any_value();
  static Grammar any_object();
  static Grammar choices(const std::vector<std::string>& choices);
};

}  // namespace hyserve
