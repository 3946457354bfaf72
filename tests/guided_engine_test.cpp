// Guided decoding through the engine with the bundled tiny model (random weights): whatever
// the model would say, every output is a prefix the grammar accepts, and an output that
// finished with "stop" is complete (it parses and follows the schema); choices always finish
// with one of the choices. Preemption by recompute and n > 1 keep their own constraint states.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "guided/json_matcher.h"
#include "guided/json_schema.h"
#include "guided/token_constraint.h"
#include "guided/vocab_trie.h"
#include "tokenizer/tokenizer.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kTinyModel = fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";

struct Result {
  std::vector<int32_t> ids;
  std::string finish_reason;
};

struct GuidedRun {
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(kTinyModel);
  std::unique_ptr<Engine> engine;
  std::shared_ptr<const VocabTrie> vocab;
  std::map<std::string, Result> results;

  explicit GuidedRun(EngineConfig config) {
    engine = std::make_unique<Engine>(Model::load(kTinyModel), config);
    vocab = std::make_shared<const VocabTrie>(
        VocabTrie::from_tokenizer(*tokenizer, engine->model().config().vocab_size));
  }

  // The prompt is "Answer in JSON: ", after num_filler_tokens copies of " a".
  void add(const std::string& id, std::shared_ptr<const TokenConstraint> constraint, uint64_t seed,
           int64_t max_tokens, int64_t num_filler_tokens = 0) {
    Request r;
    r.id = id;
    r.prompt_token_ids.assign(static_cast<size_t>(num_filler_tokens),
                              tokenizer->encode(" a", false).front());
    const auto tail = tokenizer->encode("Answer in JSON: ", false);
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
    r.sampling_params.temperature = 1.0f;
    r.sampling_params.seed = seed;
    r.sampling_params.max_tokens = max_tokens;
    r.sampling_params.constraint = std::move(constraint);
    engine->add_request(std::move(r), [this](const RequestOutput& o) {
      Result& res = results[o.request_id];
      for (const OutputToken& t : o.new_tokens) res.ids.push_back(t.token);
      if (o.finished) res.finish_reason = o.finish_reason;
    });
  }

  void run() {
    for (int i = 0; i < 100000 && engine->step(); ++i) {
    }
  }

  // The output text without a final EOS.
  std::string text(const Result& r) const {
    std::vector<int32_t> ids = r.ids;
    const auto& eos = engine->config().scheduler.eos_token_ids;
    if (!ids.empty() && std::find(eos.begin(), eos.end(), ids.back()) != eos.end()) ids.pop_back();
    return tokenizer->decode(ids, false);
  }
};

// Every test runs with and without asynchronous scheduling (config reads it): a guided
// row's mask needs the token the step before sampled, which the runner then waits for.
bool g_async_scheduling = false;

class GuidedEngine : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { g_async_scheduling = GetParam(); }
  void TearDown() override { g_async_scheduling = false; }
};

INSTANTIATE_TEST_SUITE_P(Scheduling, GuidedEngine, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Async" : "Sync";
                         });

EngineConfig config(int32_t num_blocks = 0) {
  EngineConfig c;
  c.async_scheduling = g_async_scheduling;
  c.scheduler.max_model_len = 256;
  c.scheduler.max_num_seqs = 8;
  c.num_blocks = num_blocks;
  return c;
}

TEST_P(GuidedEngine, OutputsFollowTheSchemaUnderPreemption) {
  const std::string schema_text = R"({"type": "object", "properties": {
      "ok": {"type": "boolean"}, "n": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["ok", "n"]})";
  // 8 prompts ending a few tokens before a block boundary, outputs of up to 64 tokens: each
  // request holds 2 rows (token block + KDA state) at admission and needs a third as it
  // grows; 7 rows admit three at once, so growing ones preempt others.
  GuidedRun run(config(7));
  const int64_t block_size = run.engine->model().cache_plan().block_size;
  const int64_t num_prompt =
      static_cast<int64_t>(run.tokenizer->encode("Answer in JSON: ", false).size());
  auto constraint = std::make_shared<const TokenConstraint>(
      compile_json_schema(ordered_json::parse(schema_text)), run.vocab);
  for (int i = 0; i < 8; ++i)
    run.add(str_cat("r", i), constraint, 100 + static_cast<uint64_t>(i), 64,
            block_size - 4 - num_prompt);
  run.run();
  EXPECT_GT(run.engine->stats().num_preemptions, 0);
  int num_stopped = 0;
  for (const auto& [id, r] : run.results) {
    const std::string text = run.text(r);
    JsonMatcher m(constraint->grammar());
    EXPECT_TRUE(m.advance(text)) << id << ": " << text;
    if (r.finish_reason == "stop") {
      ++num_stopped;
      EXPECT_TRUE(m.accepting()) << id << ": " << text;
      const ordered_json value = ordered_json::parse(text);
      EXPECT_TRUE(value["ok"].is_boolean()) << text;
      EXPECT_TRUE(value["n"].is_number_integer()) << text;
    } else {
      EXPECT_EQ(r.finish_reason, "length") << id;
    }
  }
  EXPECT_EQ(run.results.size(), 8u);
  std::printf("%d of 8 outputs finished with stop\n", num_stopped);
}

TEST_P(GuidedEngine, JsonObjectOutputsAreObjectPrefixes) {
  GuidedRun run(config());
  auto constraint = std::make_shared<const TokenConstraint>(Grammar::any_object(), run.vocab);
  for (int i = 0; i < 4; ++i)
    run.add(str_cat("o", i), constraint, 7 + static_cast<uint64_t>(i), 48);
  run.run();
  for (const auto& [id, r] : run.results) {
    const std::string text = run.text(r);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.find_first_not_of(" \t\r\n"), text.find('{')) << text;
    JsonMatcher m(constraint->grammar());
    EXPECT_TRUE(m.advance(text)) << text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(ordered_json::parse(text).is_object()) << text;
    }
  }
}

TEST_P(GuidedEngine, ChoicesFinishWithOneOfThem) {
  GuidedRun run(config());
  const std::vector<std::string> choices = {"yes", "no", "maybe later"};
  auto constraint = std::make_shared<const TokenConstraint>(Grammar::choices(choices), run.vocab);
  for (int i = 0; i < 6; ++i)
    run.add(str_cat("c", i), constraint, 40 + static_cast<uint64_t>(i), 32);
  run.run();
  ASSERT_EQ(run.results.size(), 6u);
  for (const auto& [id, r] : run.results) {
    EXPECT_EQ(r.finish_reason, "stop") << id;
    EXPECT_NE(std::find(choices.begin(), choices.end(), run.text(r)), choices.end())
        << id << ": '" << run.text(r) << "'";
  }
}

// ignore_eos and min_tokens fight a finished structure (only EOS may follow): the request
// goes on with EOS tokens, and the engine never meets a row with nothing to sample.
TEST_P(GuidedEngine, IgnoreEosAndMinTokensKeepTheEngineAlive) {
  GuidedRun run(config());
  auto constraint = std::make_shared<const TokenConstraint>(Grammar::choices({"ok"}), run.vocab);
  for (int i = 0; i < 2; ++i) {
    Request r;
    r.id = str_cat("e", i);
    r.prompt_token_ids = run.tokenizer->encode("x", false);
    r.sampling_params.temperature = 1.0f;
    r.sampling_params.seed = 5;
    r.sampling_params.max_tokens = 12;
    if (i == 0) r.sampling_params.ignore_eos = true;
    if (i == 1) r.sampling_params.min_tokens = 8;
    r.sampling_params.constraint = constraint;
    run.engine->add_request(std::move(r), [&run](const RequestOutput& o) {
      Result& res = run.results[o.request_id];
      for (const OutputToken& t : o.new_tokens) res.ids.push_back(t.token);
      if (o.finished) res.finish_reason = o.finish_reason;
    });
  }
  run.run();
  EXPECT_TRUE(run.engine->alive());
  const auto& eos = run.engine->config().scheduler.eos_token_ids;
  for (const auto& [id, r] : run.results) {
    std::vector<int32_t> text_ids;
    for (int32_t t : r.ids) {
      if (std::find(eos.begin(), eos.end(), t) == eos.end()) text_ids.push_back(t);
    }
    EXPECT_EQ(run.tokenizer->decode(text_ids, false), "ok") << id;
  }
  EXPECT_EQ(run.results["e0"].finish_reason, "length");
  EXPECT_EQ(run.results["e0"].ids.size(), 12u);
  EXPECT_EQ(run.results["e1"].finish_reason, "stop");
  EXPECT_EQ(run.results["e1"].ids.size(), 8u);
}

}  // namespace
}  // namespace hyserve
