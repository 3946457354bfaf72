// Engine: requests through the scheduler, one batched forward per step and the sampler
// give exactly what the model gives each request alone (the CPU ops are batch invariant),
// under chunked prefill, concurrency and preemption; plus the logits processors on
// hand-made logits, the observer's figures and a failing step. Prefix caching and async
// against sync scheduling have their own files; the shared tools are in engine_test_helpers.h.
#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_helpers.h"
#include "kernels/sampling/cpu.h"
#include "util/error.h"
#include "util/logits.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using namespace test;

INSTANTIATE_TEST_SUITE_P(Scheduling, EngineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Async" : "Sync";
                         });

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

}  // namespace
}  // namespace hyserve
