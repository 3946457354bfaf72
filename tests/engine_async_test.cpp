// Asynchronous scheduling against synchronous scheduling on one mixed workload, bitwise.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_helpers.h"

namespace hyserve {
namespace {

using namespace test;

// Asynchronous scheduling gives every request exactly what synchronous scheduling gives:
// tokens and logprobs bitwise, finish reasons, stop ids and prefix hits. The workload has
// penalties, logit_bias, min_tokens against EOS, stop ids, seeded sampling, logprobs, and
// prefix caching with a KDA snapshot at every block boundary; its second round resends the
// first round's conversations (prompt + output), so hits land on snapshots taken during
// decode, where the boundary's last token was still a placeholder when it was scheduled.
TEST(EngineAsyncTest, AsyncSchedulingEqualsSyncOnAMixedWorkload) {
  EngineConfig config = small_config(/*max_num_batched_tokens=*/160, /*max_num_seqs=*/6);
  auto model = load_tiny();
  const int64_t bs = model->cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 6 * bs;
  config.enable_prefix_caching = true;
  config.snapshot_policy.every_blocks = 1;
  Engine sync_engine(std::move(model), config);
  config.async_scheduling = true;
  Engine async_engine(load_tiny(), config);
  const int64_t vocab = sync_engine.model().config().vocab_size;
  const int32_t eos = sync_engine.config().scheduler.eos_token_ids.at(0);

  std::mt19937 rng(900);
  auto make = [&](int i, std::vector<int32_t> prompt) {
    Request r = make_request(str_cat("q", i), std::move(prompt), 1 + rng() % (bs + 20));
    SamplingParams& sp = r.sampling_params;
    if (i % 2) {
      sp.temperature = 0.7f + 0.1f * static_cast<float>(i % 4);
      sp.seed = 100 + i;
      sp.top_p = i % 3 ? 1.0f : 0.9f;
    }
    if (i % 3 == 0) sp.logprobs = static_cast<int32_t>(i % 4);
    if (i % 4 == 1) {
      sp.repetition_penalty = 1.3f;
      sp.presence_penalty = 0.5f;
      sp.frequency_penalty = 0.25f;
    }
    if (i % 5 == 2) sp.logit_bias = {{eos, 6.0f}, {static_cast<int32_t>(rng() % vocab), 3.0f}};
    if (i % 3 == 1) {
      sp.ignore_eos = false;  // EOS ends it (after min_tokens): a step in flight is dropped
      sp.min_tokens = static_cast<int64_t>(rng() % 6);
    }
    if (i % 7 == 3) sp.stop_token_ids = {static_cast<int32_t>(rng() % vocab)};
    return r;
  };
  Collector want, got;
  std::vector<Request> first_round;
  for (int i = 0; i < 14; ++i) {
    const auto prompt = random_prompt(1 + rng() % (2 * bs), 910 + static_cast<uint32_t>(i), vocab);
    first_round.push_back(make(i, prompt));
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<Request> requests;
    if (round == 0) {
      requests = first_round;
    } else {
      for (int i = 0; i < 14; ++i) {  // each conversation resent with its output
        const Request& earlier = first_round[static_cast<size_t>(i)];
        std::vector<int32_t> prompt = earlier.prompt_token_ids;
        for (int32_t t : want.results[earlier.id].ids()) prompt.push_back(t);
        prompt.push_back(static_cast<int32_t>(rng() % vocab));
        if (std::ssize(prompt) >= config.scheduler.max_model_len - 1) continue;
        requests.push_back(make(100 + i, prompt));
        requests.back().sampling_params.max_tokens =
            std::min<int64_t>(*requests.back().sampling_params.max_tokens,
                              config.scheduler.max_model_len - std::ssize(prompt));
      }
    }
    for (size_t k = 0; k < requests.size(); ++k) {
      sync_engine.add_request(requests[k], want.callback());
      async_engine.add_request(requests[k], got.callback());
      if (k % 4 == 3) {  // later arrivals join running batches
        sync_engine.step();
        async_engine.step();
      }
    }
    run_to_completion(sync_engine);
    run_to_completion(async_engine);
  }
  ASSERT_EQ(got.results.size(), want.results.size());
  int64_t decode_hits = 0;
  for (const auto& [id, w] : want.results) {
    const Collected& g = got.results[id];
    ASSERT_TRUE(g.finished && w.finished) << id;
    expect_same_tokens(g, w, id);
    EXPECT_EQ(g.finish_reason, w.finish_reason) << id;
    EXPECT_EQ(g.stop_token_id, w.stop_token_id) << id;
    EXPECT_EQ(g.num_cached_tokens, w.num_cached_tokens) << id;
    decode_hits += w.num_cached_tokens > 0;
  }
  EXPECT_GT(decode_hits, 0);
  EXPECT_EQ(async_engine.stats().prefix_cache_hits, sync_engine.stats().prefix_cache_hits);
  EXPECT_EQ(async_engine.stats().generation_tokens, sync_engine.stats().generation_tokens);
  EXPECT_GT(async_engine.stats().num_overlapped_steps, 0);
  EXPECT_EQ(sync_engine.stats().num_overlapped_steps, 0);
  EXPECT_EQ(async_engine.stats().kv_cache_usage, 0.0);
}

}  // namespace
}  // namespace hyserve
