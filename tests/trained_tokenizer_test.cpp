// The tokenizer trained here (issue 50): models/tiny-k3-speaks, a 4,096-rank byte-level BPE
// written by tools/train_bpe.py on Python 3.11's documentation (tools/make_corpus.py), loaded by
// hyserve's TiktokenTokenizer. Checks: ids equal the trainer's own encoder (golden.json),
// held-out paragraphs round-trip byte for byte at well under one token per byte, and the
// special tokens and chat template are the bundled model's (the model-facing format is K3's).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/tiktoken_tokenizer.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource = fs::path(HYSERVE_SOURCE_DIR);
const fs::path kTrainedDir = kSource / "models/tiny-k3-speaks";
const fs::path kBundledDir = kSource / "models/tiny-kimi-k3";

json read_golden() {
  std::ifstream in(kSource / "tests/fixtures/tiny_k3_speaks_tokenizer/golden.json");
  EXPECT_TRUE(in.good());
  return json::parse(in);
}

std::vector<int32_t> ids_of(const json& list) {
  return list.get<std::vector<int32_t>>();
}

TEST(TrainedTokenizer, HasTheTrainedRanksAndKimisReservedSpecials) {
  const auto tok = TiktokenTokenizer::load(kTrainedDir);
  EXPECT_EQ(tok->num_base_tokens(), 4096);
  EXPECT_EQ(tok->vocab_size(), 4096 + TiktokenTokenizer::kNumReservedSpecial);
  EXPECT_EQ(tok->num_base_tokens(), read_golden()["num_ranks"].get<int>());
}

TEST(TrainedTokenizer, EncodesTheSentenceAsTheTrainerDoes) {
  const auto tok = TiktokenTokenizer::load(kTrainedDir);
  const json golden = read_golden();
  const std::string sentence = golden["sentence"];
  const std::vector<int32_t> ids = tok->encode(sentence, /*allow_special=*/true);
  EXPECT_EQ(ids, ids_of(golden["sentence_ids"]));
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), sentence);
}

TEST(TrainedTokenizer, HeldOutParagraphsRoundTripAtWellUnderOneTokenPerByte) {
  const auto tok = TiktokenTokenizer::load(kTrainedDir);
  const json golden = read_golden();
  ASSERT_GE(golden["heldout_paragraphs"].size(), 5u);
  std::size_t num_bytes = 0, num_tokens = 0;
  for (const json& paragraph : golden["heldout_paragraphs"]) {
    const std::string text = paragraph["text"];
    const std::vector<int32_t> ids = tok->encode(text, /*allow_special=*/false);
    EXPECT_EQ(ids, ids_of(paragraph["ids"])) << text;
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), text);
    num_bytes += text.size();
    num_tokens += ids.size();
  }
  // The trainer measures 0.2475 over the whole held-out split; bytes-level would be 1.0.
  const double tokens_per_byte = static_cast<double>(num_tokens) / static_cast<double>(num_bytes);
  EXPECT_LT(tokens_per_byte, 0.32);
  EXPECT_LT(golden["heldout_tokens_per_byte"].get<double>(), 0.3);
}

TEST(TrainedTokenizer, SpecialTokensSitWhereTheBundledModelsDo) {
  const auto trained = TiktokenTokenizer::load(kTrainedDir);
  const auto bundled = TiktokenTokenizer::load(kBundledDir);
  for (const KimiSpecialToken& named : kKimiDefaultSpecialTokens) {
    const int32_t id = trained->token_id(named.content);
    EXPECT_EQ(id, trained->num_base_tokens() + named.offset) << named.content;
    EXPECT_EQ(bundled->token_id(named.content) - bundled->num_base_tokens(), named.offset);
    EXPECT_EQ(trained->is_special(id), named.special) << named.content;
    EXPECT_EQ(trained->decode(std::vector<int32_t>{id}, false), named.content);
  }
}

TEST(TrainedTokenizer, ChatTemplateRendersAsTheBundledModels) {
  const ChatTemplates trained = load_chat_templates(kTrainedDir);
  const ChatTemplates bundled = load_chat_templates(kBundledDir);
  EXPECT_EQ(trained.by_name, bundled.by_name);
  const SpecialTokens trained_special = load_special_tokens(kTrainedDir);
  const SpecialTokens bundled_special = load_special_tokens(kBundledDir);
  EXPECT_EQ(trained_special.bos_token, bundled_special.bos_token);
  EXPECT_EQ(trained_special.eos_token, bundled_special.eos_token);

  const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What does a list comprehension do?"},
    {"role": "assistant", "content": "It builds a list.", "reasoning_content": "Short."},
    {"role": "user", "content": "And a generator?"}])");
  const std::string prompt =
      ChatTemplate(trained.select(false)).render(messages, nullptr, true, nullptr, trained_special);
  EXPECT_EQ(prompt, ChatTemplate(bundled.select(false))
                        .render(messages, nullptr, true, nullptr, bundled_special));
  EXPECT_TRUE(prompt.starts_with("<|im_system|>system<|im_middle|>You are terse.<|im_end|>"));
  EXPECT_TRUE(prompt.ends_with("<|im_assistant|>assistant<|im_middle|><think>"));

  // The rendered prompt's markers are single special ids, at the same offsets past the ranks.
  const auto tok = TiktokenTokenizer::load(kTrainedDir);
  const auto ref = TiktokenTokenizer::load(kBundledDir);
  const std::vector<int32_t> ids = tok->encode(prompt, /*allow_special=*/true);
  const std::vector<int32_t> ref_ids = ref->encode(prompt, /*allow_special=*/true);
  std::vector<int32_t> offsets, ref_offsets;
  for (int32_t id : ids)
    if (id >= tok->num_base_tokens()) offsets.push_back(id - tok->num_base_tokens());
  for (int32_t id : ref_ids)
    if (id >= ref->num_base_tokens()) ref_offsets.push_back(id - ref->num_base_tokens());
  EXPECT_EQ(offsets, ref_offsets);
  EXPECT_EQ(offsets.size(), 17u);  // 4 turns x 3 markers, <think></think>, 3 opening the reply
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), prompt);
  EXPECT_LT(ids.size(), ref_ids.size());  // 4,096 ranks of English compress better than 768
}

}  // namespace
}  // namespace hyserve
