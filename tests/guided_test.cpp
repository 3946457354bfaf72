// Guided decoding: the JSON matcher on whole texts and byte by byte, every supported JSON
// Schema keyword and the refusal of the others, and the token masks checked against brute
// force (each token's bytes fed to a copy of the state) on a toy vocabulary. The last test
// times one mask step on a vocabulary of the Kimi tokenizer's size (163,840 ids).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "guided/grammar.h"
#include "guided/json_matcher.h"
#include "guided/json_schema.h"
#include "guided/token_constraint.h"
#include "guided/vocab_trie.h"
#include "server/forced_tool_calls.h"
#include "server/openai_protocol.h"

namespace hyserve {
namespace {

using nlohmann::ordered_json;

Grammar schema(const std::string& text) {
  return compile_json_schema(ordered_json::parse(text));
}

// Whole text: accepted as a complete value?
bool matches(const Grammar& g, std::string_view text) {
  JsonMatcher m(g);
  return m.advance(text) && m.accepting();
}

// A prefix of some accepted text?
bool is_prefix(const Grammar& g, std::string_view text) {
  JsonMatcher m(g);
  return m.advance(text);
}

TEST(JsonMatcher, AnyValueAcceptsJsonAndRejectsTheRest) {
  const Grammar g = Grammar::any_value();
  for (const char* ok :
       {"0", "-0", "12", "-3.25e+10", "1E5", "0.5", "true", "false", "null", R"("")",
        R"("a\"b\\c\/\b\f\n\r\t\u00e9")", "\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"", "[]",
        "{}", R"([1,"x",{"a":[null]}])", R"({"a":1,"b":{"c":[true,false]}})",
        "{ \"a\" :  1 ,\n\"b\":[ ]}", " [1]"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {"01",           "-",
                          "1.",           ".5",
                          "1e",           "+1",
                          "tru",          "nul",
                          "True",         R"("\x")",
                          R"("\u12G4")",  "\"a\x01\"",
                          "\"\xc3\x28\"", "\"\xed\xa0\x80\"",
                          "\"\xc0\xaf\"", "[1,]",
                          "[,1]",         R"({"a"})",
                          R"({"a":1,})",  R"({a:1})",
                          "{'a':1}",      "[1 2]",
                          "1 2",          "{}}",
                          "[]]",          "\"abc",
                          "[1",           "1 "}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

TEST(JsonMatcher, ObjectGrammarNeedsAnObjectAtTopLevel) {
  const Grammar g = Grammar::any_object();
  EXPECT_TRUE(matches(g, R"({"k":[1,{"x":"y"}],"k":2})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(is_prefix(g, "["));
  EXPECT_FALSE(is_prefix(g, "\"a\""));
  EXPECT_FALSE(is_prefix(g, "1"));
  JsonMatcher m(g);
  ASSERT_TRUE(m.advance("{\"a\":1}"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.advance(uint8_t{' '}));  // nothing after the top-level value
}

TEST(JsonMatcher, WhitespaceIsBoundedPerGap) {
  const Grammar g = Grammar::any_value();
  const std::string ws(JsonMatcher::kMaxWhitespace, ' ');
  EXPECT_TRUE(matches(g, "[" + ws + "1" + ws + "," + ws + "2" + ws + "]"));
  EXPECT_FALSE(is_prefix(g, "[" + ws + " "));
  EXPECT_FALSE(is_prefix(g, "{\"a\"" + ws + " "));
  EXPECT_FALSE(is_prefix(g, ws + " 1"));
}

TEST(JsonMatcher, NumbersAreBoundedAndEndOnlyWithEosAtTopLevel) {
  const Grammar g = Grammar::any_value();
  JsonMatcher m(g);
  ASSERT_TRUE(m.advance("12"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.finished());  // more digits may follow
  EXPECT_TRUE(matches(g, std::string(JsonMatcher::kMaxNumberBytes, '7')));
  EXPECT_FALSE(is_prefix(g, std::string(JsonMatcher::kMaxNumberBytes + 1, '7')));
  // An exponent started within the limit may finish beyond it.
  EXPECT_TRUE(matches(g, std::string(JsonMatcher::kMaxNumberBytes - 1, '7') + "e+5"));
  EXPECT_FALSE(is_prefix(g, std::string(JsonMatcher::kMaxNumberBytes, '7') + "e"));
}

TEST(JsonMatcher, NestingIsBounded) {
  const Grammar g = Grammar::any_value();
  const std::string deepest(JsonMatcher::kMaxDepth, '[');
  EXPECT_TRUE(matches(g, deepest + std::string(JsonMatcher::kMaxDepth, ']')));
  EXPECT_FALSE(is_prefix(g, deepest + "["));
  EXPECT_FALSE(is_prefix(g, deepest + "{"));
  std::string deep_schema = R"({"type": "integer"})";
  for (int i = 0; i < 70; ++i) deep_schema = R"({"type": "array", "items": )" + deep_schema + "}";
  EXPECT_THROW(schema(deep_schema), SchemaError);
}

TEST(JsonMatcher, IncrementalEqualsWhole) {
  const Grammar g = schema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 5}, "tags": {"type": "array", "items": {"enum": ["a", 1, null]}},
      "n": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "boolean"}}}]}},
      "required": ["name"]})");
  const std::vector<std::string> texts = {R"({"name":"bob","tags":["a",1,null],"n":{"x":true}})",
                                          R"({"n":12,"name":"x"})",
                                          R"({"name":"toolong"})",
                                          R"({"tags":[],"name":""})",
                                          R"({"name":"a","name":"b"})",
                                          R"({"n":1.5,"name":"a"})",
                                          R"({"name":"a","zz":1})",
                                          R"({"n":{"x":false},"name":"é"})"};
  std::mt19937 rng(7);
  for (const std::string& text : texts) {
    // Reference: byte by byte, the index of the first rejected byte.
    JsonMatcher ref(g);
    size_t first_bad = text.size();
    for (size_t i = 0; i < text.size(); ++i) {
      if (!ref.advance(static_cast<uint8_t>(text[i]))) {
        first_bad = i;
        break;
      }
    }
    for (int trial = 0; trial < 20; ++trial) {
      JsonMatcher m(g);
      size_t pos = 0;
      bool ok = true;
      while (pos < text.size() && ok) {
        const size_t len = std::uniform_int_distribution<size_t>(1, 6)(rng);
        const std::string_view chunk = std::string_view(text).substr(pos, len);
        JsonMatcher copy = m;  // copies continue independently
        ok = m.advance(chunk);
        EXPECT_EQ(copy.advance(chunk), ok);
        pos += chunk.size();
      }
      EXPECT_EQ(ok, first_bad == text.size()) << text;
      if (ok) {
        EXPECT_EQ(m.accepting(), ref.accepting()) << text;
      }
    }
  }
}

TEST(JsonSchema, TypesAndTypeLists) {
  EXPECT_TRUE(matches(schema(R"({"type": "string"})"), R"("x")"));
  EXPECT_FALSE(is_prefix(schema(R"({"type": "string"})"), "1"));
  EXPECT_TRUE(matches(schema(R"({"type": "integer"})"), "-42"));
  EXPECT_FALSE(matches(schema(R"({"type": "integer"})"), "4.2"));
  EXPECT_FALSE(matches(schema(R"({"type": "integer"})"), "4e2"));
  EXPECT_TRUE(matches(schema(R"({"type": "number"})"), "4.2e-1"));
  EXPECT_TRUE(matches(schema(R"({"type": "boolean"})"), "false"));
  EXPECT_FALSE(is_prefix(schema(R"({"type": "boolean"})"), "n"));
  EXPECT_TRUE(matches(schema(R"({"type": "null"})"), "null"));
  const Grammar list = schema(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(matches(list, "null"));
  EXPECT_TRUE(matches(list, R"("s")"));
  EXPECT_FALSE(is_prefix(list, "1"));
  EXPECT_TRUE(matches(schema("{}"), "[1,{}]"));
  EXPECT_TRUE(matches(schema("true"), "3"));
}

TEST(JsonSchema, PropertiesRequiredAndAdditionalProperties) {
  const Grammar closed = schema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "ab": {"type": "string"}}, "required": ["ab"]})");
  EXPECT_TRUE(matches(closed, R"({"ab":"x"})"));
  EXPECT_TRUE(matches(closed, R"({"a":1,"ab":"x"})"));
  EXPECT_TRUE(matches(closed, R"({"ab":"x","a":1})"));
  EXPECT_FALSE(matches(closed, R"({"a":1})"));             // required missing
  EXPECT_FALSE(is_prefix(closed, R"({"a":1,"a")"));        // each key once
  EXPECT_FALSE(is_prefix(closed, R"({"b)"));               // not listed
  EXPECT_FALSE(is_prefix(closed, R"({"a":"x")"));          // wrong value type
  EXPECT_FALSE(is_prefix(closed, R"({"a":1,"ab":"x",)"));  // no key left
  const Grammar open = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": true})");
  EXPECT_TRUE(matches(open, R"({"b":[1],"a":2,"abc":"x"})"));
  EXPECT_FALSE(is_prefix(open, R"({"a":"x")"));
  const Grammar typed_extra = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(matches(typed_extra, R"({"z":"s","a":1})"));
  EXPECT_FALSE(is_prefix(typed_extra, R"({"z":1)"));
  const Grammar explicit_false =
      schema(R"({"properties": {"a": {}}, "additionalProperties": false})");
  EXPECT_FALSE(is_prefix(explicit_false, R"({"b)"));
  const Grammar free = schema(R"({"type": "object"})");
  EXPECT_TRUE(matches(free, R"({"anything":{"x":[]}})"));
  const Grammar nested = schema(R"({"type": "object", "properties": {"p": {"type": "object",
      "properties": {"q": {"type": "null"}}, "required": ["q"]}}, "required": ["p"]})");
  EXPECT_TRUE(matches(nested, R"({"p":{"q":null}})"));
  EXPECT_FALSE(is_prefix(nested, R"({"p":{}})"));
  const Grammar escaped = schema(R"({"properties": {"a\"b": {"type": "integer"}}})");
  EXPECT_TRUE(matches(escaped, R"({"a\"b":1})"));
}

TEST(JsonSchema, EnumAndConst) {
  const Grammar e = schema(R"({"enum": ["red", "green", 3, null, {"k": [1]}]})");
  for (const char* ok : {R"("red")", R"("green")", "3", "null", R"({"k":[1]})", " 3"})
    EXPECT_TRUE(matches(e, ok)) << ok;
  for (const char* bad : {R"("blue")", "4", "30", R"({"k": [1]})", R"("re")"})
    EXPECT_FALSE(matches(e, bad)) << bad;
  const Grammar typed = schema(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(matches(typed, R"("a")"));
  EXPECT_FALSE(matches(typed, "1"));
  const Grammar c = schema(R"({"const": "fixed"})");
  EXPECT_TRUE(matches(c, R"("fixed")"));
  EXPECT_FALSE(is_prefix(c, R"("fix!)"));
  const Grammar numbers = schema(R"({"type": "array", "items": {"enum": [1, 12]}})");
  EXPECT_TRUE(matches(numbers, "[1,12,1]"));
  EXPECT_FALSE(is_prefix(numbers, "[13"));
}

TEST(JsonSchema, ArraysItemsPrefixItemsAndCounts) {
  const Grammar g = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
      "maxItems": 3})");
  EXPECT_TRUE(matches(g, "[1]"));
  EXPECT_TRUE(matches(g, "[1,2,3]"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(is_prefix(g, "[1,2,3,"));
  EXPECT_FALSE(is_prefix(g, "[\"x\""));
  const Grammar tuple = schema(R"({"type": "array", "prefixItems": [{"type": "string"},
      {"type": "boolean"}], "items": false})");
  EXPECT_TRUE(matches(tuple, R"(["a",true])"));
  EXPECT_TRUE(matches(tuple, R"(["a"])"));
  EXPECT_FALSE(is_prefix(tuple, R"(["a",true,)"));
  EXPECT_FALSE(is_prefix(tuple, "[true"));
  const Grammar rest =
      schema(R"({"prefixItems": [{"type": "null"}], "items": {"type": "integer"}})");
  EXPECT_TRUE(matches(rest, "[null,1,2]"));
  EXPECT_FALSE(is_prefix(rest, "[null,null"));
}

TEST(JsonSchema, StringLengths) {
  const Grammar g = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_TRUE(matches(g, R"("ab")"));
  EXPECT_TRUE(matches(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));  // characters, not bytes
  EXPECT_TRUE(matches(g, R"("\n\u0041b")"));
  EXPECT_FALSE(is_prefix(g, R"("abcd)"));
}

TEST(JsonSchema, AnyOfOneOfAllOfAndRefs) {
  const Grammar g =
      schema(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"]}, {"type": "object", "properties": {"a": {"type": "string"}, "b": {}},
      "required": ["a"]}, {"type": "null"}]})");
  EXPECT_TRUE(matches(g, R"({"a":1})"));
  EXPECT_TRUE(matches(g, R"({"a":"s","b":[1]})"));
  EXPECT_TRUE(matches(g, "null"));
  EXPECT_FALSE(is_prefix(g, R"({"a":1,"b")"));
  EXPECT_FALSE(is_prefix(g, R"({"a":true)"));
  const Grammar one = schema(R"({"oneOf": [{"type": "integer"}, {"type": "string"}]})");
  EXPECT_TRUE(matches(one, "5"));
  EXPECT_TRUE(matches(one, R"("5")"));
  EXPECT_FALSE(is_prefix(one, "["));
  const Grammar all = schema(R"({"allOf": [{"type": "boolean"}]})");
  EXPECT_TRUE(matches(all, "true"));
  const Grammar defs = schema(R"({"$defs": {"Node": {"type": "object", "properties": {
      "value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
      "required": ["value", "next"]}}, "$ref": "#/$defs/Node"})");
  EXPECT_TRUE(matches(defs, R"({"value":1,"next":{"value":2,"next":null}})"));
  EXPECT_FALSE(matches(defs, R"({"value":1,"next":{"value":2}})"));
  const Grammar definitions = schema(R"({"definitions": {"C": {"enum": ["x", "y"]}},
      "type": "array", "items": {"$ref": "#/definitions/C"}})");
  EXPECT_TRUE(matches(definitions, R"(["x","y"])"));
  EXPECT_FALSE(is_prefix(definitions, R"(["z)"));
  const Grammar root = schema(R"({"type": "array", "items": {"$ref": "#"}})");
  EXPECT_TRUE(matches(root, "[[],[[]]]"));
  const Grammar annotated = schema(R"({"title": "T", "description": "d", "type": "object",
      "properties": {"x": {"type": "integer", "default": 1, "examples": [2]}}, "$schema": "s"})");
  EXPECT_TRUE(matches(annotated, R"({"x":3})"));
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedWithTheirPath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "string", "pattern": "^a"})", "pattern"},
      {R"({"type": "string", "format": "date"})", "format"},
      {R"({"type": "integer", "minimum": 0})", "minimum"},
      {R"({"type": "number", "maximum": 1})", "maximum"},
      {R"({"type": "number", "multipleOf": 2})", "multipleOf"},
      {R"({"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}})",
       "properties.x.pattern"},
      {R"({"type": "object", "patternProperties": {}})", "patternProperties"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
      {R"({"not": {}})", "not"},
      {R"({"if": {}, "then": {}})", "if"},
      {R"({"type": "array", "items": {"format": "x"}})", "items.format"},
      {R"({"anyOf": [{"type": "integer"}], "type": "integer"})", "type"},
      {R"({"allOf": [{}, {}]})", "allOf"},
      {R"({"$ref": "http://x/y"})", "$ref"},
      {R"({"$ref": "#/$defs/missing"})", "$ref"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "required"},
      {R"({"enum": []})", "enum"},
      {R"({"type": "widget"})", "type"},
      {R"({"type": "array", "items": false, "minItems": 1})", "minItems"},
  };
  for (const auto& [text, path] : cases) {
    try {
      schema(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.path(), path) << text << ": " << e.what();
    }
  }
  EXPECT_THROW(schema("false"), SchemaError);
  EXPECT_THROW(
      schema(R"({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"})"),
      SchemaError);
}

TEST(JsonSchema, ChoicesMatchRawBytesExactly) {
  const Grammar g = Grammar::choices({"yes", "no", "not sure"});
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_TRUE(matches(g, "not sure"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_FALSE(is_prefix(g, " yes"));
  EXPECT_FALSE(is_prefix(g, "yess"));
  JsonMatcher m(g);
  ASSERT_TRUE(m.advance("no"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.finished());  // "not sure" may still follow
  ASSERT_TRUE(m.advance("t sure"));
  EXPECT_TRUE(m.finished());
  EXPECT_THROW(Grammar::choices({}), InvalidArgument);
}

// ---- Token masks ----------------------------------------------------------------------

// A toy vocabulary: every single byte plus multi-byte pieces that cut JSON anywhere.
std::vector<std::string> toy_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(1, static_cast<char>(b));
  for (const char* piece :
       {"{\"",          "\":",   "\",",     "\":\"", "\"}",   "},",       "}]",   "[{",
        "true",         "false", "null",    "nul",   "name",  "\"name\"", "age",  "tags",
        "\"a",          "ab",    "  ",      "\n ",   "   ",   "     ",    "12",   "0.",
        ".5",           "e+",    "-1",      "\\n",   "\\u00", "\xc3\xa9", "\xc3", "\xa9\"",
        "\xe4\xb8\xad", "red",   "\"red\"", "green", ",\"",   ":[",       "]}",   "yes",
        "no",           "not",   " sure",   "xyz"}) {
    v.emplace_back(piece);
  }
  v.emplace_back("");  // a left-out id (special token)
  v.emplace_back("");
  return v;
}

void check_masks_against_brute_force(const Grammar& grammar, uint32_t seed, int steps) {
  const std::vector<std::string> words = toy_vocab();
  auto vocab = std::make_shared<const VocabTrie>(VocabTrie::build(words));
  const int32_t eos = static_cast<int32_t>(words.size()) - 1;
  const std::vector<int32_t> terminators = {eos};
  auto constraint = std::make_shared<const TokenConstraint>(grammar, vocab);
  ConstraintState state(constraint);
  JsonMatcher reference(constraint->grammar());
  std::vector<int32_t> outputs;
  std::mt19937 rng(seed);
  std::vector<uint8_t> allowed;
  for (int step = 0; step < steps; ++step) {
    state.sync(outputs, terminators);
    state.compute_mask(terminators, allowed);
    ASSERT_EQ(allowed.size(), words.size());
    std::vector<int32_t> ordinary;
    for (int32_t id = 0; id < static_cast<int32_t>(words.size()); ++id) {
      bool expect = false;
      if (id == eos) {
        expect = reference.accepting();
      } else if (!words[static_cast<size_t>(id)].empty()) {
        JsonMatcher copy = reference;
        expect = copy.advance(words[static_cast<size_t>(id)]);
      }
      ASSERT_EQ(allowed[static_cast<size_t>(id)] != 0, expect)
          << "step " << step << " token " << id << " '" << words[static_cast<size_t>(id)] << "'";
      if (expect && id != eos) ordinary.push_back(id);
    }
    if (ordinary.empty()) {  // finished, or a number at its length limit
      EXPECT_TRUE(reference.accepting());
      return;
    }
    // Mostly random, sometimes the token that ends a value soonest, so texts finish.
    const int32_t next =
        ordinary[std::uniform_int_distribution<size_t>(0, ordinary.size() - 1)(rng)];
    outputs.push_back(next);
    ASSERT_TRUE(reference.advance(words[static_cast<size_t>(next)]));
  }
}

TEST(Grammar, EmbedKeepsEachSchemaWithItsRefsAndLiterals) {
  Grammar g;
  const int32_t a = g.embed(schema(R"({"$defs": {"n": {"enum": ["x", 1]}},
      "type": "object", "properties": {"k": {"$ref": "#/$defs/n"}, "r": {"$ref": "#"}}})"));
  const int32_t b = g.embed(schema(R"({"type": "array", "items": {"const": "y"}, "maxItems": 2})"));
  GrammarNode pair;
  pair.types = kJsonArray;
  pair.prefix_items = {a, b};
  g.root = g.add_node(std::move(pair));
  EXPECT_TRUE(matches(g, R"([{"k": "x", "r": {"k": 1}}, ["y", "y"]])"));
  EXPECT_TRUE(matches(g, R"([{}, []])"));
  EXPECT_FALSE(matches(g, R"([{"k": "y"}, []])"));
  EXPECT_FALSE(matches(g, R"([{}, ["x"]])"));
  EXPECT_FALSE(matches(g, R"([{}, ["y", "y", "y"]])"));
}

ordered_json forced_tools() {
  return ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
      "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "bad", "parameters": {
      "type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}}])");
}

TEST(ForcedToolCalls, NamedFunctionIsItsParametersSchema) {
  const ordered_json tools = forced_tools();
  const Grammar g = forced_tool_call_grammar(tools, ForcedToolMode::kNamed, "get_weather");
  EXPECT_TRUE(matches(g, R"({"city": "Paris"})"));
  EXPECT_FALSE(matches(g, R"({})"));
  EXPECT_FALSE(matches(g, R"({"city": "Paris", "x": 1})"));
  EXPECT_FALSE(matches(g, R"([{"name": "get_weather", "parameters": {"city": "Paris"}}])"));
  // No parameters: no arguments.
  const Grammar none = forced_tool_call_grammar(tools, ForcedToolMode::kNamed, "ping");
  EXPECT_TRUE(matches(none, "{}"));
  EXPECT_FALSE(matches(none, R"({"a": 1})"));
}

TEST(ForcedToolCalls, RequiredIsAnArrayOfNamedCalls) {
  ordered_json tools = forced_tools();
  tools.erase(2);  // the unsupported schema
  const Grammar g = forced_tool_call_grammar(tools, ForcedToolMode::kRequired, "");
  EXPECT_TRUE(matches(g, R"([{"name": "get_weather", "parameters": {"city": "Rome"}}])"));
  // Keys in either order, calls of different tools.
  EXPECT_TRUE(matches(g, R"([{"parameters": {}, "name": "ping"}, )"
                         R"({"name": "get_weather", "parameters": {"city": "Rome"}}])"));
  EXPECT_FALSE(matches(g, "[]"));                                              // minItems 1
  EXPECT_FALSE(matches(g, R"([{"name": "get_weather", "parameters": {}}])"));  // city required
  EXPECT_FALSE(matches(g, R"([{"name": "ping", "parameters": {"city": "Rome"}}])"));
  EXPECT_FALSE(matches(g, R"([{"name": "other", "parameters": {}}])"));
  EXPECT_FALSE(matches(g, R"([{"name": "ping"}])"));
  EXPECT_FALSE(matches(g, R"([{"name": "ping", "parameters": {}, "x": 1}])"));
  EXPECT_FALSE(matches(g, R"({"name": "ping", "parameters": {}})"));
}

TEST(ForcedToolCalls, UnsupportedParametersAreA400NamingTheKeyword) {
  const ordered_json tools = forced_tools();
  for (const ForcedToolMode mode : {ForcedToolMode::kRequired, ForcedToolMode::kNamed}) {
    try {
      forced_tool_call_grammar(tools, mode, "bad");
      ADD_FAILURE() << "no error";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tools[2].function.parameters.properties.x.pattern");
    }
  }
  // A named call compiles its own tool only.
  EXPECT_NO_THROW(forced_tool_call_grammar(tools, ForcedToolMode::kNamed, "ping"));
}

TEST(TokenMask, EqualsBruteForceOnAToyVocabulary) {
  const std::vector<Grammar> grammars = {
      Grammar::any_object(), Grammar::any_value(),
      schema(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
          "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["red", "green"]},
          "maxItems": 2}}, "required": ["name"]})"),
      schema(R"({"anyOf": [{"type": "number"}, {"type": "array", "items": {"type": "boolean"}}]})"),
      Grammar::choices({"yes", "no", "not sure"})};
  for (size_t g = 0; g < grammars.size(); ++g) {
    for (uint32_t seed = 0; seed < 8; ++seed) {
      SCOPED_TRACE(testing::Message() << "grammar " << g << " seed " << seed);
      check_masks_against_brute_force(grammars[g], seed, 40);
    }
  }
}

TEST(TokenMask, FinishedStructureAllowsOnlyTerminatorsAndPreStartAllowsAll) {
  const std::vector<std::string> words = toy_vocab();
  auto vocab = std::make_shared<const VocabTrie>(VocabTrie::build(words));
  const std::vector<int32_t> terminators = {static_cast<int32_t>(words.size()) - 1};
  auto constraint = std::make_shared<const TokenConstraint>(Grammar::any_object(), vocab);
  ConstraintState state(constraint);
  std::vector<int32_t> outputs = {'{', '}'};
  state.sync(outputs, terminators);
  std::vector<uint8_t> allowed;
  state.compute_mask(terminators, allowed);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1);
  EXPECT_EQ(allowed[static_cast<size_t>(terminators[0])], 1);

  // Before the start token (the reasoning end marker) nothing is constrained.
  const int32_t marker = 'x';
  auto deferred = std::make_shared<const TokenConstraint>(Grammar::any_object(), vocab, marker);
  ConstraintState d(deferred);
  outputs = {'a', 'b'};
  d.sync(outputs, terminators);
  d.compute_mask(terminators, allowed);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), static_cast<long>(words.size()));
  outputs.push_back(marker);
  d.sync(outputs, terminators);
  d.compute_mask(terminators, allowed);
  EXPECT_EQ(allowed['{'], 1);
  EXPECT_EQ(allowed['a'], 0);
  EXPECT_EQ(allowed[static_cast<size_t>(terminators[0])], 0);
}

// A vocabulary with the Kimi tokenizer's size and a BPE-like mix (single bytes, ASCII words
// with and without a leading space, digits, punctuation runs, whitespace runs, CJK and
// other multi-byte characters); the real tiktoken.model is not in the repository.
std::vector<std::string> synthetic_vocab(size_t size) {
  std::mt19937 rng(1234);
  std::vector<std::string> v;
  std::set<std::string> seen;
  const auto add = [&](std::string s) {
    if (!s.empty() && seen.insert(s).second) v.push_back(std::move(s));
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  const std::string punct = "{}[]\":,.;!?()-_/\\'*#=+<>`|&%$@";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  while (v.size() < size - 256) {
    const size_t kind = pick(10);
    std::string s;
    if (kind < 5) {  // words
      if (pick(2) == 0) s += ' ';
      const size_t len = 2 + pick(9);
      for (size_t i = 0; i < len; ++i) s += static_cast<char>('a' + pick(26));
      if (pick(5) == 0)
        s[s[0] == ' ' ? 1 : 0] = static_cast<char>(std::toupper(s[s[0] == ' ' ? 1 : 0]));
    } else if (kind < 8) {  // CJK: 1-3 characters of 3 bytes
      const size_t len = 1 + pick(3);
      for (size_t i = 0; i < len; ++i) {
        const uint32_t cp = 0x4E00 + static_cast<uint32_t>(pick(0x5000));
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else if (kind == 8) {  // digits and punctuation runs
      const size_t len = 1 + pick(3);
      for (size_t i = 0; i < len; ++i)
        s += pick(2) ? punct[pick(punct.size())] : static_cast<char>('0' + pick(10));
    } else {  // whitespace runs, some with text after
      s = std::string(1 + pick(16), pick(3) ? ' ' : '\n');
      if (pick(2)) s += static_cast<char>('a' + pick(26));
    }
    add(std::move(s));
  }
  v.resize(size);  // the last 256 ids stand for the special tokens: left out
  return v;
}

// The string fast paths (UTF-8 only, whole safe subtrees) against brute force on a larger
// BPE-like vocabulary, from states inside strings (also mid-character), keys and numbers.
TEST(TokenMask, EqualsBruteForceOnASyntheticVocabulary) {
  const std::vector<std::string> words = synthetic_vocab(6000);
  auto vocab = std::make_shared<const VocabTrie>(VocabTrie::build(words));
  const std::vector<Grammar> grammars = {
      Grammar::any_object(),
      schema(R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 3}}})")};
  for (const Grammar& g : grammars) {
    auto constraint = std::make_shared<const TokenConstraint>(g, vocab);
    for (const std::string prefix :
         {"{\"", "{\"k\":\"", "{\"k\":\"ab\xe4", "{\"k\":\"\xf0\x9f", "{\"k\":\"a\\", "{\"k\":1",
          "{\"s\":\"", "{\"s\":\"x\xc3", "{\"s\":\"xy"}) {
      JsonMatcher reference(constraint->grammar());
      if (!reference.advance(prefix)) continue;
      std::vector<int32_t> outputs;
      for (const char ch : prefix) outputs.push_back(static_cast<uint8_t>(ch));
      ConstraintState state(constraint);
      state.sync(outputs, {});
      std::vector<uint8_t> allowed;
      state.compute_mask({}, allowed);
      for (size_t id = 0; id < words.size(); ++id) {
        JsonMatcher copy = reference;
        const bool expect = !words[id].empty() && copy.advance(words[id]);
        ASSERT_EQ(allowed[id] != 0, expect) << ordered_json(prefix).dump() << " token " << id;
      }
    }
  }
}

TEST(TokenMask, StepTimeOnAKimiSizedVocabulary) {
  const std::vector<std::string> words = synthetic_vocab(163840);
  const auto t0 = std::chrono::steady_clock::now();
  auto vocab = std::make_shared<const VocabTrie>(VocabTrie::build(words));
  const double build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Grammar g = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age"]})");
  auto constraint = std::make_shared<const TokenConstraint>(g, vocab);
  std::printf(
      "{\"bench\": \"guided_mask\", \"vocab\": %zu, \"trie_nodes\": %zu, \"build_ms\": %.1f}\n",
      words.size(), vocab->num_nodes(), build_ms);
  // The state after each prefix: start, inside a key, inside a string value, after a value,
  // inside a free array of strings.
  for (const std::string prefix :
       {"", "{\"na", "{\"name\":\"ab", "{\"name\":\"x\"", "{\"name\":\"x\",\"tags\":[\"q"}) {
    JsonMatcher m(g);
    ASSERT_TRUE(m.advance(prefix));
    // Feed the prefix as single-byte tokens (ids = byte values).
    std::vector<int32_t> outputs;
    for (const char ch : prefix) outputs.push_back(static_cast<uint8_t>(ch));
    ConstraintState state(constraint);
    state.sync(outputs, {});
    std::vector<uint8_t> allowed;
    state.compute_mask({}, allowed);  // warm-up
    constexpr int kReps = 5;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) state.compute_mask({}, allowed);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        kReps;
    const auto num_allowed = std::count(allowed.begin(), allowed.end(), 1);
    std::printf(
        "{\"bench\": \"guided_mask\", \"prefix\": %s, \"allowed\": %ld, \"ms_per_step\": %.2f}\n",
        ordered_json(prefix).dump().c_str(), static_cast<long>(num_allowed), ms);
    EXPECT_GT(num_allowed, 0);
    EXPECT_LT(ms, 2000.0);  // a sanity bound, not a performance target
  }
}

}  // namespace
}  // namespace hyserve
