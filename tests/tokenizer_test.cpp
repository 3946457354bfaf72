// Tokenizers against the Python packages: ids from tiktoken (kimi/) and tokenizers
// (deepseek/, gpt2/) for ~210 strings, written by tools/make_tokenizer_fixtures.py; decode
// round trips; the streaming detokenizer; UTF-8 repair; the regex translation; load errors.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/hf_bpe_tokenizer.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/tokenizer";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

const std::vector<std::string>& cases() {
  static const std::vector<std::string> strings =
      read_json(kFixtures / "cases.json")["strings"].get<std::vector<std::string>>();
  return strings;
}

// The string as C-escaped text, for failure messages.
std::string escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x20 || b == 0x7F || c == '\\' || c == '"') {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02X", b);
      out += buffer;
    } else {
      out += c;
    }
  }
  return out;
}

// Every proper prefix of the UTF-8 encoding of every scalar value: the byte strings a
// streaming decoder may hold back. Built from the encoding rule, independent of utf8.cpp.
const std::unordered_set<std::string>& incomplete_prefixes() {
  static const std::unordered_set<std::string> prefixes = [] {
    std::unordered_set<std::string> set;
    for (char32_t c = 0x80; c <= 0x10FFFF; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      std::string e;
      if (c < 0x800) {
        e = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
      } else if (c < 0x10000) {
        e = {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
             static_cast<char>(0x80 | (c & 0x3F))};
      } else {
        e = {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
      }
      for (std::size_t k = 1; k < e.size(); ++k) set.insert(e.substr(0, k));
    }
    return set;
  }();
  return prefixes;
}

// Feeds `ids` one by one and checks every step: each output is valid UTF-8, the text so far
// is the lossy decode of all bytes except the longest tail that may still complete a
// character, and the final concatenation equals the lossy decode of everything.
void check_streaming(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                     const std::string& label) {
  StreamingDetokenizer stream(tok, skip_special);
  std::string emitted;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = stream.push(ids[i]);
    ASSERT_TRUE(is_valid_utf8(piece)) << label << " step " << i << ": " << escaped(piece);
    emitted += piece;
    const std::string bytes = tok.decode(std::span<const int32_t>(ids.data(), i + 1), skip_special);
    std::size_t held = 0;
    for (std::size_t k = 1; k <= 3 && k <= bytes.size(); ++k) {
      if (incomplete_prefixes().contains(bytes.substr(bytes.size() - k))) held = k;
    }
    ASSERT_EQ(emitted, replace_invalid_utf8(std::string_view(bytes).substr(0, bytes.size() - held)))
        << label << " step " << i;
  }
  emitted += stream.finish();
  EXPECT_EQ(emitted, replace_invalid_utf8(tok.decode(ids, skip_special))) << label;
}

class TokenizerFixture : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    tok_ = Tokenizer::load(kFixtures / GetParam());
    expected_ = read_json(kFixtures / GetParam() / "expected.json");
  }
  std::unique_ptr<Tokenizer> tok_;
  json expected_;
};

TEST_P(TokenizerFixture, EncodeMatchesPython) {
  ASSERT_EQ(expected_["encode_special"].size(), cases().size());
  int num_checked = 0;
  for (std::size_t i = 0; i < cases().size(); ++i) {
    const std::string& text = cases()[i];
    EXPECT_EQ(tok_->encode(text, true), expected_["encode_special"][i].get<std::vector<int32_t>>())
        << "case " << i << " (allow_special): \"" << escaped(text) << "\"";
    EXPECT_EQ(tok_->encode(text, false), expected_["encode_plain"][i].get<std::vector<int32_t>>())
        << "case " << i << " (plain): \"" << escaped(text) << "\"";
    num_checked += 2;
  }
  EXPECT_GE(num_checked, 400);
}

// Ids alone under-test the split: with a small vocabulary no token spans the boundary a wrong
// split would move. The pieces come from tokenizers' pre_tokenize_str, and for Kimi from the
// `regex` module, checked against tiktoken's own split by the fixture script.
TEST_P(TokenizerFixture, PreTokenizerPiecesMatchPython) {
  ASSERT_EQ(expected_["pieces"].size(), cases().size());
  for (std::size_t i = 0; i < cases().size(); ++i) {
    const std::string& text = cases()[i];
    std::vector<std::string_view> pieces;
    if (const auto* kimi = dynamic_cast<const TiktokenTokenizer*>(tok_.get())) {
      pieces = kimi->pre_tokenize(text);
    } else {
      pieces = dynamic_cast<const HfBpeTokenizer&>(*tok_).pre_tokenize(text);
    }
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()),
              expected_["pieces"][i].get<std::vector<std::string>>())
        << "case " << i << ": \"" << escaped(text) << "\"";
  }
}

TEST_P(TokenizerFixture, DecodeOfEncodeIsIdentity) {
  for (std::size_t i = 0; i < cases().size(); ++i) {
    const std::string& text = cases()[i];
    EXPECT_EQ(tok_->decode(tok_->encode(text, true), false), text) << "case " << i;
    EXPECT_EQ(tok_->decode(tok_->encode(text, false), false), text) << "case " << i;
  }
}

TEST_P(TokenizerFixture, DecodeMatchesPython) {
  ASSERT_GE(expected_["decode"].size(), 40u);
  for (const json& entry : expected_["decode"]) {
    const auto ids = entry["ids"].get<std::vector<int32_t>>();
    const bool skip = entry["skip_special"].get<bool>();
    EXPECT_EQ(replace_invalid_utf8(tok_->decode(ids, skip)), entry["text"].get<std::string>())
        << entry["ids"].dump() << " skip_special " << skip;
  }
}

TEST_P(TokenizerFixture, SpecialTokensAndVocabSize) {
  EXPECT_EQ(tok_->vocab_size(), expected_["vocab_size"].get<int64_t>());
  for (const auto& [content, id] : expected_["special"].items()) {
    EXPECT_EQ(tok_->token_id(content), id.get<int32_t>()) << content;
  }
  EXPECT_EQ(tok_->token_id("not a special token"), -1);
  for (int32_t id : tok_->encode("plain text", true)) EXPECT_FALSE(tok_->is_special(id)) << id;
  EXPECT_FALSE(tok_->is_special(-1));
  EXPECT_FALSE(tok_->is_special(static_cast<int32_t>(tok_->vocab_size())));
}

TEST_P(TokenizerFixture, StreamingEqualsDecodeAndNeverSplitsACharacter) {
  for (std::size_t i = 0; i < cases().size(); ++i) {
    check_streaming(*tok_, tok_->encode(cases()[i], true), false, str_cat("case ", i));
  }
  for (const json& entry : expected_["decode"]) {
    check_streaming(*tok_, entry["ids"].get<std::vector<int32_t>>(),
                    entry["skip_special"].get<bool>(), entry["ids"].dump());
  }
}

TEST_P(TokenizerFixture, RejectsInvalidUtf8AndBadIds) {
  EXPECT_THROW(tok_->encode("ab\xC3", true), InvalidArgument);
  EXPECT_THROW(tok_->encode("\xED\xA0\x80", false), InvalidArgument);
  const std::vector<int32_t> bad = {static_cast<int32_t>(tok_->vocab_size())};
  EXPECT_THROW(tok_->decode(bad, false), InvalidArgument);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(tok_->decode(negative, false), InvalidArgument);
}

TEST_P(TokenizerFixture, LongRunsEncodeQuickly) {
  // One regex piece of 150,000-200,000 bytes: the merge loop must not be quadratic.
  std::string letters;
  for (int i = 0; i < 50000; ++i) letters += "the";
  for (const std::string& text : {letters, std::string(200000, ' ')}) {
    const std::vector<int32_t> ids = tok_->encode(text, false);
    EXPECT_EQ(tok_->decode(ids, false), text);
    EXPECT_LT(ids.size(), text.size() / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerFixture, testing::Values("kimi", "deepseek", "gpt2"));

// Kimi's reserved layout (N = 3000 in the fixture, 163,584 in the real checkpoints).
TEST(TokenizerKimi, DefaultSpecialTokenLayout) {
  const auto tok = TiktokenTokenizer::load(kFixtures / "kimi");
  const int32_t n = tok->num_base_tokens();
  ASSERT_EQ(n, 3000);
  EXPECT_EQ(tok->vocab_size(), n + 256);
  EXPECT_EQ(tok->token_id("[BOS]"), n);
  EXPECT_EQ(tok->token_id("[EOS]"), n + 1);
  EXPECT_EQ(tok->token_id("<|im_end|>"), n + 2);
  EXPECT_EQ(tok->token_id("<|im_user|>"), n + 3);
  EXPECT_EQ(tok->token_id("<|im_assistant|>"), n + 4);
  EXPECT_EQ(tok->token_id("<|im_system|>"), n + 10);
  EXPECT_EQ(tok->token_id("<|tool_calls_section_begin|>"), n + 11);
  EXPECT_EQ(tok->token_id("<|tool_calls_section_end|>"), n + 12);
  EXPECT_EQ(tok->token_id("<|tool_call_begin|>"), n + 13);
  EXPECT_EQ(tok->token_id("<|tool_call_argument_begin|>"), n + 14);
  EXPECT_EQ(tok->token_id("<|tool_call_end|>"), n + 15);
  EXPECT_EQ(tok->token_id("<|im_middle|>"), n + 17);
  EXPECT_EQ(tok->token_id("<think>"), n + 22);
  EXPECT_EQ(tok->token_id("</think>"), n + 23);
  EXPECT_EQ(tok->token_id(str_cat("<|reserved_token_", n + 5, "|>")), n + 5);
  EXPECT_TRUE(tok->is_special(n + 2));
  EXPECT_FALSE(tok->is_special(n + 22));
  EXPECT_FALSE(tok->is_special(n - 1));

  const std::vector<int32_t> chat = {n + 3, 65, n + 17, 66, n + 22, 67, n + 23, n + 2};
  EXPECT_EQ(tok->decode(chat, false), "<|im_user|>A<|im_middle|>B<think>C</think><|im_end|>");
  EXPECT_EQ(tok->decode(chat, true), "AB<think>C</think>");
  EXPECT_EQ(tok->encode("<|im_end|>", true), std::vector<int32_t>{n + 2});
  for (int32_t id : tok->encode("<|im_end|>", false)) EXPECT_LT(id, n);
}

TEST(TokenizerKimi, SpecialNamesFromTokenizerConfig) {
  const fs::path dir = fs::temp_directory_path() / "hyserve_tokenizer_config_test";
  fs::create_directories(dir);
  fs::copy_file(kFixtures / "kimi/tiktoken.model", dir / "tiktoken.model",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << R"({"added_tokens_decoder": {
      "3000": {"content": "<|begin|>", "special": true},
      "3005": {"content": "<|custom|>", "special": false}}})";
  const auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok->token_id("<|begin|>"), 3000);
  EXPECT_EQ(tok->token_id("<|custom|>"), 3005);
  EXPECT_EQ(tok->token_id("[BOS]"), -1);  // the defaults apply only without a config
  EXPECT_EQ(tok->token_id("<|reserved_token_3001|>"), 3001);
  EXPECT_TRUE(tok->is_special(3000));
  EXPECT_FALSE(tok->is_special(3005));
  EXPECT_EQ(tok->encode("<|custom|>", true), std::vector<int32_t>{3005});

  std::ofstream(dir / "tokenizer_config.json")
      << R"({"added_tokens_decoder": {"12": {"content": "x"}}})";
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << "an id below the reserved range was accepted";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens_decoder[\"12\"]"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(TokenizerKimi, StreamingHoldsSplitCharacters) {
  // Ranks 0..255 of the fixture are the single bytes, so ids spell arbitrary bytes.
  const auto tok = Tokenizer::load(kFixtures / "kimi");
  const std::string kFffd = "\xEF\xBF\xBD";
  {
    StreamingDetokenizer s(*tok, false);
    EXPECT_EQ(s.push(0xE2), "");
    EXPECT_EQ(s.push(0x82), "");
    EXPECT_EQ(s.num_pending_bytes(), 2u);
    EXPECT_EQ(s.push(0xAC), "\xE2\x82\xAC");
    EXPECT_EQ(s.finish(), "");
  }
  {
    StreamingDetokenizer s(*tok, false);
    EXPECT_EQ(s.push(0xE2), "");
    EXPECT_EQ(s.push(0x82), "");
    EXPECT_EQ(s.push('A'), kFffd + "A");  // can no longer complete: one U+FFFD
  }
  {
    StreamingDetokenizer s(*tok, false);
    EXPECT_EQ(s.push(0x80), kFffd);  // a lone continuation byte is final at once
    EXPECT_EQ(s.push(0xE0), "");
    EXPECT_EQ(s.push(0x80), kFffd + kFffd);  // E0 80 is never valid
    EXPECT_EQ(s.push(0xF0), "");
    EXPECT_EQ(s.push(0x9F), "");
    EXPECT_EQ(s.push(0x98), "");
    EXPECT_EQ(s.finish(), kFffd);  // the stream ended inside a character
  }
}

// Unicode's "maximal subpart" replacement, the rule of Python's errors="replace".
TEST(TokenizerUtf8, ReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8(""), "");
  EXPECT_EQ(replace_invalid_utf8("a\xF0\x9F\x98\x80z"), "a\xF0\x9F\x98\x80z");
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"
                                 "A"),
            r + "A");
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80"), r + r);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), r + r + r);          // a surrogate
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(replace_invalid_utf8("\xFF\xFE"
                                 "b"),
            r + r + "b");
  EXPECT_TRUE(is_valid_utf8("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC2"));
}

std::vector<std::string> matches(const SplitRegex& re, std::string_view text) {
  std::vector<std::string> out;
  for (const auto& [b, e] : re.find_all(text)) out.emplace_back(text.substr(b, e - b));
  return out;
}

TEST(TokenizerRegex, WhitespaceAndScriptsMeanWhatRustAndOnigurumaMean) {
  const SplitRegex space(R"(\s+|\S+)");
  // U+180E is not White_Space; PCRE2's own \s would take it.
  EXPECT_EQ(matches(space, "a\xE1\xA0\x8E b\xC2\x85"),
            (std::vector<std::string>{"a\xE1\xA0\x8E", " ", "b", "\xC2\x85"}));
  const SplitRegex han(R"([\p{Han}]+)");
  // 、 and 。 have Han only in Script_Extensions.
  EXPECT_EQ(matches(han, "中文、漢字。"), (std::vector<std::string>{"中文", "漢字"}));
  const SplitRegex kimi(kKimiSplitPattern);
  EXPECT_EQ(matches(kimi, "I'm 中文Hello  12345\n\n"),
            (std::vector<std::string>{"I'm", " ", "中文", "Hello", " ", " ", "123", "45", "\n\n"}));
}

TEST(TokenizerRegex, RefusesConstructsPcre2ReadsDifferently) {
  EXPECT_THROW(SplitRegex(R"([\p{L}&&[^a]])"), InvalidArgument);
  EXPECT_THROW(SplitRegex(R"([^\S])"), InvalidArgument);
  EXPECT_THROW(SplitRegex(R"(\h+)"), InvalidArgument);
  EXPECT_THROW(SplitRegex(R"(a(b)"), InvalidArgument);
  EXPECT_NO_THROW(SplitRegex(R"([]a[:alpha:]]+)"));
}

// The folder of this test's edited tokenizer.json: its own per test and process, so tests
// run in parallel (ctest -j) never read each other's file.
fs::path tokenizer_json_dir() {
  return fs::temp_directory_path() /
         ("hyserve_tokenizer_json_test_" +
          std::string(testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
          std::to_string(getpid()));
}

// A copy of deepseek/tokenizer.json with `edit` applied, in a fresh folder.
fs::path edited_tokenizer_json(const std::function<void(json&)>& edit) {
  const fs::path dir = tokenizer_json_dir();
  fs::remove_all(dir);
  fs::create_directories(dir);
  json root = read_json(kFixtures / "deepseek/tokenizer.json");
  edit(root);
  std::ofstream(dir / "tokenizer.json") << root.dump();
  return dir;
}

TEST(TokenizerJson, MergesAsSpaceSeparatedStrings) {
  const fs::path dir = edited_tokenizer_json([](json& root) {
    for (json& merge : root["model"]["merges"]) {
      merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    }
  });
  const auto tok = Tokenizer::load(dir);
  const json expected = read_json(kFixtures / "deepseek/expected.json");
  for (std::size_t i = 0; i < cases().size(); ++i) {
    EXPECT_EQ(tok->encode(cases()[i], true),
              expected["encode_special"][i].get<std::vector<int32_t>>())
        << "case " << i;
  }
  fs::remove_all(dir);
}

// A checkpoint's embedding may have more rows than its tokenizer has tokens: the ids between
// read as nothing in model output (decode_output, the streaming detokenizer) and stay errors for
// decode, which reads client-given ids.
TEST(TokenizerJson, IdsWithoutATokenReadAsNothingInModelOutput) {
  int32_t moved = -1;
  const fs::path dir = edited_tokenizer_json([&](json& root) {
    json& last = root["added_tokens"].back();
    moved = last["id"].get<int32_t>();
    last["id"] = moved + 6;  // ids moved .. moved + 5 have no token
  });
  const auto tok = Tokenizer::load(dir);
  ASSERT_EQ(tok->vocab_size(), moved + 7);
  EXPECT_TRUE(tok->has_token(moved + 6));
  EXPECT_TRUE(tok->has_token(0));
  for (int32_t id : {moved, moved + 5, -1, moved + 7}) EXPECT_FALSE(tok->has_token(id)) << id;
  const std::vector<int32_t> known = tok->encode("Hello world", true);
  ASSERT_GE(known.size(), 2u);
  const std::vector<int32_t> with_gaps = {known[0],  moved,     known[1], moved + 3,
                                          moved + 6, moved + 7, -1};
  const std::vector<int32_t> kept = {known[0], known[1], moved + 6};
  EXPECT_THROW(tok->decode(with_gaps, false), InvalidArgument);
  for (const bool skip : {false, true}) {
    EXPECT_EQ(tok->decode_output(with_gaps, skip), tok->decode(kept, skip)) << skip;
    StreamingDetokenizer detok(*tok, skip);
    std::string streamed;
    for (const int32_t id : with_gaps) streamed += detok.push(id);
    streamed += detok.finish();
    EXPECT_EQ(streamed, replace_invalid_utf8(tok->decode(kept, skip))) << skip;
  }
  fs::remove_all(dir);
}

// vLLM's add_special_tokens: the ids Hugging Face's encode(text, add_special_tokens=True)
// puts around the text. tokenizer.json's TemplateProcessing (alone or in a Sequence with
// ByteLevel); LlamaTokenizerFast's add_bos_token (default true) / add_eos_token in
// tokenizer_config.json in place of it; none for tiktoken.
TEST(TokenizerJson, SpecialAffixesAsHuggingFaceEncodeAddsThem) {
  const json bos = {{"SpecialToken", {{"id", "<｜begin▁of▁sentence｜>"}, {"type_id", 0}}}};
  const json eos = {{"SpecialToken", {{"id", "<｜end▁of▁sentence｜>"}, {"type_id", 0}}}};
  const json seq = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json specials = {{"<｜begin▁of▁sentence｜>",
                          {{"id", "<｜begin▁of▁sentence｜>"}, {"ids", {0}}, {"tokens", {"x"}}}},
                         {"<｜end▁of▁sentence｜>",
                          {{"id", "<｜end▁of▁sentence｜>"}, {"ids", {1}}, {"tokens", {"y"}}}}};
  const json bos_template = {{"type", "TemplateProcessing"},
                             {"single", {bos, seq}},
                             {"pair", json::array()},
                             {"special_tokens", specials}};
  const auto plain = Tokenizer::load(edited_tokenizer_json([](json&) {}));
  const std::vector<int32_t> text = plain->encode("Hello world", true);
  EXPECT_TRUE(plain->special_prefix().empty());
  EXPECT_EQ(plain->encode_prompt("Hello world", true), text);
  {
    const auto tok = Tokenizer::load(
        edited_tokenizer_json([&](json& r) { r["post_processor"] = bos_template; }));
    EXPECT_EQ(tok->special_prefix(), std::vector<int32_t>{0});
    EXPECT_TRUE(tok->special_suffix().empty());
    std::vector<int32_t> want = {0};
    want.insert(want.end(), text.begin(), text.end());
    EXPECT_EQ(tok->encode_prompt("Hello world", true), want);
    EXPECT_EQ(tok->encode_prompt("Hello world", false), text);
  }
  {
    const auto tok = Tokenizer::load(edited_tokenizer_json([&](json& r) {
      json t = bos_template;
      t["single"] = {bos, seq, eos};
      r["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, t}}};
    }));
    EXPECT_EQ(tok->special_prefix(), std::vector<int32_t>{0});
    EXPECT_EQ(tok->special_suffix(), std::vector<int32_t>{1});
  }
  // LlamaTokenizerFast: its flags decide, tokenizer.json's template does not.
  const auto with_config = [&](const json& config) {
    const fs::path dir =
        edited_tokenizer_json([&](json& r) { r["post_processor"] = bos_template; });
    std::ofstream(dir / "tokenizer_config.json") << config.dump();
    return Tokenizer::load(dir);
  };
  const json llama = {{"tokenizer_class", "LlamaTokenizerFast"},
                      {"bos_token", {{"content", "<｜begin▁of▁sentence｜>"}}},
                      {"eos_token", "<｜end▁of▁sentence｜>"}};
  EXPECT_EQ(with_config(llama)->special_prefix(), std::vector<int32_t>{0});
  json off = llama;
  off["add_bos_token"] = false;
  off["add_eos_token"] = true;
  const auto tok = with_config(off);
  EXPECT_TRUE(tok->special_prefix().empty());
  EXPECT_EQ(tok->special_suffix(), std::vector<int32_t>{1});
  json other = llama;
  other["tokenizer_class"] = "PreTrainedTokenizerFast";
  other["add_bos_token"] = false;  // not LlamaTokenizerFast's: the template stays
  EXPECT_EQ(with_config(other)->special_prefix(), std::vector<int32_t>{0});
  json missing = llama;
  missing["bos_token"] = "<no such token>";
  EXPECT_THROW(with_config(missing), TokenizerError);
  fs::remove_all(tokenizer_json_dir());
  // tiktoken.model: nothing added.
  const auto kimi = Tokenizer::load(kFixtures / "kimi");
  EXPECT_TRUE(kimi->special_prefix().empty() && kimi->special_suffix().empty());
}

std::string load_error(const fs::path& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerJson, RefusesUnsupportedComponentsByName) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> expected_in_message;
  };
  const std::vector<Case> cases_ = {
      {[](json& r) {
         r["normalizer"] = {{"type", "NFC"}};
       },
       {"normalizer", "NFC"}},
      {[](json& r) {
         r["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       {"Metaspace"}},
      {[](json& r) { r["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       {"pretokenizers[0].behavior"}},
      {[](json& r) { r["pre_tokenizer"]["pretokenizers"][3]["add_prefix_space"] = true; },
       {"add_prefix_space"}},
      {[](json& r) { r["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "[a&&b]"; },
       {"pretokenizers[1].pattern", "&&"}},
      {[](json& r) {
         r["decoder"] = {{"type", "WordPiece"}};
       },
       {"decoder", "WordPiece"}},
      {[](json& r) { r["model"]["type"] = "Unigram"; }, {"model.type", "Unigram"}},
      {[](json& r) { r["model"]["byte_fallback"] = true; }, {"model.byte_fallback"}},
      {[](json& r) { r["model"]["merges"][5] = "onlyone"; }, {"model.merges[5]"}},
      {[](json& r) { r["added_tokens"][1]["lstrip"] = true; }, {"added_tokens[1].lstrip"}},
      {[](json& r) {
         r["post_processor"] = {{"type", "BertProcessing"}};
       },
       {"post_processor", "BertProcessing"}},
  };
  for (const Case& c : cases_) {
    const std::string message = load_error(edited_tokenizer_json(c.edit));
    ASSERT_FALSE(message.empty());
    EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
    for (const std::string& part : c.expected_in_message) {
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
  fs::remove_all(tokenizer_json_dir());
}

TEST(TokenizerLoad, ErrorsNameTheFileAndLine) {
  const fs::path dir = fs::temp_directory_path() / "hyserve_tokenizer_load_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_NE(load_error(dir).find("tiktoken.model"), std::string::npos);
  std::ofstream(dir / "tiktoken.model") << "QQ== 0\nQg== 1\nnot-base64! 2\n";
  const std::string message = load_error(dir);
  EXPECT_NE(message.find("tiktoken.model:3:"), std::string::npos) << message;
  std::ofstream(dir / "tiktoken.model") << "QQ== 0\nQg== 1\n";
  EXPECT_NE(load_error(dir).find("byte 0 has no token"), std::string::npos) << load_error(dir);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hyserve
