// Engine: requests through the scheduler, one batched forward per step and the sampler
// give exactly what the model gives each request alone (the CPU ops are batch invariant),
// under chunked prefill, concurrency and preemption; plus the logits processors on
// hand-made logits.
#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/sampling/cpu.h"
#include "random_prompt.h"
#include "util/error.h"
#include "util/logits.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load_tiny() {
  return Model::load(fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3");
}

using test::random_prompt;

// The model alone: one sequence, one token at a time; logits[i] scores position i.
struct AloneRun {
  std::vector<int32_t> outputs;
  std::vector<std::vector<float>> logits;  // [prompt + outputs - 1][vocab]
};

// Greedy (temperature 0) or seeded sampling with temperature 1, as the engine samples.
AloneRun run_alone(const Model& model, const std::vector<int32_t>& prompt, int64_t num_outputs,
                   std::optional<uint64_t> seed = std::nullopt) {
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
std::vector<std::vector<float>> logits_alone(const Model& model,
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

Request make_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  return r;
}

// Every engine test runs with and without asynchronous scheduling (small_config reads it).
bool g_async_scheduling = false;

class EngineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { g_async_scheduling = GetParam(); }
  void TearDown() override { g_async_scheduling = false; }
};

INSTANTIATE_TEST_SUITE_P(Scheduling, EngineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Async" : "Sync";
                         });

EngineConfig small_config(int64_t max_num_batched_tokens = 256, int64_t max_num_seqs = 8) {
  EngineConfig c;
  c.async_scheduling = g_async_scheduling;
  c.scheduler.max_model_len = 128;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.max_num_seqs = max_num_seqs;
  c.min_block_size = 16;
  return c;
}

// small_config(4096, 4) with prefix caching and a context of 4 blocks; the block size.
std::pair<EngineConfig, int64_t> prefix_caching_config(const Model& model) {
  EngineConfig config = small_config(4096, 4);
  const int64_t bs = model.cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 4 * bs;
  config.enable_prefix_caching = true;
  return {config, bs};
}

void run_to_completion(Engine& engine) {
  for (int i = 0; i < 10000 && engine.step(); ++i) {
  }
}

TEST_P(EngineTest, GreedyOutputEqualsTheModelAlone) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  const std::vector<int64_t> lengths = {1, 7, 40};
  std::vector<AloneRun> alone;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const auto prompt = random_prompt(lengths[i], 100 + static_cast<uint32_t>(i), vocab);
    alone.push_back(run_alone(engine.model(), prompt, 6));
    engine.add_request(make_request(str_cat("r", i), prompt, 6), col.callback());
    run_to_completion(engine);
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    const Collected& c = col.results[str_cat("r", i)];
    EXPECT_EQ(c.ids(), alone[i].outputs) << "prompt length " << lengths[i];
    EXPECT_TRUE(c.finished);
    EXPECT_EQ(c.finish_reason, "length");
  }
  EXPECT_EQ(engine.stats().num_running, 0);
  EXPECT_EQ(engine.stats().generation_tokens, 18);
  EXPECT_EQ(engine.stats().prompt_tokens, 48);
}

// 16 requests of mixed lengths under a 32-token budget and 4 running at most: prefills are
// chunked and batched with other requests' decodes.
TEST_P(EngineTest, ConcurrentChunkedPrefillEqualsEachRequestAlone) {
  Engine engine(load_tiny(), small_config(/*max_num_batched_tokens=*/32, /*max_num_seqs=*/4));
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  std::vector<AloneRun> alone;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 16; ++i) {
    const int64_t n = 1 + (i * 13) % 61;
    const int64_t max_tokens = 2 + i % 5;
    const auto prompt = random_prompt(n, 200 + static_cast<uint32_t>(i), vocab);
    alone.push_back(run_alone(engine.model(), prompt, max_tokens));
    lengths.push_back(n);
    engine.add_request(make_request(str_cat("r", i), prompt, max_tokens), col.callback());
  }
  run_to_completion(engine);
  for (int i = 0; i < 16; ++i) {
    const Collected& c = col.results[str_cat("r", i)];
    EXPECT_EQ(c.ids(), alone[static_cast<size_t>(i)].outputs)
        << "request " << i << ", prompt length " << lengths[static_cast<size_t>(i)];
    EXPECT_EQ(c.finish_reason, "length") << i;
  }
}

// Batch-invariant mode on the CPU (its ops are invariant anyway): what the mode changes in
// the model - a step mixing prefill chunks and decode tokens runs as two forwards whose
// logits rows are put back in batch order, and a one-token prefill chunk takes the
// chunked KDA form - must leave every output, logprob and prompt logprob what the request
// gets alone.
TEST_P(EngineTest, BatchInvariantModeConcurrentEqualsAloneBitwise) {
  ModelOptions options;
  options.batch_invariant = true;
  const auto load = [&] {
    return Model::load(fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", options);
  };
  EngineConfig config = small_config(/*max_num_batched_tokens=*/96, /*max_num_seqs=*/6);
  config.scheduler.max_model_len = 256;
  config.min_block_size = 64;
  Engine batched(load(), config);
  Engine alone(load(), config);
  const int64_t vocab = batched.model().config().vocab_size;
  Collector col_batched, col_alone;
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    Request r =
        make_request(str_cat("r", i), random_prompt(1 + (i * 37) % 150, 900 + i, vocab), 3 + i % 4);
    r.sampling_params.logprobs = 2;
    if (i % 3 == 0) r.sampling_params.prompt_logprobs = 1;
    requests.push_back(r);
  }
  for (const Request& r : requests) batched.add_request(r, col_batched.callback());
  run_to_completion(batched);
  for (const Request& r : requests) {
    alone.add_request(r, col_alone.callback());
    run_to_completion(alone);
  }
  const auto same = [](const OutputToken& a, const OutputToken& b) {
    if (a.token != b.token || std::memcmp(&a.logprob, &b.logprob, sizeof(float)) != 0 ||
        a.top_logprobs.size() != b.top_logprobs.size()) {
      return false;
    }
    for (size_t j = 0; j < a.top_logprobs.size(); ++j) {
      if (a.top_logprobs[j].token != b.top_logprobs[j].token ||
          std::memcmp(&a.top_logprobs[j].logprob, &b.top_logprobs[j].logprob, sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  };
  for (const Request& r : requests) {
    const Collected& got = col_batched.results[r.id];
    const Collected& want = col_alone.results[r.id];
    ASSERT_TRUE(got.finished && want.finished) << r.id;
    ASSERT_EQ(got.tokens.size(), want.tokens.size()) << r.id;
    for (size_t k = 0; k < got.tokens.size(); ++k) {
      EXPECT_TRUE(same(got.tokens[k], want.tokens[k])) << r.id << " output " << k;
    }
    ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size()) << r.id;
    EXPECT_EQ(got.prompt_logprobs.empty(), !r.sampling_params.prompt_logprobs) << r.id;
    for (size_t k = 0; k < got.prompt_logprobs.size(); ++k) {
      ASSERT_EQ(got.prompt_logprobs[k].has_value(), want.prompt_logprobs[k].has_value()) << r.id;
      if (got.prompt_logprobs[k]) {
        EXPECT_TRUE(same(*got.prompt_logprobs[k], *want.prompt_logprobs[k]))
            << r.id << " prompt position " << k;
      }
    }
  }
}

TEST_P(EngineTest, PreemptionByRecomputeKeepsTheAloneOutputs) {
  EngineConfig config = small_config(512, 4);
  // Prompts end 4 tokens before a block boundary and grow across it: each request holds 2
  // blocks (token block + KDA state row) at admission and needs a third after 4 outputs.
  // 7 blocks admit three of them; the second to grow preempts the least urgent.
  auto model = load_tiny();
  const int64_t block_size = model->cache_plan(config.min_block_size).block_size;
  config.scheduler.max_model_len = 2 * block_size;
  config.num_blocks = 7;
  Engine engine(std::move(model), config);
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  std::vector<AloneRun> alone;
  for (int i = 0; i < 4; ++i) {
    const auto prompt = random_prompt(block_size - 4, 300 + static_cast<uint32_t>(i), vocab);
    alone.push_back(run_alone(engine.model(), prompt, 10));
    engine.add_request(make_request(str_cat("r", i), prompt, 10), col.callback());
  }
  run_to_completion(engine);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(col.results[str_cat("r", i)].ids(), alone[static_cast<size_t>(i)].outputs)
        << "request " << i;
  }
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
}

TEST_P(EngineTest, SeedReproducesSampledTokensAndDiffersAcrossSeeds) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  const auto prompt = random_prompt(9, 400, vocab);
  Collector col;
  for (const auto& [id, seed] :
       std::vector<std::pair<std::string, uint64_t>>{{"a", 5}, {"b", 5}, {"c", 6}}) {
    Request r = make_request(id, prompt, 16);
    r.sampling_params.temperature = 1.0f;
    r.sampling_params.seed = seed;
    engine.add_request(std::move(r), col.callback());
  }
  run_to_completion(engine);
  const AloneRun alone = run_alone(engine.model(), prompt, 16, 5);
  EXPECT_EQ(col.results["a"].ids(), alone.outputs);
  EXPECT_EQ(col.results["b"].ids(), alone.outputs);
  EXPECT_NE(col.results["c"].ids(), alone.outputs);
}

TEST_P(EngineTest, StopTokenIdFinishesWithStop) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  const auto prompt = random_prompt(12, 500, vocab);
  const AloneRun alone = run_alone(engine.model(), prompt, 8);
  const int32_t stop = alone.outputs[3];
  const auto first = std::find(alone.outputs.begin(), alone.outputs.end(), stop);
  const std::vector<int32_t> expected(alone.outputs.begin(), first + 1);
  Collector col;
  Request r = make_request("s", prompt, 8);
  r.sampling_params.stop_token_ids = {stop};
  engine.add_request(std::move(r), col.callback());
  run_to_completion(engine);
  const Collected& c = col.results["s"];
  EXPECT_EQ(c.ids(), expected);
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.stop_token_id, stop);
}

TEST_P(EngineTest, AbortMidGenerationFinishesWithAbortAndFreesEverything) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  Collector col;
  engine.add_request(make_request("x", random_prompt(5, 600, vocab), 50), col.callback());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine.step());
  EXPECT_EQ(engine.stats().num_running, 1);
  EXPECT_GT(engine.stats().kv_cache_usage, 0.0);
  engine.abort_request("x");
  EXPECT_TRUE(engine.step());
  const Collected& c = col.results["x"];
  // Asynchronously, the fourth step was still in flight: the abort drops its token.
  EXPECT_EQ(c.tokens.size(), GetParam() ? 3u : 4u);
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.finish_reason, "abort");
  EXPECT_EQ(engine.stats().num_running, 0);
  EXPECT_EQ(engine.stats().num_waiting, 0);
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  EXPECT_FALSE(engine.step());
}

double log_softmax(const std::vector<float>& row, int32_t token) {
  double m = -INFINITY, s = 0.0;
  for (float v : row) m = std::max(m, static_cast<double>(v));
  for (float v : row) s += std::exp(v - m);
  return row[static_cast<size_t>(token)] - m - std::log(s);
}

TEST_P(EngineTest, LogprobsAreLogSoftmaxOfTheRawLogits) {
  Engine engine(load_tiny(), small_config(16, 4));  // the prompt spans two chunks
  const int64_t vocab = engine.model().config().vocab_size;
  const auto prompt = random_prompt(21, 700, vocab);
  Collector col;
  Request r = make_request("l", prompt, 5);
  r.sampling_params.logprobs = 4;
  r.sampling_params.prompt_logprobs = 2;
  r.sampling_params.repetition_penalty = 1.5f;  // logprobs stay those of the raw logits
  engine.add_request(std::move(r), col.callback());
  run_to_completion(engine);
  const Collected& c = col.results["l"];
  ASSERT_EQ(c.tokens.size(), 5u);
  std::vector<int32_t> all = prompt;
  for (const OutputToken& t : c.tokens) all.push_back(t.token);
  const auto alone = logits_alone(engine.model(), all);
  // logits_alone runs one token per step (recurrent KDA) where the engine prefills the prompt
  // (chunked KDA): fp32 rounding apart, up to ~8e-5 on the bundled K3.1 Pro (SiTU, bounded
  // gate, AttnRes).
  constexpr double kTol = 2e-4;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    const std::vector<float>& row = alone[prompt.size() - 1 + i];
    const OutputToken& t = c.tokens[i];
    EXPECT_NEAR(t.logprob, log_softmax(row, t.token), kTol) << "output " << i;
    ASSERT_EQ(t.top_logprobs.size(), 4u);
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_NEAR(t.top_logprobs[k].logprob, log_softmax(row, t.top_logprobs[k].token), kTol);
      if (k > 0) {
        EXPECT_GE(t.top_logprobs[k - 1].logprob, t.top_logprobs[k].logprob) << "output " << i;
      }
    }
    // The best raw logit; the penalty may have moved the greedy choice elsewhere.
    EXPECT_EQ(t.top_logprobs[0].token, argmax(row)) << "output " << i;
  }
  ASSERT_EQ(c.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(c.prompt_logprobs[0].has_value());
  for (size_t i = 1; i < prompt.size(); ++i) {
    ASSERT_TRUE(c.prompt_logprobs[i].has_value()) << i;
    EXPECT_EQ(c.prompt_logprobs[i]->token, prompt[i]);
    // Prompt positions run as 16-token chunks, the reference one token at a time: the
    // logits agree to float rounding, so the bound is relative.
    const double ref = log_softmax(alone[i - 1], prompt[i]);
    EXPECT_NEAR(c.prompt_logprobs[i]->logprob, ref, kTol * (1.0 + std::abs(ref)))
        << "prompt position " << i;
    EXPECT_EQ(c.prompt_logprobs[i]->top_logprobs.size(), 2u);
  }
}

TEST_P(EngineTest, EngineThreadDeliversWhatStepDelivers) {
  const auto model = load_tiny();
  const int64_t vocab = model->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<AloneRun> alone;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(3 + 11 * i, 800 + static_cast<uint32_t>(i), vocab));
    alone.push_back(run_alone(*model, prompts.back(), 4));
  }
  Engine engine(load_tiny(), small_config(32, 4));
  Collector col;
  engine.start();
  for (int i = 0; i < 6; ++i) {
    engine.add_request(make_request(str_cat("t", i), prompts[static_cast<size_t>(i)], 4),
                       col.callback());
  }
  {
    std::unique_lock lock(col.mu);
    ASSERT_TRUE(
        col.cv.wait_for(lock, std::chrono::seconds(20), [&] { return col.num_finished == 6; }));
  }
  engine.stop();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(col.results[str_cat("t", i)].ids(), alone[static_cast<size_t>(i)].outputs)
        << "request " << i;
  }
  EXPECT_TRUE(engine.alive());
}

TEST_P(EngineTest, StopAbortsUnfinishedRequests) {
  Engine engine(load_tiny(), small_config());
  Collector col;
  engine.add_request(make_request("u", {5, 6, 7}, 20), col.callback());
  ASSERT_TRUE(engine.step());
  engine.stop();
  EXPECT_TRUE(col.results["u"].finished);
  EXPECT_EQ(col.results["u"].finish_reason, "abort");
  EXPECT_EQ(engine.stats().num_running, 0);
}

void expect_refused(Engine& engine, Request r, const std::string& field) {
  try {
    engine.add_request(std::move(r), [](const RequestOutput&) {});
    ADD_FAILURE() << "accepted a request with a bad " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST_P(EngineTest, AddRequestRefusesBadParamsNamingTheField) {
  Engine engine(load_tiny(), small_config());
  const Request good = make_request("g", {5, 6, 7}, 4);
  Request r = good;
  r.sampling_params.temperature = -1.0f;
  expect_refused(engine, r, "temperature");
  r = good;
  r.sampling_params.top_p = 0.0f;
  expect_refused(engine, r, "top_p");
  r = good;
  r.sampling_params.logprobs = 21;
  expect_refused(engine, r, "logprobs");
  r = good;
  r.sampling_params.logit_bias = {{1024, 1.0f}};
  expect_refused(engine, r, "logit_bias");
  r = good;
  r.prompt_token_ids.assign(128, 5);
  expect_refused(engine, r, "maximum context length");
  r = good;
  r.sampling_params.max_tokens = 126;
  expect_refused(engine, r, "max_tokens");
  r = good;
  r.prompt_token_ids.clear();
  expect_refused(engine, r, "empty");
  engine.add_request(good, [](const RequestOutput&) {});
  expect_refused(engine, good, "already in use");
}

// The logits processors as SamplingParams defines them (engine/model_runner.h), written out
// per element on the raw row of one step.
std::vector<float> processed_row(std::vector<float> l, const SamplingParams& sp,
                                 const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& outputs,
                                 const std::vector<int32_t>& eos) {
  const auto vocab = static_cast<int32_t>(l.size());
  std::vector<int64_t> count(l.size(), 0);
  std::vector<bool> seen(l.size(), false);
  for (int32_t t : prompt) seen[static_cast<size_t>(t)] = true;
  for (int32_t t : outputs) {
    seen[static_cast<size_t>(t)] = true;
    ++count[static_cast<size_t>(t)];
  }
  for (int32_t i = 0; i < vocab; ++i) {
    float& x = l[static_cast<size_t>(i)];
    if (seen[static_cast<size_t>(i)]) {
      x = x > 0.0f ? x / sp.repetition_penalty : x * sp.repetition_penalty;
    }
    const int64_t c = count[static_cast<size_t>(i)];
    if (c > 0) x -= sp.presence_penalty + sp.frequency_penalty * static_cast<float>(c);
  }
  for (const auto& [id, bias] : sp.logit_bias) l[static_cast<size_t>(id)] += bias;
  if (static_cast<int64_t>(outputs.size()) < sp.min_tokens) {
    for (int32_t id : sp.stop_token_ids) l[static_cast<size_t>(id)] = -INFINITY;
    if (!sp.ignore_eos) {
      for (int32_t id : eos) l[static_cast<size_t>(id)] = -INFINITY;
    }
  }
  return l;
}

// Several requests with penalties, biases and min_tokens decode in one batch beside plain
// ones; each one's greedy tokens are those of the formulas applied to its raw logits alone
// (the device state: the prompt mask, the output counts advanced by each sampled token).
TEST_P(EngineTest, LogitsProcessorsFollowTheFormulasInABatch) {
  Engine engine(load_tiny(), small_config(256, 8));
  const ModelConfig& mc = engine.model().config();
  const int64_t vocab = mc.vocab_size;
  std::vector<int32_t> eos;
  for (int64_t id : mc.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  struct Case {
    std::string id;
    std::vector<int32_t> prompt;
    SamplingParams sp;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 5; ++i) {
    Case c{"r" + std::to_string(i), random_prompt(5 + 3 * i, 700 + i, vocab), {}};
    c.sp.temperature = 0.0f;
    c.sp.max_tokens = 10;
    if (i == 0) c.sp.repetition_penalty = 1.7f;
    if (i == 1) {
      c.sp.presence_penalty = 1.5f;
      c.sp.frequency_penalty = 0.75f;
    }
    if (i == 2) {
      c.sp.logit_bias = {{3, 4.0f}, {17, -2.5f}};
      c.sp.repetition_penalty = 0.8f;
    }
    if (i == 3) {
      c.sp.min_tokens = 6;
      c.sp.stop_token_ids = {c.prompt[0]};
      c.sp.frequency_penalty = -0.5f;
    }
    // i == 4: no processor at all (the neutral penalty row).
    cases.push_back(c);
  }
  Collector col;
  for (const Case& c : cases) {
    Request r;
    r.id = c.id;
    r.prompt_token_ids = c.prompt;
    r.sampling_params = c.sp;
    engine.add_request(std::move(r), col.callback());
  }
  run_to_completion(engine);
  for (const Case& c : cases) {
    // Alone: the raw logits of each step, the formulas, then the greedy pick.
    SequenceState st = engine.model().new_sequence();
    std::vector<float> l;
    engine.model().forward(c.prompt, st, l);
    std::vector<int32_t> outputs;
    const Collected& got = col.results[c.id];
    for (size_t k = 0; k < got.tokens.size(); ++k) {
      const std::vector<float> row = processed_row(l, c.sp, c.prompt, outputs, eos);
      const int32_t want = argmax(row);
      ASSERT_EQ(got.tokens[k].token, want) << c.id << " output " << k;
      outputs.push_back(want);
      engine.model().forward(std::span<const int32_t>(&outputs.back(), 1), st, l);
    }
    EXPECT_GE(got.tokens.size(), static_cast<size_t>(std::min<int64_t>(c.sp.min_tokens, 10)));
  }
}

// The runner copies back the sampled ids and the logprobs asked for, nothing more: per decode
// step of B requests asking n logprobs, B x (4 + 4 + 8n) bytes (id, logprob, n top entries).
TEST_P(EngineTest, BytesCopiedToTheHostPerDecodeStep) {
  for (const std::optional<int32_t> logprobs :
       {std::optional<int32_t>{}, std::optional<int32_t>{0}, std::optional<int32_t>{3}}) {
    Collector col;  // outlives the engine, whose destructor aborts what is unfinished
    Engine engine(load_tiny(), small_config(256, 8));
    const int64_t vocab = engine.model().config().vocab_size;
    constexpr int64_t kB = 6;
    for (int64_t i = 0; i < kB; ++i) {
      Request r = make_request("b" + std::to_string(i), random_prompt(4, 50 + i, vocab), 8);
      r.sampling_params.logprobs = logprobs;
      engine.add_request(std::move(r), col.callback());
    }
    ASSERT_TRUE(engine.step());  // every prompt in one step, each sampling its first token
    if (GetParam()) {
      ASSERT_TRUE(engine.step());  // asynchronously, its results come a step later
    }
    const int64_t per_row = logprobs ? 8 + 8 * *logprobs : 4;
    int64_t before = engine.stats().device_to_host_bytes;
    EXPECT_EQ(before, kB * per_row);
    for (int step = 0; step < 4; ++step) {
      ASSERT_TRUE(engine.step());
      const int64_t now = engine.stats().device_to_host_bytes;
      EXPECT_EQ(now - before, kB * per_row) << "logprobs " << logprobs.value_or(-1);
      EXPECT_LE(now - before, kB * (1 + 2 * logprobs.value_or(0)) * 8);
      before = now;
    }
  }
}

TEST_P(EngineTest, MinTokensDelaysEos) {
  Engine engine(load_tiny(), small_config());
  const int64_t vocab = engine.model().config().vocab_size;
  const auto prompt = random_prompt(6, 900, vocab);
  const AloneRun alone = run_alone(engine.model(), prompt, 1);
  Collector col;
  Request r = make_request("m", prompt, 6);
  r.sampling_params.stop_token_ids = {alone.outputs[0]};  // would stop at once
  r.sampling_params.min_tokens = 3;
  engine.add_request(std::move(r), col.callback());
  run_to_completion(engine);
  const Collected& c = col.results["m"];
  ASSERT_GE(c.tokens.size(), 3u);
  EXPECT_NE(c.tokens[0].token, alone.outputs[0]);
  EXPECT_NE(c.tokens[1].token, alone.outputs[0]);
}

TEST_P(EngineTest, EosFinishesWithStopAndNamesTheEosId) {
  Engine engine(load_tiny(), small_config());
  const auto& eos = engine.config().scheduler.eos_token_ids;
  ASSERT_FALSE(eos.empty());
  Collector col;
  Request r = make_request("e", {5, 6, 7}, 8);
  r.sampling_params.ignore_eos = false;
  r.sampling_params.logit_bias = {{eos[0], 100.0f}};
  engine.add_request(std::move(r), col.callback());
  run_to_completion(engine);
  const Collected& c = col.results["e"];
  EXPECT_EQ(c.ids(), std::vector<int32_t>{eos[0]});
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.stop_token_id, eos[0]);
}

// Every sampled token, its logprob and its top logprobs, bitwise.
void expect_same_tokens(const Collected& got, const Collected& want, const std::string& what) {
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

// The observer's figures: every request once with its finish reason, its whole prompt (a
// prefix hit included), its tokens and max_tokens; the times ordered (queue + prefill =
// TTFT, prefill + decode = inference <= end to end); one first_token per request with
// tokens, one inter_token per later step; step() sums the scheduled tokens. stats()
// counts the whole prompt of every request that got a token, once.
TEST_P(EngineTest, ObserverReportsEachRequestsFigures) {
  struct Recorder : EngineObserver {
    std::map<std::string, FinishedRequest> finished;
    int num_first = 0, num_inter = 0;
    int64_t scheduled_tokens = 0;
    void request_finished(const FinishedRequest& r) override {
      EXPECT_TRUE(finished.emplace(r.request_id, r).second) << r.request_id << " twice";
    }
    void first_token(double ttft_s) override {
      EXPECT_GE(ttft_s, 0.0);
      ++num_first;
    }
    void inter_token(double seconds) override {
      EXPECT_GE(seconds, 0.0);
      ++num_inter;
    }
    void step(int64_t n) override { scheduled_tokens += n; }
  };
  Recorder rec;  // outlives the engine
  auto model = load_tiny();
  const auto [config, bs] = prefix_caching_config(*model);
  Engine engine(std::move(model), config);
  engine.set_observer(&rec);
  const int64_t vocab = engine.model().config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(2 * bs + 3, 600, vocab);
  Collector col;
  engine.add_request(make_request("a", prompt, 5), col.callback());
  run_to_completion(engine);
  engine.add_request(make_request("b", prompt, 1), col.callback());  // a prefix hit
  run_to_completion(engine);
  engine.add_request(make_request("c", random_prompt(9, 601, vocab), 50), col.callback());
  while (col.results["c"].tokens.empty()) engine.step();
  engine.abort_request("c");
  run_to_completion(engine);

  ASSERT_EQ(rec.finished.size(), 3u);
  const FinishedRequest& a = rec.finished.at("a");
  const FinishedRequest& b = rec.finished.at("b");
  const FinishedRequest& c = rec.finished.at("c");
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(b.finish_reason, "length");
  EXPECT_EQ(c.finish_reason, "abort");
  EXPECT_EQ(a.num_prompt_tokens, 2 * bs + 3);
  EXPECT_EQ(b.num_prompt_tokens, 2 * bs + 3);
  EXPECT_EQ(a.num_cached_tokens, 0);
  EXPECT_EQ(b.num_cached_tokens, 2 * bs);
  EXPECT_EQ(a.num_generation_tokens, 5);
  EXPECT_EQ(b.num_generation_tokens, 1);
  EXPECT_EQ(c.num_generation_tokens, 1);  // its prefill step gave it one token
  EXPECT_EQ(a.max_tokens, 5);
  EXPECT_EQ(c.max_tokens, 50);
  for (const FinishedRequest* r : {&a, &b, &c}) {
    ASSERT_TRUE(r->queue_s && r->prefill_s && r->decode_s && r->inference_s && r->ttft_s)
        << r->request_id;
    EXPECT_NEAR(*r->queue_s + *r->prefill_s, *r->ttft_s, 1e-9) << r->request_id;
    EXPECT_NEAR(*r->prefill_s + *r->decode_s, *r->inference_s, 1e-9) << r->request_id;
    EXPECT_LE(*r->queue_s + *r->inference_s, r->e2e_s + 1e-9) << r->request_id;
  }
  ASSERT_TRUE(a.time_per_output_token_s);
  EXPECT_NEAR(*a.time_per_output_token_s, *a.decode_s / 4, 1e-12);
  EXPECT_FALSE(b.time_per_output_token_s);  // one token: no time between tokens
  EXPECT_EQ(*b.decode_s, 0.0);
  EXPECT_EQ(rec.num_first, 3);
  EXPECT_EQ(rec.num_inter, 4);  // a's tokens 2..5
  // a's prompt, b's uncached suffix, c's prompt, and the decode steps' tokens (a: 4;
  // asynchronously also c's second step, in flight when it was aborted).
  EXPECT_EQ(rec.scheduled_tokens, (2 * bs + 3) + 3 + 9 + 4 + (GetParam() ? 1 : 0));
  EXPECT_EQ(engine.stats().prompt_tokens, 2 * (2 * bs + 3) + 9);
  EXPECT_EQ(engine.stats().generation_tokens, 5 + 1 + 1);
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

TEST_P(EngineTest, AnErrorInsideAStepAbortsEverythingAndMarksTheEngineDead) {
  auto model = load_tiny();
  Model* raw = model.get();
  Engine engine(std::move(model), small_config());
  Collector col;
  engine.add_request(make_request("a", {5, 6, 7}, 8), col.callback());
  engine.add_request(make_request("b", {8, 9}, 8), col.callback());
  ASSERT_TRUE(engine.step());
  raw->set_trace([](std::string_view section) {
    if (section == "lm_head") throw std::runtime_error("injected device error");
  });
  EXPECT_TRUE(engine.step());
  EXPECT_FALSE(engine.alive());
  for (const char* id : {"a", "b"}) {
    EXPECT_TRUE(col.results[id].finished) << id;
    EXPECT_EQ(col.results[id].finish_reason, "abort") << id;
    // Asynchronously, the first step's tokens were still in flight when the second failed.
    EXPECT_EQ(col.results[id].tokens.size(), GetParam() ? 0u : 1u) << id;
  }
  EXPECT_EQ(engine.stats().num_running, 0);
  EXPECT_THROW(engine.add_request(make_request("c", {5}, 2), col.callback()), Error);
  EXPECT_FALSE(engine.step());
}

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
