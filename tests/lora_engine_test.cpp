// LoRA through the engine (issue 48): requests name adapters from the LoraRegistry, the
// scheduler gives them --max-loras slots (a request whose adapter finds no slot waits), a
// batch mixing adapters and none gives each request exactly the tokens and logprobs it
// gets alone, an unload or a replacement never changes a request in flight, and the
// prefix cache never serves a block computed under another adapter, none, or an adapter's
// earlier generation.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine_test_helpers.h"
#include "lora_test_util.h"
#include "model/safetensors.h"

namespace hyserve {
namespace {

using namespace test;
namespace fs = std::filesystem;

class LoraEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hyserve_lora_engine_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An engine with `max_loras` slots and adapters "x" and "y" loaded.
  std::unique_ptr<Engine> make_engine(int64_t max_loras, bool prefix_caching = false,
                                      SpeculativeConfig speculative = {}) {
    EngineConfig config = small_config(256, 8);
    config.speculative = speculative;
    config.scheduler.max_loras = max_loras;
    config.enable_prefix_caching = prefix_caching;
    if (prefix_caching) config.scheduler.max_model_len = 512;  // 4 blocks of the tiny K3
    auto engine = std::make_unique<Engine>(load_tiny(), config);
    x_ = write_adapter(engine->model(), dir_ / "x", 31, keep_);
    y_ = write_adapter(engine->model(), dir_ / "y", 32, keep_);
    engine->loras()->load("x", x_, false);
    engine->loras()->load("y", y_, false);
    return engine;
  }

  static Request lora_request(Engine& engine, std::string id, std::vector<int32_t> prompt,
                              const std::string& adapter, int64_t max_tokens = 6) {
    Request r = make_request(std::move(id), std::move(prompt), max_tokens);
    r.sampling_params.logprobs = 2;
    if (!adapter.empty()) {
      EXPECT_TRUE(engine.loras()->attach(adapter, r)) << adapter;
    }
    return r;
  }

  // The request run alone on the engine.
  static Collected alone(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt,
                         const std::string& adapter) {
    Collector col;
    engine.add_request(lora_request(engine, id, prompt, adapter), col.callback());
    run_to_completion(engine);
    EXPECT_TRUE(col.results[id].finished) << id;
    return col.results[id];
  }

  // Without kv_b, the decode step carries each row's slot in its inputs (one slice, as a
  // CUDA graph runs it); with it, each sequence attends in a slice of its own.
  void adapt_kv_b(bool on) {
    keep_ = on ? std::function<bool(const std::string&)>{} : [](const std::string& name) {
      return name.find("kv_b_proj") == std::string::npos;
    };
  }

  fs::path dir_, x_, y_;
  std::function<bool(const std::string&)> keep_;
};

const std::vector<int32_t> kPromptA = {3, 17, 42, 8, 99, 1, 64, 23, 7, 11, 250, 4};
const std::vector<int32_t> kPromptB = {5, 6, 7, 300, 12, 19, 2};

// Adapters X, none, Y and X again in one batch (prefill then decode, through the engine's
// runner and its decode step), with adapters on kv_b and without: each request gets bitwise
// the tokens and logprobs it gets alone; with an adapter they differ from the base.
TEST_F(LoraEngine, MixedBatchEqualsEachAlone) {
  for (const bool kv_b : {true, false}) {
    SCOPED_TRACE(kv_b ? "adapters with kv_b" : "adapters without kv_b");
    adapt_kv_b(kv_b);
    auto engine = make_engine(2);
    const Collected base = alone(*engine, "base", kPromptA, "");
    const Collected x = alone(*engine, "x", kPromptA, "x");
    const Collected y = alone(*engine, "y", kPromptA, "y");
    const Collected xb = alone(*engine, "xb", kPromptB, "x");
    EXPECT_NE(std::memcmp(&base.tokens[0].logprob, &x.tokens[0].logprob, 4), 0);
    EXPECT_NE(std::memcmp(&x.tokens[0].logprob, &y.tokens[0].logprob, 4), 0);

    Collector col;
    engine->add_request(lora_request(*engine, "m-x", kPromptA, "x"), col.callback());
    engine->add_request(lora_request(*engine, "m-none", kPromptA, ""), col.callback());
    engine->add_request(lora_request(*engine, "m-y", kPromptA, "y"), col.callback());
    engine->add_request(lora_request(*engine, "m-xb", kPromptB, "x"), col.callback());
    run_to_completion(*engine);
    expect_same_tokens(col.results["m-x"], x, "x");
    expect_same_tokens(col.results["m-none"], base, "none");
    expect_same_tokens(col.results["m-y"], y, "y");
    expect_same_tokens(col.results["m-xb"], xb, "x, prompt B");
  }
}

// Speculative decoding with adapters: the verification carries each sequence's slot (and its
// merged kv_b), so a mixed batch with prompt-lookup drafts gives exactly the tokens and
// logprobs of the same batch without drafts.
TEST_F(LoraEngine, SpeculativeVerificationCarriesTheAdapters) {
  SpeculativeConfig ngram;
  ngram.method = SpeculativeMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = 1;
  ngram.prompt_lookup_max = 3;
  std::vector<int32_t> repeating;
  for (int i = 0; i < 6; ++i) repeating.insert(repeating.end(), {21, 22, 23, 24, 25});
  const std::vector<std::pair<std::string, std::vector<int32_t>>> requests = {
      {"x", repeating}, {"", repeating}, {"y", kPromptA}, {"x", kPromptB}};
  for (const bool kv_b : {true, false}) {
    SCOPED_TRACE(kv_b ? "adapters with kv_b" : "adapters without kv_b");
    adapt_kv_b(kv_b);
    std::map<std::string, Collected> want, got;
    SpecDecodeCounts counts;
    for (const bool speculate : {false, true}) {
      auto engine = make_engine(2, false, speculate ? ngram : SpeculativeConfig{});
      Collector col;
      for (size_t i = 0; i < requests.size(); ++i) {
        engine->add_request(lora_request(*engine, "r" + std::to_string(i), requests[i].second,
                                         requests[i].first, 16),
                            col.callback());
      }
      run_to_completion(*engine);
      (speculate ? got : want) = col.results;
      if (speculate) counts = engine->stats().spec_decode;
    }
    for (const auto& [id, w] : want) expect_same_tokens(got[id], w, id);
    EXPECT_GT(counts.num_draft_tokens, 0) << "no draft was verified";
  }
}

// Asynchronous scheduling with one slot (X and Y take turns in it, a base request between):
// the same tokens and logprobs as without it, the steps overlapping.
TEST_F(LoraEngine, AsynchronousSchedulingKeepsTheOutputs) {
  const std::vector<std::pair<std::string, std::vector<int32_t>>> requests = {
      {"x", kPromptA}, {"y", kPromptB}, {"", kPromptA}, {"x", kPromptB}, {"y", kPromptA}};
  std::map<std::string, Collected> want, got;
  for (const bool async : {false, true}) {
    g_async_scheduling = async;
    auto engine = make_engine(1);
    g_async_scheduling = false;
    EXPECT_EQ(engine->config().async_scheduling, async);
    Collector col;
    for (size_t i = 0; i < requests.size(); ++i) {
      engine->add_request(
          lora_request(*engine, "r" + std::to_string(i), requests[i].second, requests[i].first, 10),
          col.callback());
    }
    run_to_completion(*engine);
    (async ? got : want) = col.results;
    if (async) {
      EXPECT_GT(engine->stats().num_overlapped_steps, 0);
    }
  }
  for (const auto& [id, w] : want) expect_same_tokens(got[id], w, id);
}

// One slot: X and Y cannot be resident together, so Y's request waits while X's runs and a
// base request behind Y goes first; all three equal their runs alone.
TEST_F(LoraEngine, RequestWaitsForASlot) {
  auto engine = make_engine(1);
  const Collected x = alone(*engine, "x", kPromptA, "x");
  const Collected y = alone(*engine, "y", kPromptA, "y");
  const Collected base = alone(*engine, "base", kPromptA, "");
  Collector col;
  engine->add_request(lora_request(*engine, "m-x", kPromptA, "x"), col.callback());
  engine->add_request(lora_request(*engine, "m-y", kPromptA, "y"), col.callback());
  engine->add_request(lora_request(*engine, "m-none", kPromptA, ""), col.callback());
  engine->step();
  EXPECT_EQ(engine->stats().num_running, 2);  // x and the base request; y waits
  EXPECT_EQ(engine->stats().num_waiting, 1);
  run_to_completion(*engine);
  expect_same_tokens(col.results["m-x"], x, "x");
  expect_same_tokens(col.results["m-y"], y, "y");
  expect_same_tokens(col.results["m-none"], base, "none");
}

// A request in flight keeps its adapter through a replacement and an unload of its name;
// a request added after the replacement runs with the new adapter.
TEST_F(LoraEngine, ReplaceAndUnloadNeverAffectARequestInFlight) {
  auto engine = make_engine(2);
  const Collected x = alone(*engine, "x", kPromptA, "x");
  const Collected y = alone(*engine, "y", kPromptA, "y");
  Collector col;
  engine->add_request(lora_request(*engine, "old-x", kPromptA, "x"), col.callback());
  engine->step();
  engine->loras()->load("x", y_, /*replace=*/true);  // "x" now has Y's weights
  engine->add_request(lora_request(*engine, "new-x", kPromptA, "x"), col.callback());
  engine->step();
  EXPECT_TRUE(engine->loras()->unload("x"));
  EXPECT_FALSE(engine->loras()->unload("x"));
  EXPECT_FALSE(engine->loras()->find("x").has_value());
  run_to_completion(*engine);
  expect_same_tokens(col.results["old-x"], x, "the old x");
  expect_same_tokens(col.results["new-x"], y, "the replaced x");
  EXPECT_THROW(engine->loras()->load("y", x_, false), InvalidArgument);  // name taken
}

// Prefix caching keyed by adapter: X reuses X's blocks, never Y's or the base model's, and
// a replaced X (a new generation) none of the old X's.
TEST_F(LoraEngine, PrefixCacheIsKeyedByAdapter) {
  auto engine = make_engine(2, /*prefix_caching=*/true);
  const int64_t bs = engine->model().cache_plan(engine->config().min_block_size).block_size;
  const auto prompt = random_prompt(2 * bs + 5, 77, engine->model().config().vocab_size);
  const auto run = [&](const std::string& id, const std::string& adapter) {
    return alone(*engine, id, prompt, adapter);
  };
  EXPECT_EQ(run("x1", "x").num_cached_tokens, 0);
  EXPECT_EQ(run("y1", "y").num_cached_tokens, 0);
  EXPECT_EQ(run("base1", "").num_cached_tokens, 0);
  const Collected x2 = run("x2", "x");
  EXPECT_EQ(x2.num_cached_tokens, 2 * bs);
  EXPECT_EQ(run("y2", "y").num_cached_tokens, 2 * bs);
  EXPECT_EQ(run("base2", "").num_cached_tokens, 2 * bs);
  // A hit gives the tokens a miss gives.
  Collector col;
  Request fresh = lora_request(*engine, "x3", prompt, "x");
  engine->loras()->load("x", x_, /*replace=*/true);  // same weights, a new generation
  engine->add_request(lora_request(*engine, "x4", prompt, "x"), col.callback());
  run_to_completion(*engine);
  EXPECT_EQ(col.results["x4"].num_cached_tokens, 0);
  expect_same_tokens(col.results["x4"], x2, "x replaced by the same weights");
  engine->add_request(std::move(fresh), col.callback());  // the old generation's key
  run_to_completion(*engine);
  EXPECT_EQ(col.results["x3"].num_cached_tokens, 2 * bs);
}

TEST_F(LoraEngine, AdapterWithoutLoraIsRefused) {
  Engine engine(load_tiny(), small_config());
  EXPECT_EQ(engine.loras(), nullptr);
  Request r = make_request("r", kPromptA, 2);
  r.lora = std::make_shared<const LoraAdapter>();
  EXPECT_THROW(engine.add_request(std::move(r), [](const RequestOutput&) {}), InvalidRequest);
}

}  // namespace
}  // namespace hyserve
