// Engine with prefix caching: a hit (cached latents, index keys and KDA snapshots) gives
// bitwise what a miss gives, a cache_salt isolates requests, prompt logprobs skip the cache,
// and a random workload with eviction equals the same workload without caching.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "engine_test_helpers.h"

namespace hyserve {
namespace {

using namespace test;

Request logprob_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens,
                        std::optional<uint64_t> seed) {
  Request r = make_request(std::move(id), std::move(prompt), max_tokens);
  r.sampling_params.logprobs = 3;
  if (seed) {
    r.sampling_params.temperature = 1.0f;
    r.sampling_params.seed = seed;
  }
  return r;
}

// A prompt that shares two full blocks with an earlier one reads their latents and index
// keys, and the KDA state snapshot at their end, from the cache; its tokens and logprobs
// equal those of the same request on an engine with prefix caching off, bitwise.
TEST_P(EngineTest, PrefixHitEqualsMissBitwise) {
  EngineConfig config = small_config(4096, 4);
  auto model = load_tiny();
  const int64_t bs = model->cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 4 * bs;
  config.enable_prefix_caching = true;
  Engine cached(std::move(model), config);
  config.enable_prefix_caching = false;
  Engine plain(load_tiny(), config);
  const int64_t vocab = cached.model().config().vocab_size;

  const std::vector<int32_t> prefix = random_prompt(2 * bs, 500, vocab);
  Collector with, without;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt = prefix;
    const auto suffix = random_prompt(5 + 13 * i, 510 + static_cast<uint32_t>(i), vocab);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const std::optional<uint64_t> seed = i % 2 ? std::optional<uint64_t>(7 + i) : std::nullopt;
    const std::string id = str_cat("r", i);
    cached.add_request(logprob_request(id, prompt, 8, seed), with.callback());
    run_to_completion(cached);
    plain.add_request(logprob_request(id, prompt, 8, seed), without.callback());
    run_to_completion(plain);
    EXPECT_EQ(with.results[id].num_cached_tokens, i == 0 ? 0 : 2 * bs) << id;
    EXPECT_EQ(without.results[id].num_cached_tokens, 0) << id;
    expect_same_tokens(with.results[id], without.results[id], id);
  }
  EXPECT_EQ(cached.stats().prefix_cache_hits, 3 * 2 * bs);
  EXPECT_EQ(plain.stats().prefix_cache_hits, 0);
}

// A different cache_salt never reads another request's blocks; prompt logprobs need every
// position computed, so such a request reads nothing either.
TEST_P(EngineTest, PrefixCacheIsIsolatedBySaltAndSkippedForPromptLogprobs) {
  auto model = load_tiny();
  const auto [config, bs] = prefix_caching_config(*model);
  Engine engine(std::move(model), config);
  const auto prompt = random_prompt(bs + 9, 520, engine.model().config().vocab_size);
  Collector col;
  auto add = [&](const std::string& id, const std::string& salt, bool prompt_logprobs) {
    Request r = make_request(id, prompt, 2);
    r.cache_salt = salt;
    if (prompt_logprobs) r.sampling_params.prompt_logprobs = 1;
    engine.add_request(std::move(r), col.callback());
    run_to_completion(engine);
  };
  add("first", "a", false);
  add("same-salt", "a", false);
  add("other-salt", "b", false);
  add("prompt-logprobs", "a", true);
  EXPECT_EQ(col.results["first"].num_cached_tokens, 0);
  EXPECT_EQ(col.results["same-salt"].num_cached_tokens, bs);
  EXPECT_EQ(col.results["other-salt"].num_cached_tokens, 0);
  EXPECT_EQ(col.results["prompt-logprobs"].num_cached_tokens, 0);
  EXPECT_EQ(col.results["prompt-logprobs"].prompt_logprobs.size(), prompt.size());
  EXPECT_EQ(col.results["same-salt"].ids(), col.results["first"].ids());
  EXPECT_EQ(col.results["other-salt"].ids(), col.results["first"].ids());
}

// 24 concurrent requests over 3 shared prefixes, chunked under a small token budget, in a
// pool that holds the 4 running requests (4 rows each at most) and little else, so cached
// blocks are evicted: every request's tokens and logprobs equal those of an engine without
// prefix caching, bitwise. (Preemption is left out: a recomputed request runs its earlier
// outputs through chunked KDA instead of the recurrent step, which rounds differently.)
TEST_P(EngineTest, RandomWorkloadWithPrefixCachingEqualsWithout) {
  EngineConfig config = small_config(/*max_num_batched_tokens=*/96, /*max_num_seqs=*/4);
  auto model = load_tiny();
  const int64_t bs = model->cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 4 * bs;
  config.num_blocks = 20;
  config.enable_prefix_caching = true;
  Engine cached(std::move(model), config);
  config.enable_prefix_caching = false;
  config.num_blocks = 0;
  Engine plain(load_tiny(), config);
  const int64_t vocab = cached.model().config().vocab_size;

  std::mt19937 rng(530);
  std::vector<std::vector<int32_t>> prefixes;
  for (uint32_t i = 0; i < 3; ++i) prefixes.push_back(random_prompt(bs + 40 * i, 540 + i, vocab));
  Collector with, without;
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt = prefixes[rng() % 3];
    const auto suffix = random_prompt(1 + rng() % 70, 550 + static_cast<uint32_t>(i), vocab);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const int64_t max_tokens = 1 + static_cast<int64_t>(rng() % 12);
    const std::optional<uint64_t> seed = i % 3 ? std::optional<uint64_t>(9 + i) : std::nullopt;
    const std::string id = str_cat("r", i);
    cached.add_request(logprob_request(id, prompt, max_tokens, seed), with.callback());
    plain.add_request(logprob_request(id, prompt, max_tokens, seed), without.callback());
    if (i % 5 == 4) cached.step();  // later arrivals find earlier requests' blocks
  }
  run_to_completion(cached);
  run_to_completion(plain);
  int64_t num_hits = 0;
  for (int i = 0; i < 24; ++i) {
    const std::string id = str_cat("r", i);
    ASSERT_TRUE(with.results[id].finished) << id;
    expect_same_tokens(with.results[id], without.results[id], id);
    num_hits += with.results[id].num_cached_tokens > 0;
  }
  EXPECT_GT(num_hits, 0);
  EXPECT_EQ(cached.stats().num_preemptions, 0);
  EXPECT_EQ(cached.stats().kv_cache_usage, 0.0);
}

}  // namespace
}  // namespace hyserve
