// A long prompt beside decoding streams, through the Engine on the bundled model (CPU): with
// the prefill cost cap (SchedulerConfig::max_step_prefill_cost) every stream gets a token in
// every step while the prompt prefills in shrinking chunks, each step's tokens stay within
// what the cap affords, the prompt still finishes, and the longest step (the longest gap any
// stream sees) stays short. An abort of a prompt mid-prefill takes effect in the next step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_helpers.h"
#include "util/error.h"

namespace hyserve {
namespace {

using namespace test;

// Tokens per step, from the engine's observer.
struct StepTokens : EngineObserver {
  std::vector<int64_t> tokens;
  void request_finished(const FinishedRequest&) override {}
  void first_token(double) override {}
  void inter_token(double) override {}
  void step(int64_t n) override { tokens.push_back(n); }
};

// 20 streams decode and a prompt of prompt_len tokens arrives, with a token budget of 512 and
// its default cap (512 x 1024 + 512^2 / 2 = 655,360 units): every stream gets a token in every
// step, each step's prefill fits the cap (or is the one aligned chunk a long prompt always
// gets), the prompt finishes, and no step (the longest gap any stream sees) takes over 0.5 s.
// Returns the number of steps.
int run_streams_beside_a_long_prompt(int64_t prompt_len) {
  constexpr int kStreams = 20;
  const int64_t kLong = prompt_len;
  EngineConfig config;
  config.scheduler.max_model_len = kLong + 64;
  config.scheduler.max_num_batched_tokens = 512;
  config.scheduler.max_num_seqs = kStreams + 1;
  config.scheduler.max_step_prefill_cost = default_max_step_prefill_cost(config.scheduler);
  config.min_block_size = 16;
  StepTokens steps;
  Engine engine(load_tiny(), config);
  engine.set_observer(&steps);
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  for (int i = 0; i < kStreams; ++i) {
    engine.add_request(make_request(str_cat("s", i), random_prompt(16, 900 + i, vocab), kLong),
                       col.callback());
  }
  engine.step();  // the streams' prompts
  engine.add_request(make_request("long", random_prompt(kLong, 999, vocab), 1), col.callback());

  // A step's time: the smaller of its wall time and the process's CPU time, so that neither
  // other processes on a loaded machine (wall) nor a thread pool's parallel work (CPU) make it
  // look longer than it is.
  using Clock = std::chrono::steady_clock;
  double longest_step_s = 0.0;
  int num_steps = 0;
  const auto start = Clock::now();
  // step() delivers on this thread: the collector is read between steps.
  const auto tokens_of = [&](const std::string& id) { return col.results[id].tokens.size(); };
  while (!col.results["long"].finished && num_steps < 5000) {
    std::vector<size_t> before;
    for (int i = 0; i < kStreams; ++i) before.push_back(tokens_of(str_cat("s", i)));
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    EXPECT_TRUE(engine.step());
    const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    longest_step_s = std::max(longest_step_s, std::min(wall_s, cpu_s));
    ++num_steps;
    for (int i = 0; i < kStreams; ++i) {
      EXPECT_EQ(tokens_of(str_cat("s", i)), before[i] + 1) << "s" << i << ", step " << num_steps;
    }
    if (testing::Test::HasFailure()) return num_steps;
  }
  const double prefill_s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(col.results["long"].finished);
  EXPECT_EQ(col.results["long"].finish_reason, "length");
  EXPECT_EQ(col.results["long"].tokens.size(), 1u);

  // Each step's prefill tokens: what the cap affords past the chunk's start, never more
  // than the first chunk (the token budget less the decodes, aligned down to the KDA chunk).
  EXPECT_EQ(std::ssize(steps.tokens), 1 + num_steps);
  int64_t computed = 0;
  for (int k = 1; k <= num_steps && k < std::ssize(steps.tokens); ++k) {
    const int64_t chunk = steps.tokens[k] - kStreams;
    if (k == 1) {
      EXPECT_EQ(chunk, (512 - kStreams) / 64 * 64);
    }
    EXPECT_TRUE(chunk <= 64 ||
                step_cost(computed, chunk, 1024) <= config.scheduler.max_step_prefill_cost)
        << "step " << k << ": " << chunk << " tokens at " << computed;
    computed += chunk;
  }
  EXPECT_EQ(computed, kLong);
  for (int i = 0; i < kStreams; ++i) engine.abort_request(str_cat("s", i));
  run_to_completion(engine);
  std::printf("long prefill of %lld tokens: %d steps in %.2f s, longest step %.3f s\n",
              static_cast<long long>(kLong), num_steps, prefill_s, longest_step_s);
  EXPECT_LE(longest_step_s, 0.5) << "the issue's bound on the longest gap";
  return num_steps;
}

// 4,000 tokens. Measured on the 2-core CPU machine (issue 49's): 23 steps, chunks 448, 320,
// 320, 256, 192 x 5, then 128; the prompt done in 1.8 s, the longest step 0.14 s (before the
// vectorized indexer: 7 s, 0.26 s). The same with the cap off: 9 chunks of 448, the steps
// growing to 0.73 s of CPU at 3.5K of context; the default token budget (8192) uncapped: one
// 12.8 s step.
TEST(EngineLongPrefill, StreamsGetATokenEveryStepWhileALongPromptPrefills) {
  EXPECT_EQ(run_streams_beside_a_long_prompt(4000), 23);
}

// The target: 20 streams beside a 32,768-token prompt.
TEST(EngineLongPrefill, StreamsGetATokenEveryStepBesideA32kPrompt) {
  run_streams_beside_a_long_prompt(32768);
}

// A prompt aborted mid-prefill is gone after the next step: its blocks freed, "abort"
// delivered, nothing left to run.
TEST_P(EngineTest, AbortMidPrefillTakesEffectInTheNextStep) {
  EngineConfig config = small_config(256, 4);
  config.scheduler.max_model_len = 2048;
  Engine engine(load_tiny(), config);
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  engine.add_request(make_request("long", random_prompt(2000, 7, vocab), 5), col.callback());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.step());
  EXPECT_EQ(engine.stats().num_running, 1);
  EXPECT_GT(engine.stats().kv_cache_usage, 0.0);
  EXPECT_TRUE(col.results["long"].tokens.empty());
  engine.abort_request("long");
  EXPECT_TRUE(engine.step());
  EXPECT_TRUE(col.results["long"].finished);
  EXPECT_EQ(col.results["long"].finish_reason, "abort");
  EXPECT_TRUE(col.results["long"].tokens.empty());
  EXPECT_EQ(engine.stats().num_running, 0);
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  EXPECT_FALSE(engine.step());
}

}  // namespace
}  // namespace hyserve
