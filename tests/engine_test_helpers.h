// The engine tests' tools: the tiny model run alone (the reference every engine output is
// compared with), a Collector of request outputs, request and config builders, and the
// EngineTest fixture that runs each test with and without asynchronous scheduling (its
// instantiation is in engine_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "kernels/sampling/cpu.h"
#include "random_prompt.h"

namespace hyserve::test {

inline std::unique_ptr<Model> load_tiny() {
  return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3");
}

// The model alone: one sequence, one token at a time; logits[i] scores position i.
struct AloneRun {
  std::vector<int32_t> outputs;
  std::vector<std::vector<float>> logits;  // [prompt + outputs - 1][vocab]
};

// Greedy (temperature 0) or seeded sampling with temperature 1, as the engine samples.
inline AloneRun run_alone(const Model& model, const std::vector<int32_t>& prompt,
                          int64_t num_outputs, std::optional<uint64_t> seed = std::nullopt) {
  AloneRun run;
  SequenceState st = model.new_sequence();
  std::vector<int32_t> seq = prompt;
  std::vector<float> l;
  for (size_t pos = 0; run.outputs.size() < static_cast<size_t>(num_outputs); ++pos) {
    model.forward(std::span<const int32_t>(&seq[pos], 1), st, l);
    run.logits.push_back(l);
    if (pos + 1 < seq.size()) continue;
    SamplingOptions o;
    o.temperature = seed ? 1.0f : 0.0f;
    o.seed = seed.value_or(0);
    o.step = run.outputs.size();
    int32_t token = -1;
    cpu::sample_tokens({l.data(), &o, &token, 1, static_cast<int64_t>(l.size())});
    run.outputs.push_back(token);
    seq.push_back(token);
  }
  return run;
}

// Logits of every position of `tokens`, fed one at a time: [tokens][vocab].
inline std::vector<std::vector<float>> logits_alone(const Model& model,
                                                    const std::vector<int32_t>& tokens) {
  SequenceState st = model.new_sequence();
  std::vector<std::vector<float>> rows;
  std::vector<float> l;
  for (const int32_t& t : tokens) {
    model.forward(std::span<const int32_t>(&t, 1), st, l);
    rows.push_back(l);
  }
  return rows;
}

struct Collected {
  std::vector<OutputToken> tokens;
  std::vector<std::optional<OutputToken>> prompt_logprobs;
  int num_outputs = 0;
  bool finished = false;
  std::string finish_reason;
  std::optional<int32_t> stop_token_id;
  int64_t num_cached_tokens = 0;

  std::vector<int32_t> ids() const {
    std::vector<int32_t> v;
    for (const auto& t : tokens) v.push_back(t.token);
    return v;
  }
};

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Collected> results;
  int num_finished = 0;

  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard lock(mu);
      Collected& c = results[o.request_id];
      EXPECT_FALSE(c.finished) << o.request_id << " got an output after finishing";
      if (c.num_outputs++ == 0) c.prompt_logprobs = o.prompt_logprobs;
      c.num_cached_tokens = o.num_cached_tokens;
      c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) {
        c.finished = true;
        c.finish_reason = o.finish_reason;
        c.stop_token_id = o.stop_token_id;
        ++num_finished;
        cv.notify_all();
      }
    };
  }
};

inline Request make_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  return r;
}

// Every engine test runs with and without asynchronous scheduling (small_config reads it).
inline bool g_async_scheduling = false;

class EngineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { g_async_scheduling = GetParam(); }
  void TearDown() override { g_async_scheduling = false; }
};

inline EngineConfig small_config(int64_t max_num_batched_tokens = 256, int64_t max_num_seqs = 8) {
  EngineConfig c;
  c.async_scheduling = g_async_scheduling;
  c.scheduler.max_model_len = 128;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.max_num_seqs = max_num_seqs;
  c.min_block_size = 16;
  return c;
}

// small_config(4096, 4) with prefix caching and a context of 4 blocks; the block size.
inline std::pair<EngineConfig, int64_t> prefix_caching_config(const Model& model) {
  EngineConfig config = small_config(4096, 4);
  const int64_t bs = model.cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 4 * bs;
  config.enable_prefix_caching = true;
  return {config, bs};
}

inline void run_to_completion(Engine& engine) {
  for (int i = 0; i < 10000 && engine.step(); ++i) {
  }
}

// Every sampled token, its logprob and its top logprobs, bitwise.
inline void expect_same_tokens(const Collected& got, const Collected& want,
                               const std::string& what) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    const OutputToken& a = got.tokens[i];
    const OutputToken& b = want.tokens[i];
    EXPECT_EQ(a.token, b.token) << what << " token " << i;
    EXPECT_EQ(std::memcmp(&a.logprob, &b.logprob, 4), 0)
        << what << " token " << i << ": logprob " << a.logprob << " vs " << b.logprob;
    ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size()) << what << " token " << i;
    for (size_t j = 0; j < b.top_logprobs.size(); ++j) {
      EXPECT_EQ(a.top_logprobs[j].token, b.top_logprobs[j].token) << what << " token " << i;
      EXPECT_EQ(std::memcmp(&a.top_logprobs[j].logprob, &b.top_logprobs[j].logprob, 4), 0)
          << what << " token " << i << " top " << j;
    }
  }
}

}  // namespace hyserve::test
