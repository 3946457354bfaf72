// Chat templates rendered by the C++ interpreter must equal transformers' rendering byte
// for byte (fixtures from tools/make_chat_template_fixtures.py), and model folders must
// yield their templates and special tokens as transformers reads them.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace hyserve {
namespace {

const std::filesystem::path kFixtures =
    std::filesystem::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/chat_templates";

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::ordered_json& fixtures() {
  static const auto j = nlohmann::ordered_json::parse(read_text(kFixtures / "expected.json"));
  return j;
}

SpecialTokens tokens_of(const nlohmann::ordered_json& c) {
  SpecialTokens t;
  t.bos_token = c["bos_token"].get<std::string>();
  t.eos_token = c["eos_token"].get<std::string>();
  return t;
}

// The first byte where two strings differ, with context, for failure messages.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return str_cat("first difference at byte ", i, ":\n  got:      ...", a.substr(from, 80),
                 "\n  expected: ...", b.substr(from, 80));
}

TEST(ChatTemplate, MatchesTransformersForEveryFixtureChat) {
  const auto& chats = fixtures()["chats"];
  ASSERT_GE(chats.size(), 30u);
  int num_rendered = 0;
  for (const auto& c : chats) {
    const std::string name = c["name"].get<std::string>();
    const ChatTemplate tmpl(read_text(kFixtures / c["template"].get<std::string>()));
    if (c.contains("error")) {
      try {
        tmpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"],
                    tokens_of(c));
        ADD_FAILURE() << name << ": expected error " << c["error"];
      } catch (const jinja::TemplateError& e) {
        EXPECT_EQ(e.message(), c["error"].get<std::string>()) << name;
      }
      continue;
    }
    const std::string got =
        tmpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"],
                    tokens_of(c));
    const std::string expected = c["expected"].get<std::string>();
    EXPECT_EQ(got, expected) << name << ": " << first_difference(got, expected);
    ++num_rendered;
  }
  EXPECT_GE(num_rendered, 30);
}

TEST(ChatTemplate, RenderChatEqualsCompiledTemplate) {
  const std::string source = read_text(kFixtures / "kimi.jinja");
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo",
          "reasoning": "r"}])");
  const auto kwargs = nlohmann::ordered_json::parse(R"({"thinking": false})");
  const std::string a = render_chat(source, messages, nullptr, true, kwargs, {});
  EXPECT_EQ(a, ChatTemplate(source).render(messages, nullptr, true, kwargs, {}));
  EXPECT_EQ(a,
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
            "<think>r</think>Yo<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>");
}

// transformers copies reasoning under "thinking" (first) and "reasoning_content" (last).
TEST(ChatTemplate, AliasesReasoningFieldsLikeTransformers) {
  const std::string source = "{% for m in messages %}{{ m|tojson }}\n{% endfor %}";
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "assistant", "content": "a", "reasoning": "r1"},
          {"role": "assistant", "reasoning_content": null, "thinking": "t", "content": "b"},
          {"role": "user", "content": "u", "reasoning_content": null}])");
  EXPECT_EQ(render_chat(source, messages, nullptr, false, nullptr, {}),
            "{\"thinking\": \"r1\", \"role\": \"assistant\", \"content\": \"a\", \"reasoning\": "
            "\"r1\", \"reasoning_content\": \"r1\"}\n"
            "{\"thinking\": \"t\", \"role\": \"assistant\", \"reasoning_content\": \"t\", "
            "\"content\": \"b\"}\n"
            "{\"role\": \"user\", \"content\": \"u\", \"reasoning_content\": null}\n");
}

TEST(ChatTemplate, KwargsOverrideSpecialTokensAndToolsDefaultToNone) {
  const std::string source =
      "{{ bos_token }}|{{ eos_token }}|{{ tools }}|{{ documents }}|{{ unk_token is defined }}";
  SpecialTokens t;
  t.bos_token = "<s>";
  t.eos_token = "</s>";
  EXPECT_EQ(render_chat(source, nlohmann::ordered_json::array(), nullptr, false,
                        nlohmann::ordered_json{{"eos_token", "E"}}, t),
            "<s>|E|None|None|False");
}

TEST(ChatTemplate, RejectsMalformedInput) {
  EXPECT_THROW(render_chat("x", nlohmann::ordered_json::object(), nullptr, false, nullptr, {}),
               InvalidArgument);
  EXPECT_THROW(render_chat("x", nlohmann::ordered_json::array({1}), nullptr, false, nullptr, {}),
               InvalidArgument);
  EXPECT_THROW(
      render_chat("{% if %}", nlohmann::ordered_json::array(), nullptr, false, nullptr, {}),
      jinja::TemplateError);
}

class ModelFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("hyserve_chat_template_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ModelFolder, NoTemplateGivesEmpty) {
  EXPECT_TRUE(load_chat_templates(dir_).empty());
  write("tokenizer_config.json", R"({"bos_token": "[BOS]"})");
  EXPECT_TRUE(load_chat_templates(dir_).empty());
}

TEST_F(ModelFolder, StringTemplateFromTokenizerConfig) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "{{ bos_token }}hi", "bos_token": {"content": "[BOS]", "lstrip": false},
            "eos_token": "[EOS]"})");
  const auto templates = load_chat_templates(dir_);
  EXPECT_EQ(templates.select(false), "{{ bos_token }}hi");
  EXPECT_EQ(templates.select(true), "{{ bos_token }}hi");
  const auto tokens = load_special_tokens(dir_);
  EXPECT_EQ(tokens.bos_token, "[BOS]");
  EXPECT_EQ(tokens.eos_token, "[EOS]");
  EXPECT_FALSE(tokens.unk_token.has_value());
}

TEST_F(ModelFolder, NamedTemplatesPickToolUseWhenToolsGiven) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"},
            {"name": "rag", "template": "R"}]})");
  const auto templates = load_chat_templates(dir_);
  EXPECT_EQ(templates.select(false), "D");
  EXPECT_EQ(templates.select(true), "T");
  EXPECT_EQ(templates.select(true, "rag"), "R");
  EXPECT_THROW(templates.select(false, "missing"), InvalidArgument);
}

TEST_F(ModelFolder, JinjaFileWinsOverTokenizerConfig) {
  write("tokenizer_config.json", R"({"chat_template": "from config"})");
  write("chat_template.jinja", "from file\n");
  EXPECT_EQ(load_chat_templates(dir_).select(false), "from file\n");
}

TEST_F(ModelFolder, MalformedConfigIsACheckpointError) {
  write("tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_THROW(load_chat_templates(dir_), CheckpointError);
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default"}]})");
  EXPECT_THROW(load_chat_templates(dir_), CheckpointError);
  write("tokenizer_config.json", "{not json");
  EXPECT_THROW(load_chat_templates(dir_), CheckpointError);
}

TEST(ChatTemplate, TinyKimiShipsTheKimiTemplate) {
  const auto dir = std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
  EXPECT_EQ(load_chat_templates(dir).select(false), read_text(kFixtures / "kimi.jinja"));
}

}  // namespace
}  // namespace hyserve
