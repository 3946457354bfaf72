// The scripted RL loop of issue 48 item 3 (tests/rl_scoring_test.cpp on the CPU,
// tests/gpu/rl_scoring_gpu_test.cpp on the GPU): rollouts sampled in mixed batches, each
// completed rollout scored by prompt_logprobs alone and all together on engines with other
// token budgets, every sampled token's log-prob equal to its scored one bit for bit and the
// KL == 0.0 at every step.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine_test_helpers.h"
#include "lora_test_util.h"
#include "random_prompt.h"
#include "util/format.h"

namespace hyserve::test {

// One RL step's engine: blocks of 64 tokens (KDA prefill chunks), the step's token budget
// (the prefill chunk size), prefix caching on.
inline EngineConfig step_config(int64_t max_num_batched_tokens, bool async, bool speculative) {
  EngineConfig c;
  c.async_scheduling = async;
  c.scheduler.max_model_len = 320;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.max_num_seqs = 6;
  c.min_block_size = 64;
  c.enable_prefix_caching = true;
  if (speculative) {
    c.speculative.method = SpeculativeMethod::kNgram;
    c.speculative.num_speculative_tokens = 3;
    c.speculative.prompt_lookup_min = 1;
    c.speculative.prompt_lookup_max = 2;
  }
  return c;
}

struct Rollout {
  std::vector<int32_t> prompt;
  std::vector<OutputToken> tokens;  // sampled, with their log-probs
};

// The step's rollouts: prompts from two shared prefixes (prefix hits once a first request's
// blocks are cached) with suffixes of different lengths, sampled at temperature 1 with a seed;
// half start together, the rest join while the first decode (prefill chunks beside decode
// tokens).
// With an adapter loaded as "policy", the even rollouts use it (a mixed batch).
inline std::vector<Rollout> run_rollouts(Engine& engine, int step, int64_t vocab) {
  const std::vector<int32_t> shared[2] = {random_prompt(128, 7000 + step, vocab),
                                          random_prompt(64, 8000 + step, vocab)};
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = shared[i % 2];
    // (Rollout 0's prompt ends one token past a block: its last prefill chunk is that token.)
    const int64_t tail_length = i == 0 ? 1 : 1 + (step * 13 + i * 29) % 50;
    const std::vector<int32_t> tail = random_prompt(tail_length, 900 + i, vocab);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    Request r = make_request(str_cat("rollout-", step, "-", i), prompt, 4 + (step + 5 * i) % 13);
    r.sampling_params.temperature = 1.0f;
    r.sampling_params.seed = static_cast<uint64_t>(step * 100 + i);
    r.sampling_params.logprobs = 0;
    if (engine.loras() != nullptr && i % 2 == 0) {
      EXPECT_TRUE(engine.loras()->attach("policy", r));
    }
    requests.push_back(std::move(r));
  }
  Collector col;
  for (size_t i = 0; i < requests.size(); ++i) {
    engine.add_request(requests[i], col.callback());
    if (i == 2) {
      for (int s = 0; s < 3; ++s) engine.step();
    }
  }
  run_to_completion(engine);
  std::vector<Rollout> rollouts;
  int64_t num_hits = 0;
  for (const Request& r : requests) {
    const Collected& c = col.results.at(r.id);
    EXPECT_TRUE(c.finished) << r.id;
    num_hits += c.num_cached_tokens > 0 ? 1 : 0;
    rollouts.push_back({r.prompt_token_ids, c.tokens});
  }
  EXPECT_GT(num_hits, 0) << "step " << step << ": no prefix hit";
  return rollouts;
}

// The scorer: each completed rollout as a prompt with prompt_logprobs (max_tokens 1, as the
// server scores with echo and max_tokens 0); returns the log-prob of every sampled token.
// Together: every rollout in one batch; else one at a time.
inline std::vector<std::vector<float>> score(Engine& engine, const std::vector<Rollout>& rollouts,
                                             const std::string& tag, bool together) {
  std::vector<Request> requests;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    std::vector<int32_t> ids = rollouts[i].prompt;
    for (const OutputToken& t : rollouts[i].tokens) ids.push_back(t.token);
    Request r = make_request(str_cat("score-", tag, "-", i), ids, 1);
    r.sampling_params.prompt_logprobs = 0;
    if (engine.loras() != nullptr && i % 2 == 0) {
      EXPECT_TRUE(engine.loras()->attach("policy", r));
    }
    requests.push_back(std::move(r));
  }
  Collector col;
  for (const Request& r : requests) {
    engine.add_request(r, col.callback());
    if (!together) run_to_completion(engine);
  }
  run_to_completion(engine);
  std::vector<std::vector<float>> scored;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected& c = col.results.at(requests[i].id);
    const size_t first = rollouts[i].prompt.size();
    std::vector<float> lp;
    for (size_t j = 0; j < rollouts[i].tokens.size(); ++j) {
      const std::optional<OutputToken>& e = c.prompt_logprobs.at(first + j);
      EXPECT_TRUE(e.has_value());
      if (!e) return {};
      EXPECT_EQ(e->token, rollouts[i].tokens[j].token);
      lp.push_back(e->logprob);
    }
    scored.push_back(std::move(lp));
  }
  return scored;
}

// sum(rollout - scored) over every token, each token compared bitwise.
inline double kl_and_expect_equal(const std::vector<Rollout>& rollouts,
                                  const std::vector<std::vector<float>>& scored,
                                  const std::string& what) {
  EXPECT_EQ(scored.size(), rollouts.size()) << what;
  double kl = 0.0;
  int64_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < rollouts.size() && i < scored.size(); ++i) {
    for (size_t j = 0; j < rollouts[i].tokens.size(); ++j) {
      const float a = rollouts[i].tokens[j].logprob, b = scored[i][j];
      kl += static_cast<double>(a) - static_cast<double>(b);
      ++tokens;
      if (std::memcmp(&a, &b, sizeof(float)) != 0) {
        ++mismatches;
        ADD_FAILURE() << what << ": rollout " << i << " token " << j << " sampled " << a
                      << ", scored " << b << " (diff " << a - b << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << tokens << " tokens differ";
  return kl;
}

// The RL loop: per step the rollouts on one engine, then each scored alone on an engine with
// another budget and all together on a third; every token equal and KL == 0.0 at every step.
// lora: the step's policy is an adapter (new weights every step, as a trainer's update) on
// half the rollouts.
// keep: the adapter's targets (by canonical name), all when empty.
inline void run_rl_loop(const std::function<std::unique_ptr<Model>(int step)>& load, int first_step,
                        int end_step, bool lora = false,
                        const std::function<bool(const std::string&)>& keep = {}) {
  const int64_t budgets[] = {64, 128, 192, 320};
  const std::filesystem::path adapters =
      std::filesystem::path(::testing::TempDir()) / "hyserve_rl_adapters";
  for (int step = first_step; step < end_step; ++step) {
    const bool speculative = step % 2 == 1;
    const auto config = [&](int64_t budget, bool async, bool spec) {
      EngineConfig c = step_config(budget, async, spec);
      if (lora) c.scheduler.max_loras = 1;
      return c;
    };
    Engine rollout_engine(load(step), config(budgets[step % 4], step % 4 == 2, speculative));
    Engine alone(load(step), config(budgets[(step + 1) % 4], false, false));
    Engine together(load(step), config(budgets[(step + 2) % 4], step % 2 == 0, false));
    if (lora) {
      const std::filesystem::path policy =
          write_adapter(rollout_engine.model(), adapters / str_cat("step", step),
                        static_cast<uint32_t>(100 + step), keep);
      for (Engine* e : {&rollout_engine, &alone, &together})
        e->loras()->load("policy", policy, false);
    }
    const int64_t vocab = rollout_engine.model().config().vocab_size;
    const std::vector<Rollout> rollouts = run_rollouts(rollout_engine, step, vocab);
    if (speculative) {
      EXPECT_GT(rollout_engine.stats().spec_decode.num_drafts, 0) << "step " << step;
    }
    const std::string at = str_cat("step ", step);
    const double kl_alone =
        kl_and_expect_equal(rollouts, score(alone, rollouts, "a", false), at + " alone");
    const double kl_together =
        kl_and_expect_equal(rollouts, score(together, rollouts, "t", true), at + " together");
    EXPECT_EQ(kl_alone, 0.0) << at;
    EXPECT_EQ(kl_together, 0.0) << at;
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace hyserve::test
