#include "guided/json_schema.h"

#include <map>
#include <set>
#include <string_view>

namespace hyserve {
namespace {

using nlohmann::ordered_json;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default",  "examples",  "$comment", "$schema",
    "$id",   "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions"};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required",
                                                            "additionalProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "prefixItems", "minItems",
                                                           "maxItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength"};
const std::set<std::string, std::less<>> kOtherKeywords = {"type",  "enum",  "const", "anyOf",
                                                           "oneOf", "allOf", "$ref"};

constexpr int kMaxSchemaDepth = 64;

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

uint8_t type_bit(const std::string& name) {
  if (name == "object") return kJsonObject;
  if (name == "array") return kJsonArray;
  if (name == "string") return kJsonString;
  if (name == "number") return kJsonNumber;
  if (name == "integer") return kJsonInteger;
  if (name == "boolean") return kJsonBoolean;
  if (name == "null") return kJsonNull;
  return 0;
}

bool value_has_type(const ordered_json& v, uint8_t types) {
  if (v.is_object()) return types & kJsonObject;
  if (v.is_array()) return types & kJsonArray;
  if (v.is_string()) return types & kJsonString;
  if (v.is_boolean()) return types & kJsonBoolean;
  if (v.is_null()) return types & kJsonNull;
  if (v.is_number_integer()) return types & (kJsonInteger | kJsonNumber);
  return types & kJsonNumber;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const ordered_json& root) : root_(root) {}

  Grammar run() {
    if (root_.is_object() && root_.contains("$ref")) {
      g_.root = compile(root_, "");
    } else {
      g_.root = g_.add_node({});
      refs_["#"] = g_.root;
      compile_into(g_.root, root_, "");
    }
    check_any_of_cycles();
    return std::move(g_);
  }

 private:
  // The node of schema `s` (a $ref resolves to its target's node).
  int32_t compile(const ordered_json& s, const std::string& path) {
    if (s.is_object() && s.contains("$ref")) {
      for (const auto& [key, value] : s.items()) {
        if (key != "$ref" && !kAnnotations.contains(key)) {
          throw SchemaError(join(path, key), "'" + key + "' next to '$ref' is not supported");
        }
      }
      return resolve(s["$ref"], join(path, "$ref"));
    }
    const int32_t id = g_.add_node({});
    compile_into(id, s, path);
    return id;
  }

  int32_t resolve(const ordered_json& ref_value, const std::string& path) {
    if (!ref_value.is_string()) throw SchemaError(path, "'$ref' must be a string");
    const std::string ref = ref_value.get<std::string>();
    if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
    if (resolving_.contains(ref)) throw SchemaError(path, "'$ref' cycle through '" + ref + "'");
    const ordered_json* target = nullptr;
    std::string target_path;
    for (const std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
      if (!ref.starts_with(prefix)) continue;
      std::string name = ref.substr(prefix.size());
      for (size_t p = 0; (p = name.find('~', p)) != std::string::npos; ++p) {
        if (p + 1 < name.size() && name[p + 1] == '1')
          name.replace(p, 2, "/");
        else if (p + 1 < name.size() && name[p + 1] == '0')
          name.replace(p, 2, "~");
      }
      const std::string container(prefix.substr(2, prefix.size() - 3));
      if (root_.is_object() && root_.contains(container) && root_[container].is_object() &&
          root_[container].contains(name)) {
        target = &root_[container][name];
        target_path = container + "." + name;
      }
    }
    if (ref == "#") {
      target = &root_;
      target_path = "";
    }
    if (target == nullptr) {
      throw SchemaError(path, "'$ref' '" + ref +
                                  "' is not supported: refer to \"#\", \"#/$defs/NAME\" or "
                                  "\"#/definitions/NAME\" of this schema");
    }
    if (target->is_object() && target->contains("$ref")) {
      resolving_.insert(ref);
      const int32_t id = compile(*target, target_path);
      resolving_.erase(ref);
      refs_[ref] = id;
      return id;
    }
    const int32_t id = g_.add_node({});
    refs_[ref] = id;
    compile_into(id, *target, target_path);
    return id;
  }

  int32_t any_node() {
    if (any_ < 0) any_ = g_.add_any_value();
    return any_;
  }

  static int64_t get_count(const ordered_json& v, const std::string& path) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      throw SchemaError(path, "'" + path + "' must be a non-negative integer");
    }
    return v.get<int64_t>();
  }

  // `false` -> -1 (nothing allowed), `true` -> any value, else the schema's node.
  int32_t compile_optional(const ordered_json& v, const std::string& path) {
    if (v.is_boolean()) return v.get<bool>() ? any_node() : -1;
    return compile(v, path);
  }

  // Which keyword families a schema object uses besides annotations; unknown keywords are
  // refused.
  struct KeywordFamilies {
    bool object = false;
    bool array = false;
    bool string = false;
  };

  static KeywordFamilies check_keywords(const ordered_json& s, const std::string& path) {
    KeywordFamilies families;
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.contains(key)) continue;
      if (kObjectKeywords.contains(key)) {
        families.object = true;
      } else if (kArrayKeywords.contains(key)) {
        families.array = true;
      } else if (kStringKeywords.contains(key)) {
        families.string = true;
      } else if (!kOtherKeywords.contains(key)) {
        throw SchemaError(join(path, key),
                          "unsupported JSON Schema keyword '" + key +
                              "': guided decoding supports type, properties, required, "
                              "additionalProperties, enum, const, items, prefixItems, minItems, "
                              "maxItems, minLength, maxLength, anyOf, oneOf, allOf (one "
                              "subschema) and $ref");
      }
    }
    return families;
  }

  // Refuses every keyword of `s` but `keyword`, annotations and (when allowed) "type".
  static void check_only(const ordered_json& s, const std::string& path, std::string_view keyword,
                         bool allow_type) {
    for (const auto& [key, value] : s.items()) {
      if (key == keyword || kAnnotations.contains(key) || (allow_type && key == "type")) continue;
      throw SchemaError(join(path, key),
                        "'" + key + "' next to '" + std::string(keyword) + "' is not supported");
    }
  }

  // allOf (one subschema), anyOf or oneOf into an anyOf node `n`; false when `s` has none.
  bool compile_alternatives(const ordered_json& s, const std::string& path, GrammarNode& n) {
    if (s.contains("allOf")) {
      check_only(s, path, "allOf", false);
      const auto& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        throw SchemaError(join(path, "allOf"), "'allOf' is supported with one subschema only");
      }
      n.kind = NodeKind::kAnyOf;
      n.alternatives.push_back(compile(all[0], join(path, "allOf.0")));
      return true;
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!s.contains(keyword)) continue;
      check_only(s, path, keyword, false);
      const auto& alternatives = s[keyword];
      const std::string p = join(path, keyword);
      if (!alternatives.is_array() || alternatives.empty()) {
        throw SchemaError(p, "'" + std::string(keyword) + "' must be a non-empty list of schemas");
      }
      n.kind = NodeKind::kAnyOf;
      for (size_t i = 0; i < alternatives.size(); ++i) {
        n.alternatives.push_back(compile(alternatives[i], join(p, std::to_string(i))));
      }
      return true;
    }
    return false;
  }

  // The type bits of `s`: its "type", else those its keywords imply, else any type.
  static uint8_t schema_types(const ordered_json& s, const std::string& path,
                              const KeywordFamilies& families) {
    if (!s.contains("type")) {
      if (!families.object && !families.array && !families.string) return kAnyJsonType;
      return static_cast<uint8_t>((families.object ? kJsonObject : 0) |
                                  (families.array ? kJsonArray : 0) |
                                  (families.string ? kJsonString : 0));
    }
    const auto& t = s["type"];
    const std::string p = join(path, "type");
    std::vector<ordered_json> names =
        t.is_array() ? t.get<std::vector<ordered_json>>() : std::vector<ordered_json>{t};
    uint8_t types = 0;
    for (const auto& name : names) {
      const uint8_t bit = name.is_string() ? type_bit(name.get<std::string>()) : 0;
      if (bit == 0) throw SchemaError(p, "unknown type " + name.dump());
      types |= bit;
    }
    if (types == 0) throw SchemaError(p, "'type' lists no type");
    return types;
  }

  // enum or const into a literals node `n`: the values of the allowed types.
  void compile_literals(const ordered_json& s, const std::string& path, uint8_t types,
                        GrammarNode& n) {
    const char* keyword = s.contains("enum") ? "enum" : "const";
    check_only(s, path, keyword, true);
    const std::string p = join(path, keyword);
    std::vector<ordered_json> values;
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) throw SchemaError(p, "'enum' must be a list");
      values = s["enum"].get<std::vector<ordered_json>>();
    } else {
      values.push_back(s["const"]);
    }
    n.kind = NodeKind::kLiterals;
    n.literal_trie = g_.trie.add_root();
    int32_t count = 0;
    for (const auto& v : values) {
      if (!value_has_type(v, types)) continue;
      g_.trie.insert(n.literal_trie, v.dump(), count++);
    }
    if (count == 0) throw SchemaError(p, "'" + std::string(keyword) + "' allows no value");
  }

  // properties, additionalProperties and required.
  void compile_object_keywords(const ordered_json& s, const std::string& path, GrammarNode& n) {
    if (s.contains("properties")) {
      const auto& props = s["properties"];
      const std::string p = join(path, "properties");
      if (!props.is_object()) throw SchemaError(p, "'properties' must be an object");
      if (props.size() > Grammar::kMaxProperties) {
        throw SchemaError(p, "more than 64 properties in one object are not supported");
      }
      n.key_trie = g_.trie.add_root();
      int32_t i = 0;
      for (const auto& [name, sub] : props.items()) {
        const std::string encoded = ordered_json(name).dump();
        g_.trie.insert(n.key_trie, std::string_view(encoded).substr(1, encoded.size() - 2), i++);
        n.property_nodes.push_back(compile(sub, join(p, name)));
      }
      n.additional = -1;
    } else {
      n.additional = any_node();
    }
    if (s.contains("additionalProperties")) {
      n.additional =
          compile_optional(s["additionalProperties"], join(path, "additionalProperties"));
    }
    if (s.contains("required")) n.required = required_mask(s, join(path, "required"));
  }

  // The bit of each required property's index in "properties".
  static uint64_t required_mask(const ordered_json& s, const std::string& p) {
    const auto& required = s["required"];
    if (!required.is_array()) throw SchemaError(p, "'required' must be a list of names");
    const auto& props = s.contains("properties") ? s["properties"] : ordered_json::object();
    uint64_t mask = 0;
    for (const auto& name : required) {
      if (!name.is_string()) throw SchemaError(p, "'required' must be a list of names");
      int32_t index = 0;
      bool found = false;
      for (const auto& [key, value] : props.items()) {
        if (key == name.get<std::string>()) {
          found = true;
          break;
        }
        ++index;
      }
      if (!found) {
        throw SchemaError(p, "required property " + name.dump() +
                                 " is not listed in 'properties' (not supported)");
      }
      mask |= uint64_t{1} << index;
    }
    return mask;
  }

  // prefixItems, items, minItems and maxItems.
  void compile_array_keywords(const ordered_json& s, const std::string& path, uint8_t types,
                              GrammarNode& n) {
    if (s.contains("prefixItems")) {
      const auto& prefix = s["prefixItems"];
      const std::string p = join(path, "prefixItems");
      if (!prefix.is_array()) throw SchemaError(p, "'prefixItems' must be a list of schemas");
      for (size_t i = 0; i < prefix.size(); ++i) {
        n.prefix_items.push_back(compile(prefix[i], join(p, std::to_string(i))));
      }
    }
    n.items = s.contains("items") ? compile_optional(s["items"], join(path, "items")) : any_node();
    if (s.contains("minItems")) n.min_items = get_count(s["minItems"], join(path, "minItems"));
    if (s.contains("maxItems")) n.max_items = get_count(s["maxItems"], join(path, "maxItems"));
    const int64_t most_items =
        n.items >= 0 ? n.max_items : static_cast<int64_t>(n.prefix_items.size());
    if ((types & kJsonArray) && most_items >= 0 &&
        (n.min_items > most_items || (n.max_items >= 0 && n.min_items > n.max_items))) {
      throw SchemaError(join(path, "minItems"), "minItems is more than the array can hold");
    }
  }

  // minLength and maxLength.
  static void compile_string_keywords(const ordered_json& s, const std::string& path,
                                      GrammarNode& n) {
    if (s.contains("minLength")) n.min_length = get_count(s["minLength"], join(path, "minLength"));
    if (s.contains("maxLength")) n.max_length = get_count(s["maxLength"], join(path, "maxLength"));
    if (n.max_length >= 0 && n.min_length > n.max_length) {
      throw SchemaError(join(path, "minLength"), "minLength is more than maxLength");
    }
  }

  // Schema `s` into node `id` (already added, so a $ref to it can point there first).
  void compile_into(int32_t id, const ordered_json& s, const std::string& path) {
    struct Nesting {
      int& depth;
      explicit Nesting(int& d) : depth(++d) {}
      ~Nesting() { --depth; }
    } nesting(depth_);
    if (depth_ > kMaxSchemaDepth) {
      throw SchemaError(
          path, "the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    }
    GrammarNode n;
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError(path, "the schema 'false' accepts nothing");
      n.additional = any_node();
      n.items = any_node();
      g_.nodes[static_cast<size_t>(id)] = std::move(n);
      return;
    }
    if (!s.is_object()) throw SchemaError(path, "a schema must be an object or a boolean");
    const KeywordFamilies families = check_keywords(s, path);
    if (compile_alternatives(s, path, n)) {
      g_.nodes[static_cast<size_t>(id)] = std::move(n);
      return;
    }
    const uint8_t types = schema_types(s, path, families);
    if (s.contains("enum") || s.contains("const")) {
      compile_literals(s, path, types, n);
      g_.nodes[static_cast<size_t>(id)] = std::move(n);
      return;
    }
    n.types = types;
    compile_object_keywords(s, path, n);
    compile_array_keywords(s, path, types, n);
    compile_string_keywords(s, path, n);
    g_.nodes[static_cast<size_t>(id)] = std::move(n);
  }

  // A value of an anyOf node forks into its alternatives; an alternative that leads back to
  // the same anyOf node without consuming a byte would fork forever.
  void check_any_of_cycles() const {
    for (size_t start = 0; start < g_.nodes.size(); ++start) {
      if (g_.nodes[start].kind != NodeKind::kAnyOf) continue;
      std::vector<int32_t> stack(g_.nodes[start].alternatives);
      std::set<int32_t> visited;
      while (!stack.empty()) {
        const int32_t id = stack.back();
        stack.pop_back();
        if (static_cast<size_t>(id) == start) {
          throw SchemaError("", "an anyOf / oneOf / allOf refers to itself without nesting");
        }
        if (!visited.insert(id).second) continue;
        const GrammarNode& n = g_.nodes[static_cast<size_t>(id)];
        if (n.kind == NodeKind::kAnyOf)
          stack.insert(stack.end(), n.alternatives.begin(), n.alternatives.end());
      }
    }
  }

  const ordered_json& root_;
  Grammar g_;
  std::map<std::string, int32_t> refs_;
  std::set<std::string> resolving_;
  int32_t any_ = -1;
  int depth_ = 0;  // compile_into calls in progress
};

}  // namespace

Grammar compile_json_schema(const ordered_json& schema) {
  return SchemaCompiler(schema).run();
}

}  // namespace hyserve
