// Engine generation control (issue 48 item 4): pause in its three modes and resume, the
// prefix-cache reset, sleep and wake-up at both levels, and weight updates: after an update
// the engine's outputs equal a fresh engine's on the new weights (bitwise), no prefix-cache
// entry of the old weights is hit, and a bad update changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_edit.h"
#include "engine_test_helpers.h"
#include "model/checkpoint.h"

namespace hyserve {
namespace {

using namespace test;

std::filesystem::path tiny_dir() {
  return std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
}

// The tiny model with every bf16 value changed in one mantissa bit (relative change ~6%).
std::filesystem::path perturbed_tiny() {
  return rewrite_checkpoint(tiny_dir(), "perturbed", [](std::vector<TensorToWrite>& tensors) {
    for (TensorToWrite& t : tensors) {
      if (t.dtype != DType::kBF16) continue;
      for (size_t i = 0; i < t.bytes.size(); i += 2) t.bytes[i] ^= 0x08;
    }
  });
}

Request logprob_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r = make_request(std::move(id), std::move(prompt), max_tokens);
  r.sampling_params.logprobs = 2;
  return r;
}

// One request run to its end on `engine`.
Collected run_one(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt,
                  int64_t max_tokens = 6) {
  Collector c;
  engine.add_request(logprob_request(id, prompt, max_tokens), c.callback());
  run_to_completion(engine);
  EXPECT_TRUE(c.results[id].finished) << id;
  return c.results[id];
}

TEST_P(EngineTest, ParsesPauseModes) {
  EXPECT_EQ(parse_pause_mode("abort"), PauseMode::kAbort);
  EXPECT_EQ(parse_pause_mode("wait"), PauseMode::kWait);
  EXPECT_EQ(parse_pause_mode("keep"), PauseMode::kKeep);
  EXPECT_THROW(parse_pause_mode("later"), InvalidRequest);
}

// keep: the running request stops where it is and a new one waits; after resume both finish
// with exactly the tokens they get without the pause.
TEST_P(EngineTest, PauseKeepFreezesAndResumeContinuesBitwise) {
  Engine engine(load_tiny(), small_config());
  Engine plain(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  const auto p1 = random_prompt(20, 1, vocab), p2 = random_prompt(9, 2, vocab);
  Collector c;
  engine.add_request(logprob_request("a", p1, 8), c.callback());
  for (int i = 0; i < 3; ++i) engine.step();
  engine.pause(PauseMode::kKeep, false);
  EXPECT_TRUE(engine.is_paused());
  size_t before = 0;
  {
    std::lock_guard lock(c.mu);
    before = c.results["a"].tokens.size();
    EXPECT_FALSE(c.results["a"].finished);
  }
  engine.add_request(logprob_request("b", p2, 5), c.callback());
  for (int i = 0; i < 5; ++i) engine.step();
  {
    std::lock_guard lock(c.mu);
    EXPECT_EQ(c.results["a"].tokens.size(), before) << "a ran while paused";
    EXPECT_EQ(c.results.count("b"), 0u) << "b ran while paused";
  }
  EXPECT_EQ(engine.stats().num_running + engine.stats().num_waiting, 1);
  engine.resume();
  EXPECT_FALSE(engine.is_paused());
  run_to_completion(engine);
  expect_same_tokens(c.results["a"], run_one(plain, "a", p1, 8), "a");
  expect_same_tokens(c.results["b"], run_one(plain, "b", p2, 5), "b");
}

// abort: what runs finishes with "abort"; an abort of a held request while paused ends it.
TEST_P(EngineTest, PauseAbortEndsRunningRequests) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  Collector c;
  engine.add_request(logprob_request("a", random_prompt(20, 3, vocab), 50), c.callback());
  engine.step();
  engine.pause(PauseMode::kAbort, true);
  EXPECT_TRUE(c.results["a"].finished);
  EXPECT_EQ(c.results["a"].finish_reason, "abort");
  engine.add_request(logprob_request("b", random_prompt(5, 4, vocab), 3), c.callback());
  engine.add_request(logprob_request("c", random_prompt(5, 5, vocab), 3), c.callback());
  engine.abort_request("b");
  engine.step();
  EXPECT_EQ(c.results["b"].finish_reason, "abort");
  EXPECT_FALSE(c.results["c"].finished);
  engine.resume();
  run_to_completion(engine);
  EXPECT_EQ(c.results["c"].finish_reason, "length");
  EXPECT_EQ(c.results["c"].tokens.size(), 3u);
}

// wait, on a running engine thread: pause returns once the running request has finished;
// one added meanwhile waits for resume.
TEST_P(EngineTest, PauseWaitDrainsThenHolds) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  engine.start();
  Collector c;
  engine.add_request(logprob_request("a", random_prompt(30, 6, vocab), 20), c.callback());
  engine.pause(PauseMode::kWait, false);
  {
    std::lock_guard lock(c.mu);
    EXPECT_TRUE(c.results["a"].finished);
    EXPECT_EQ(c.results["a"].finish_reason, "length");
  }
  engine.add_request(logprob_request("b", random_prompt(5, 7, vocab), 3), c.callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard lock(c.mu);
    EXPECT_EQ(c.results.count("b"), 0u);
  }
  engine.resume();
  std::unique_lock lock(c.mu);
  ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.num_finished == 2; }));
  EXPECT_EQ(c.results["b"].tokens.size(), 3u);
  lock.unlock();
  engine.stop();
}

TEST_P(EngineTest, ResetPrefixCacheForgetsEveryEntry) {
  auto model = load_tiny();
  auto [config, bs] = prefix_caching_config(*model);
  Engine engine(std::move(model), config);
  const auto prompt = random_prompt(2 * bs + 5, 8, engine.model().config().vocab_size);
  const Collected first = run_one(engine, "a", prompt);
  EXPECT_EQ(run_one(engine, "b", prompt).num_cached_tokens, 2 * bs);
  EXPECT_GT(engine.reset_prefix_cache(), 0);
  const Collected after = run_one(engine, "c", prompt);
  EXPECT_EQ(after.num_cached_tokens, 0);
  expect_same_tokens(after, first, "after the reset");
  EXPECT_GT(engine.reset_prefix_cache(), 0);  // c's blocks
  EXPECT_EQ(engine.reset_prefix_cache(), 0);
}

// Both levels: the KV cache (and at level 2 the weights) freed, outputs after waking equal
// those before, bitwise; requests sent while asleep run after the wake-up.
TEST_P(EngineTest, SleepAndWakeUpKeepOutputs) {
  auto model = load_tiny();
  auto [config, bs] = prefix_caching_config(*model);
  Engine engine(std::move(model), config);
  const auto prompt = random_prompt(2 * bs + 3, 9, engine.model().config().vocab_size);
  const Collected before = run_one(engine, "a", prompt);
  for (int level : {1, 2}) {
    const std::string tag = "level " + std::to_string(level);
    engine.sleep(level, PauseMode::kWait);
    EXPECT_EQ(engine.sleep_level(), level);
    EXPECT_TRUE(engine.is_paused());
    EXPECT_EQ(engine.model().weights_resident(), level == 1) << tag;
    EXPECT_THROW(engine.resume(), InvalidRequest) << tag;
    Collector c;
    const std::string id = "asleep" + std::to_string(level);
    engine.add_request(logprob_request(id, prompt, 6), c.callback());
    for (int i = 0; i < 3; ++i) engine.step();
    EXPECT_EQ(c.results.count(id), 0u) << tag;
    engine.wake_up({"weights"});
    EXPECT_EQ(engine.sleep_level(), level) << tag << ": the cache is still asleep";
    EXPECT_TRUE(engine.model().weights_resident());
    engine.wake_up({"kv_cache"});
    EXPECT_EQ(engine.sleep_level(), 0) << tag;
    EXPECT_FALSE(engine.is_paused()) << tag;
    run_to_completion(engine);
    EXPECT_EQ(c.results[id].num_cached_tokens, 0) << tag << ": the cache was discarded";
    expect_same_tokens(c.results[id], before, tag);
  }
  EXPECT_THROW(engine.sleep(3, PauseMode::kWait), InvalidRequest);
  EXPECT_THROW(engine.sleep(1, PauseMode::kKeep), InvalidRequest);
  EXPECT_THROW(engine.wake_up({"everything"}), InvalidRequest);
}

// After an update, outputs equal a fresh engine's on the new weights, bitwise, and differ
// from the old ones; a prompt cached with the old weights is not a hit.
TEST_P(EngineTest, WeightUpdateEqualsFreshEngine) {
  const std::filesystem::path next_dir = perturbed_tiny();
  auto model = load_tiny();
  auto [config, bs] = prefix_caching_config(*model);
  Engine engine(std::move(model), config);
  Engine fresh(Model::load(next_dir), config);
  const auto prompt = random_prompt(2 * bs + 7, 10, engine.model().config().vocab_size);
  const Collected old_out = run_one(engine, "a", prompt);
  EXPECT_EQ(run_one(engine, "b", prompt).num_cached_tokens, 2 * bs);
  engine.update_weights(std::make_unique<Checkpoint>(Checkpoint::open(next_dir)));
  EXPECT_EQ(engine.weights_generation(), 1);
  const Collected new_out = run_one(engine, "c", prompt);
  EXPECT_EQ(new_out.num_cached_tokens, 0) << "a block of the old weights was hit";
  expect_same_tokens(new_out, run_one(fresh, "c", prompt), "updated vs fresh");
  ASSERT_FALSE(new_out.tokens.empty());
  EXPECT_NE(std::memcmp(&new_out.tokens[0].logprob, &old_out.tokens[0].logprob, 4), 0)
      << "the update changed nothing";
  // Its own blocks are hits again.
  EXPECT_EQ(run_one(engine, "d", prompt).num_cached_tokens, 2 * bs);
  // Back to the first weights: the first outputs again.
  engine.update_weights(std::make_unique<Checkpoint>(Checkpoint::open(tiny_dir())));
  expect_same_tokens(run_one(engine, "e", prompt), old_out, "updated back");
}

// A checkpoint with a misshapen tensor is refused naming it, and the engine runs on with
// the weights it had.
TEST_P(EngineTest, BadWeightUpdateChangesNothing) {
  const std::filesystem::path bad =
      rewrite_checkpoint(tiny_dir(), "bad_update", [](std::vector<TensorToWrite>& tensors) {
        for (TensorToWrite& t : tensors) {
          if (t.name.ends_with("layers.0.input_layernorm.weight")) {
            t.shape[0] -= 1;
            t.bytes.resize(t.bytes.size() - (t.dtype == DType::kF32 ? 4 : 2));
          }
        }
      });
  Engine engine(load_tiny(), small_config());
  const auto prompt = random_prompt(12, 11, engine.model().config().vocab_size);
  const Collected before = run_one(engine, "a", prompt);
  try {
    engine.update_weights(std::make_unique<Checkpoint>(Checkpoint::open(bad)));
    ADD_FAILURE() << "a misshapen tensor was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.input_layernorm.weight"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(engine.weights_generation(), 0);
  expect_same_tokens(run_one(engine, "b", prompt), before, "after the refused update");
}

// An id may be used again once its request has finished (clients choose ids).
TEST_P(EngineTest, RequestIdReusedAfterFinishing) {
  Engine engine(load_tiny(), small_config());
  const auto prompt = random_prompt(12, 12, engine.model().config().vocab_size);
  const Collected first = run_one(engine, "x", prompt);
  const Collected again = run_one(engine, "x", prompt);
  EXPECT_EQ(again.finish_reason, "length");
  expect_same_tokens(again, first, "x again");
}

}  // namespace
}  // namespace hyserve
