// The engine under tensor parallelism on the CPU backend: rank 0 schedules and samples,
// the other ranks (threads here, each with its shard of the model, Gloo collectives) run
// the plans rank 0 sends them over the step channel. Greedy outputs match one rank's
// (where they differ, only at a near-tie of the top two logprobs: the partial sums add in
// another order), batch-invariant mode is bitwise reproducible, and a worker that dies
// mid-request fails the step within the timeout, naming its rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_edit.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/step_plan.h"
#include "engine/tensor_parallel_group.h"
#include "engine/weight_transfer.h"
#include "lora_test_util.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "parallel/make_communicator.h"
#include "parallel/step_channel.h"
#include "parallel/store.h"
#include "random_prompt.h"
#include "util/error.h"

namespace hyserve {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

fs::path fixture(const std::string& rel) {
  return fs::path(HYSERVE_SOURCE_DIR) / rel;
}

Request greedy_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.logprobs = 2;
  return r;
}

struct Result {
  std::vector<OutputToken> tokens;
  std::vector<std::optional<OutputToken>> prompt_logprobs;
  std::string finish_reason;
  int64_t num_cached_tokens = 0;
};

struct GroupRun {
  std::map<std::string, Result> results;
  bool alive = true;
  int64_t num_preemptions = 0;
  SpecDecodeCounts spec;
  std::optional<std::string> diagnosis;
  std::vector<std::string> worker_errors;
};

struct GroupOptions {
  fs::path dir;
  int tp = 1;
  int dcp = 1;                // decode context parallelism: groups of dcp consecutive ranks
  int64_t token_sharded = 0;  // ModelOptions::token_sharded_prefill
  bool batch_invariant = false;
  bool async_scheduling = true;
  bool prefix_caching = false;
  // A worker that stops after this many plans (closing its channel and its communicator, as
  // a killed process would); -1: none.
  int die_after_plans = -1;
  // And then takes the next plan without running it: rank 0 is left in a collective.
  bool die_mid_step = false;
  int32_t num_blocks = 96;  // few: requests are preempted and recomputed
  SpeculativeConfig speculative;
  // Called on rank 0's engine after each batch but the last (sleep, weight updates).
  std::function<void(Engine&)> between_batches;
  bool expert_parallel = false;
  // LoRA: slots, the adapters loaded on rank 0's engine (name -> folder) and the adapter
  // of each request id that has one.
  int64_t max_loras = 0;
  std::map<std::string, fs::path> adapters;
  std::map<std::string, std::string> adapter_of;
};

EngineConfig engine_config(const GroupOptions& g) {
  EngineConfig c;
  c.async_scheduling = g.async_scheduling;
  c.scheduler.max_model_len = 256;
  c.scheduler.max_num_batched_tokens = 64;  // prompts run as several chunks
  c.scheduler.max_num_seqs = 4;
  c.min_block_size = 16;
  c.num_blocks = g.num_blocks;
  c.enable_prefix_caching = g.prefix_caching;
  c.speculative = g.speculative;
  c.scheduler.max_loras = g.max_loras;
  c.max_lora_rank = 16;
  return c;
}

// Submits `batches` one after another (each batch's requests together) and runs them to
// completion on a group of g.tp ranks.
GroupRun run_group(const GroupOptions& g, const std::vector<std::vector<Request>>& batches) {
  parallel::HashStore store;
  parallel::LeaderChannel channel("127.0.0.1", 0, 20s);
  GroupRun run;
  run.worker_errors.resize(static_cast<size_t>(g.tp));
  std::vector<std::thread> workers;
  // Keeps each rank's DCP communicator alive as long as its model.
  std::vector<std::unique_ptr<parallel::Communicator>> dcp_comms(static_cast<size_t>(g.tp));
  const auto load = [&](int rank, parallel::Communicator* comm) {
    ModelOptions o;
    o.batch_invariant = g.batch_invariant;
    o.parallel.tp = {rank, g.tp, comm};
    o.token_sharded_prefill = g.token_sharded;
    o.parallel.expert_parallel = g.expert_parallel;
    if (g.dcp > 1) {
      auto& dc = dcp_comms[static_cast<size_t>(rank)];
      dc = parallel::make_cpu_communicator(store, rank % g.dcp, g.dcp, 5s,
                                           "dcp" + std::to_string(rank / g.dcp));
      o.parallel.dcp = {rank % g.dcp, g.dcp, dc.get()};
    }
    return Model::load(g.dir, o);
  };
  for (int rank = 1; rank < g.tp; ++rank) {
    workers.emplace_back([&, rank] {
      try {
        auto comm = parallel::make_cpu_communicator(store, rank, g.tp, 5s, "tp");
        const std::unique_ptr<Model> model = load(rank, comm.get());
        const EngineConfig config = complete_engine_config(*model, engine_config(g));
        parallel::WorkerChannel wc("127.0.0.1", channel.port(), rank, 10s);
        if (rank == 1 && g.die_after_plans >= 0) {
          // Runs a few plans, then goes away mid-request.
          const auto cache = model->new_cache(config.num_blocks, config.min_block_size);
          ModelRunnerConfig rc;
          rc.max_num_seqs = config.scheduler.max_num_seqs;
          rc.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
          rc.max_model_len = config.scheduler.max_model_len;
          rc.samples = false;
          ModelRunner runner(*model, *cache, rc);
          for (int i = 0; i < g.die_after_plans; ++i) {
            const auto bytes = wc.receive();
            ASSERT_TRUE(bytes.has_value());
            const StepPlan plan = decode_plan(*bytes);
            runner.run_plan(plan);
            wc.ack(plan.step);
          }
          if (g.die_mid_step) {
            ASSERT_TRUE(wc.receive().has_value());
          }
          return;  // the channel and the communicator close here
        }
        run_tensor_parallel_worker(*model, config, wc);
      } catch (const std::exception& e) {
        run.worker_errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  try {
    std::unique_ptr<parallel::Communicator> comm =
        g.tp > 1 ? parallel::make_cpu_communicator(store, 0, g.tp, 5s, "tp") : nullptr;
    Engine engine(load(0, comm.get()), engine_config(g));
    for (const auto& [name, path] : g.adapters) engine.loras()->load(name, path, false);
    LeaderLink link(channel);
    if (g.tp > 1) {
      channel.accept_workers(g.tp);
      engine.set_plan_sink(&link);
    }
    for (size_t b = 0; b < batches.size(); ++b) {
      if (b > 0 && g.between_batches) {
        try {
          g.between_batches(engine);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "between batches " << b << ": " << e.what();
          break;
        }
      }
      const std::vector<Request>& batch = batches[b];
      for (Request r : batch) {
        if (const auto it = g.adapter_of.find(r.id); it != g.adapter_of.end()) {
          EXPECT_TRUE(engine.loras()->attach(it->second, r)) << it->second;
        }
        engine.add_request(r, [&run](const RequestOutput& o) {
          Result& res = run.results[o.request_id];
          if (!o.prompt_logprobs.empty()) res.prompt_logprobs = o.prompt_logprobs;
          res.tokens.insert(res.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
          res.num_cached_tokens = o.num_cached_tokens;
          if (o.finished) res.finish_reason = o.finish_reason;
        });
      }
      for (int i = 0; i < 10000 && engine.step(); ++i) {
      }
    }
    run.alive = engine.alive();
    run.num_preemptions = engine.stats().num_preemptions;
    run.spec = engine.stats().spec_decode;
    if (g.tp > 1) {
      if (!run.alive) run.diagnosis = link.diagnose(2s);
      link.stop();
    }
    engine.stop();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0: " << e.what();
    run.alive = false;
  }
  channel.close();
  for (std::thread& t : workers) t.join();
  return run;
}

std::vector<std::vector<Request>> workload(const ModelConfig& c, int num_requests) {
  std::vector<Request> batch;
  for (int i = 0; i < num_requests; ++i) {
    batch.push_back(greedy_request(
        str_cat("r", i),
        test::random_prompt(5 + 37 * i, 300 + static_cast<uint32_t>(i), c.vocab_size), 10));
  }
  return {batch};
}

// TP's greedy tokens against one rank's: equal, or, at the first difference, a near-tie
// of one rank's top two logprobs (the sequences part there). Logprobs of equal tokens
// within tol.
void expect_greedy_matches(const GroupRun& one, const GroupRun& tp, double tol) {
  ASSERT_EQ(one.results.size(), tp.results.size());
  for (const auto& [id, want] : one.results) {
    SCOPED_TRACE(id);
    const Result& got = tp.results.at(id);
    EXPECT_EQ(got.finish_reason, "length");
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    for (size_t k = 0; k < want.tokens.size(); ++k) {
      const OutputToken& a = want.tokens[k];
      const OutputToken& b = got.tokens[k];
      if (a.token != b.token) {
        ASSERT_EQ(a.top_logprobs.size(), 2u);
        EXPECT_EQ(a.top_logprobs[1].token, b.token) << "output " << k;
        EXPECT_LE(a.top_logprobs[0].logprob - a.top_logprobs[1].logprob, 2 * tol)
            << "output " << k << ": not a near-tie";
        break;
      }
      EXPECT_NEAR(a.logprob, b.logprob, tol) << "output " << k;
    }
  }
}

void expect_no_worker_errors(const GroupRun& run) {
  for (size_t r = 0; r < run.worker_errors.size(); ++r)
    EXPECT_EQ(run.worker_errors[r], "") << "rank " << r;
}

struct EngineCase {
  const char* dir;
  int tp;
  int dcp = 1;
  int64_t token_sharded = 0;  // prefill steps of at least this many tokens (0: off)
};

class TensorParallelEngine : public testing::TestWithParam<EngineCase> {};

TEST_P(TensorParallelEngine, GreedyOutputsMatchOneRank) {
  GroupOptions g;
  g.dir = fixture(GetParam().dir);
  const ModelConfig c = ModelConfig::load(g.dir);
  const auto work = workload(c, 4);
  const GroupRun one = run_group(g, work);
  g.tp = GetParam().tp;
  g.dcp = GetParam().dcp;
  g.token_sharded = GetParam().token_sharded;
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async scheduling" : "sync scheduling");
    g.async_scheduling = async;
    const GroupRun tp = run_group(g, work);
    EXPECT_TRUE(tp.alive);
    expect_no_worker_errors(tp);
    expect_greedy_matches(one, tp, 1e-3);
  }
}

TEST_P(TensorParallelEngine, PrefixHitsMatchMisses) {
  // The same prompts twice, the second round served from the prefix cache (KDA snapshots
  // restored on every rank): the same tokens as the first round.
  GroupOptions g;
  g.dir = fixture(GetParam().dir);
  g.tp = GetParam().tp;
  g.dcp = GetParam().dcp;
  g.token_sharded = GetParam().token_sharded;
  g.prefix_caching = true;
  const ModelConfig c = ModelConfig::load(g.dir);
  // Up to 153 tokens: past a block of 128 positions (64 x DCP 2).
  std::vector<std::vector<Request>> rounds = workload(c, 5);
  rounds.push_back(rounds[0]);
  for (Request& r : rounds[1]) r.id += "-again";
  const GroupRun run = run_group(g, rounds);
  EXPECT_TRUE(run.alive);
  expect_no_worker_errors(run);
  int64_t cached = 0;
  for (const Request& r : rounds[0]) {
    const Result& first = run.results.at(r.id);
    const Result& again = run.results.at(r.id + "-again");
    cached += again.num_cached_tokens;
    ASSERT_EQ(first.tokens.size(), again.tokens.size());
    for (size_t k = 0; k < first.tokens.size(); ++k) {
      EXPECT_EQ(first.tokens[k].token, again.tokens[k].token) << r.id << " output " << k;
    }
  }
  EXPECT_GT(cached, 0) << "no prefix hits";
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TensorParallelEngine,
                         testing::Values(EngineCase{"tests/fixtures/kimi_linear_tiny", 2},
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 2},
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 4},
                                         EngineCase{"tests/fixtures/kimi_linear_tiny", 2, 2},
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 2, 2},
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 4, 2},
                                         // Token-sharded prefill steps (chunks of 16 or more
                                         // tokens), with DCP the gathered-context form.
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 2, 1, 16},
                                         EngineCase{"tests/fixtures/deepseek_v32_tiny", 2, 2, 16},
                                         EngineCase{"tests/fixtures/kimi_linear_tiny", 2, 2, 16}),
                         [](const testing::TestParamInfo<EngineCase>& p) {
                           return fs::path(p.param.dir).filename().string() + "_tp" +
                                  std::to_string(p.param.tp) +
                                  (p.param.dcp > 1 ? "_dcp" + std::to_string(p.param.dcp) : "") +
                                  (p.param.token_sharded > 0 ? "_token_sharded" : "");
                         });

TEST(TensorParallelEnginePreemption, PreemptedRequestsRecomputeOnEveryRank) {
  // A pool too small for four requests at once: some are preempted (their tables dropped on
  // the workers too) and recomputed; the outputs are still one rank's with the same pool.
  GroupOptions g;
  g.dir = fixture("tests/fixtures/deepseek_v32_tiny");
  g.num_blocks = 9;
  const ModelConfig c = ModelConfig::load(g.dir);
  const auto work = workload(c, 4);
  const GroupRun one = run_group(g, work);
  g.tp = 2;
  for (const int dcp : {1, 2}) {
    SCOPED_TRACE("dcp " + std::to_string(dcp));
    g.dcp = dcp;
    g.num_blocks = dcp == 1 ? 9 : 5;  // blocks of twice the positions under DCP 2
    const GroupRun tp = run_group(g, work);
    EXPECT_TRUE(tp.alive);
    expect_no_worker_errors(tp);
    EXPECT_GT(tp.num_preemptions, 0);
    expect_greedy_matches(one, tp, 1e-3);
  }
}

TEST(TensorParallelEngineInvariance, BatchInvariantLogprobsAreBitwiseAcrossBatches) {
  // A request alone, then the same request beside others (other batch shapes, chunks,
  // mixed prefill and decode): in batch-invariant mode its logprobs are the same bits.
  GroupOptions g;
  g.dir = fixture("tests/fixtures/kimi_linear_tiny");
  g.tp = 2;
  g.batch_invariant = true;
  const ModelConfig c = ModelConfig::load(g.dir);
  const std::vector<Request> four = workload(c, 4)[0];
  const GroupRun alone = run_group(g, {{four[1]}});
  const GroupRun together = run_group(g, {four});
  expect_no_worker_errors(alone);
  expect_no_worker_errors(together);
  const Result& a = alone.results.at("r1");
  const Result& b = together.results.at("r1");
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t k = 0; k < a.tokens.size(); ++k) {
    EXPECT_EQ(a.tokens[k].token, b.tokens[k].token) << k;
    EXPECT_EQ(a.tokens[k].logprob, b.tokens[k].logprob) << k;
  }
}

// Zero-mismatch RL across ranks (issue 48): rollouts sampled at temperature 1 by a
// batch-invariant TP group (head-sharded, token-sharded prefill, decode context parallel), then
// each completed rollout scored in one prefill by prompt_logprobs: every sampled token's
// logprob equals its scored one bit for bit.
TEST(TensorParallelEngineInvariance, RolloutLogprobsEqualScoredLogprobs) {
  struct Case {
    int dcp;
    int64_t token_sharded;
  };
  for (const Case k : {Case{1, 0}, Case{1, 32}, Case{2, 0}}) {
    SCOPED_TRACE(str_cat("dcp ", k.dcp, " token_sharded ", k.token_sharded));
    GroupOptions g;
    g.dir = fixture("tests/fixtures/kimi_linear_tiny");
    g.tp = 2;
    g.dcp = k.dcp;
    g.token_sharded = k.token_sharded;
    g.batch_invariant = true;
    const ModelConfig c = ModelConfig::load(g.dir);
    std::vector<Request> rollouts = workload(c, 4)[0];
    for (size_t i = 0; i < rollouts.size(); ++i) {
      rollouts[i].sampling_params.temperature = 1.0f;
      rollouts[i].sampling_params.seed = 40 + i;
      rollouts[i].sampling_params.logprobs = 0;
    }
    const GroupRun rolled = run_group(g, {rollouts});
    expect_no_worker_errors(rolled);
    std::vector<Request> scoring;
    for (const Request& r : rollouts) {
      Request s = greedy_request("score-" + r.id, r.prompt_token_ids, 1);
      for (const OutputToken& t : rolled.results.at(r.id).tokens) {
        s.prompt_token_ids.push_back(t.token);
      }
      s.sampling_params.prompt_logprobs = 0;
      scoring.push_back(std::move(s));
    }
    const GroupRun scored = run_group(g, {scoring});
    expect_no_worker_errors(scored);
    for (const Request& r : rollouts) {
      const std::vector<OutputToken>& got = rolled.results.at(r.id).tokens;
      const std::vector<std::optional<OutputToken>>& want =
          scored.results.at("score-" + r.id).prompt_logprobs;
      ASSERT_EQ(want.size(), r.prompt_token_ids.size() + got.size()) << r.id;
      for (size_t j = 0; j < got.size(); ++j) {
        const std::optional<OutputToken>& e = want[r.prompt_token_ids.size() + j];
        ASSERT_TRUE(e.has_value()) << r.id << " " << j;
        EXPECT_EQ(e->token, got[j].token) << r.id << " " << j;
        EXPECT_EQ(std::bit_cast<uint32_t>(e->logprob), std::bit_cast<uint32_t>(got[j].logprob))
            << r.id << " token " << j << ": rollout " << got[j].logprob << ", scored "
            << e->logprob;
      }
    }
  }
}

class TensorParallelEngineFailure : public testing::TestWithParam<bool> {};

TEST_P(TensorParallelEngineFailure, AWorkerThatDiesFailsTheStepNamingItsRank) {
  GroupOptions g;
  g.dir = fixture("tests/fixtures/deepseek_v32_tiny");
  g.tp = 2;
  g.die_after_plans = 3;
  g.die_mid_step = GetParam();
  const ModelConfig c = ModelConfig::load(g.dir);
  const auto start = std::chrono::steady_clock::now();
  const GroupRun run = run_group(g, workload(c, 2));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_FALSE(run.alive);
  for (const auto& [id, r] : run.results) EXPECT_EQ(r.finish_reason, "abort") << id;
  EXPECT_EQ(run.results.size(), 2u);
  ASSERT_TRUE(run.diagnosis.has_value());
  EXPECT_NE(run.diagnosis->find("rank 1"), std::string::npos) << *run.diagnosis;
}

INSTANTIATE_TEST_SUITE_P(When, TensorParallelEngineFailure, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "InAStep" : "BetweenSteps";
                         });

// Speculative decoding across ranks: rank 0 verifies the drafts and sends the workers each
// verification (a plan part) and its commit counts (the next plan); the tokens match one rank
// without speculation (requests biased to a few tokens, so that drafts are accepted).
TEST(TensorParallelEngineSpeculation, NgramDraftsMatchOneRankWithout) {
  const std::pair<const char*, int> cases[] = {{"tests/fixtures/kimi_linear_tiny", 1},
                                               {"tests/fixtures/deepseek_v32_tiny", 1},
                                               {"tests/fixtures/deepseek_v32_tiny", 2},
                                               {"tests/fixtures/kimi_linear_tiny", 2}};
  for (const auto& [dir, dcp] : cases) {
    SCOPED_TRACE(str_cat(dir, " dcp ", dcp));
    GroupOptions g;
    g.dir = fixture(dir);
    const ModelConfig c = ModelConfig::load(g.dir);
    std::vector<Request> batch;
    for (int i = 0; i < 4; ++i) {
      Request r = greedy_request(
          str_cat("r", i),
          test::random_prompt(9 + 21 * i, 700 + static_cast<uint32_t>(i), c.vocab_size), 24);
      if (i % 2 == 1) {
        for (int32_t id : {5, 11, 23}) r.sampling_params.logit_bias.push_back({id, 30.0f});
      }
      batch.push_back(std::move(r));
    }
    const GroupRun one = run_group(g, {batch});
    g.tp = 2;
    g.dcp = dcp;
    g.speculative.method = SpeculativeMethod::kNgram;
    g.speculative.num_speculative_tokens = 3;
    g.speculative.prompt_lookup_min = 1;
    g.speculative.prompt_lookup_max = 3;
    const GroupRun tp = run_group(g, {batch});
    EXPECT_TRUE(tp.alive);
    expect_no_worker_errors(tp);
    expect_greedy_matches(one, tp, 1e-3);
    EXPECT_GT(tp.spec.num_accepted_tokens, 0);
    EXPECT_LT(tp.spec.num_accepted_tokens, tp.spec.num_draft_tokens);
  }
}

// Sleep (both levels), wake-up and weight updates reach every rank through control plans: after
// a folder update and a relayed partial update, the group's outputs equal a fresh group's on
// the new weights, bitwise; after sleeping they equal those before.
TEST(TensorParallelEngineControl, SleepAndWeightUpdatesReachEveryRank) {
  const fs::path tiny = fixture("tests/fixtures/kimi_linear_tiny");
  // The bf16 tensors of the MoE layers changed in one mantissa bit.
  const fs::path edited =
      test::rewrite_checkpoint(tiny, "tp_update", [](std::vector<TensorToWrite>& ts) {
        for (TensorToWrite& t : ts) {
          if (t.dtype != DType::kBF16 || t.name.find("block_sparse_moe") == std::string::npos)
            continue;
          for (size_t i = 0; i < t.bytes.size(); i += 2) t.bytes[i] ^= 0x08;
        }
      });
  const Checkpoint edited_ckpt = Checkpoint::open(edited);
  const int64_t vocab = ModelConfig::load(tiny).vocab_size;
  GroupOptions g;
  g.dir = tiny;
  g.tp = 2;
  g.num_blocks = 256;
  const auto batches = [&](const std::string& tag) {
    std::vector<std::vector<Request>> out;
    for (int b = 0; b < 4; ++b) {
      std::vector<Request> batch;
      for (int i = 0; i < 2; ++i) {
        batch.push_back(greedy_request(str_cat(tag, b, "-", i),
                                       test::random_prompt(9 + 21 * i, 40 + i, vocab), 6));
      }
      out.push_back(batch);
    }
    return out;
  };
  // Batches 0 and 1 around a sleep of level 1, 2 after one of level 2, 3 after the updates.
  int calls = 0;
  g.between_batches = [&](Engine& e) {
    ++calls;
    if (calls == 1 || calls == 2) {
      e.sleep(calls, PauseMode::kWait);
      e.wake_up({});
    } else {
      // The MoE tensors relayed from rank 0 in place of the folder's: the edited model.
      std::vector<OverrideTensor> staged;
      for (const std::string& n : edited_ckpt.names()) {
        if (n.find("block_sparse_moe") == std::string::npos) continue;
        const TensorInfo& t = *edited_ckpt.find(n);
        auto bytes = std::make_shared<const std::vector<uint8_t>>(t.data, t.data + t.num_bytes);
        TensorInfo info = t;
        info.data = bytes->data();
        staged.push_back({info, bytes});
      }
      e.update_weights(updated_checkpoint(e.model().weights_source(), std::move(staged)));
    }
  };
  const GroupRun run = run_group(g, batches("r"));
  expect_no_worker_errors(run);
  ASSERT_TRUE(run.alive);
  GroupOptions plain = g;
  plain.between_batches = nullptr;
  const GroupRun before = run_group(plain, batches("r"));
  plain.dir = edited;
  const GroupRun after = run_group(plain, batches("r"));
  for (const auto& [id, r] : run.results) {
    const bool updated = id[1] == '3';
    const Result& want = (updated ? after : before).results.at(id);
    ASSERT_EQ(r.tokens.size(), want.tokens.size()) << id;
    for (size_t k = 0; k < r.tokens.size(); ++k) {
      EXPECT_EQ(r.tokens[k].token, want.tokens[k].token) << id << " token " << k;
      EXPECT_EQ(r.tokens[k].logprob, want.tokens[k].logprob) << id << " token " << k;
    }
  }
  EXPECT_NE(before.results.at("r3-0").tokens[0].logprob,
            after.results.at("r3-0").tokens[0].logprob);
}

// LoRA under tensor parallelism: rank 0 relays each slot's adapter to the workers (kSetLora
// plans) and every plan sequence carries its slot. Requests with adapters x and y and none
// in one batch, one slot (x and y take turns in it, so the workers' slot changes several
// times mid-run): each request's greedy tokens and logprobs those of one rank with the same
// adapters. With the adapter a request's outputs differ from the same prompt's without.
struct LoraCase {
  const char* dir;
  int tp;
  int dcp = 1;
  bool expert_parallel = false;
  bool speculative = false;   // n-gram drafts verified with the adapters (DecodeStep::verify)
  int64_t token_sharded = 0;  // prefills of at least this many tokens token-sharded
};

class TensorParallelEngineLora : public testing::TestWithParam<LoraCase> {};

TEST_P(TensorParallelEngineLora, MixedAdapterBatchesMatchOneRank) {
  GroupOptions g;
  g.dir = fixture(GetParam().dir);
  const fs::path dir =
      fs::temp_directory_path() / str_cat("hyserve_tp_lora_", ::getpid(), "_", GetParam().tp, "_",
                                          GetParam().dcp, GetParam().expert_parallel ? "_ep" : "",
                                          GetParam().token_sharded > 0 ? "_ts" : "");
  fs::remove_all(dir);
  {
    const std::unique_ptr<Model> whole = Model::load(g.dir);
    whole->enable_lora(1);
    g.adapters = {{"x", test::write_adapter(*whole, dir / "x", 41)},
                  {"y", test::write_adapter(*whole, dir / "y", 42)}};
  }
  g.max_loras = 1;
  const ModelConfig c = ModelConfig::load(g.dir);
  std::vector<std::vector<Request>> work = workload(c, 6);
  // r0 .. r5: x, none, y, x, none, y; r1 has r0's prompt.
  work[0][1].prompt_token_ids = work[0][0].prompt_token_ids;
  for (int i = 0; i < 6; ++i) {
    if (i % 3 != 1) g.adapter_of[str_cat("r", i)] = i % 3 == 0 ? "x" : "y";
  }
  const GroupRun one = run_group(g, work);
  ASSERT_EQ(one.results.size(), 6u);
  const Result& with = one.results.at("r0");
  const Result& without = one.results.at("r1");
  ASSERT_FALSE(with.tokens.empty());
  EXPECT_NE(with.tokens[0].logprob, without.tokens[0].logprob) << "the adapter changed nothing";
  g.tp = GetParam().tp;
  g.dcp = GetParam().dcp;
  g.expert_parallel = GetParam().expert_parallel;
  g.token_sharded = GetParam().token_sharded;
  if (GetParam().speculative) {
    g.speculative.method = SpeculativeMethod::kNgram;
    g.speculative.num_speculative_tokens = 3;
    g.speculative.prompt_lookup_min = 1;
    g.speculative.prompt_lookup_max = 3;
  }
  const GroupRun tp = run_group(g, work);
  EXPECT_TRUE(tp.alive);
  expect_no_worker_errors(tp);
  expect_greedy_matches(one, tp, 1e-3);
  if (GetParam().speculative) {
    EXPECT_GT(tp.spec.num_draft_tokens, 0);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, TensorParallelEngineLora,
    testing::Values(LoraCase{"tests/fixtures/kimi_linear_tiny", 2},
                    LoraCase{"tests/fixtures/deepseek_v32_tiny", 2, 2},
                    LoraCase{"tests/fixtures/deepseek_v32_tiny", 4, 2},
                    LoraCase{"tests/fixtures/deepseek_v32_tiny", 2, 1, true},
                    LoraCase{"tests/fixtures/kimi_linear_tiny", 2, 1, false, true},
                    LoraCase{"tests/fixtures/deepseek_v32_tiny", 2, 1, false, false, 8},
                    LoraCase{"tests/fixtures/deepseek_v32_tiny", 2, 2, false, false, 8}),
    [](const testing::TestParamInfo<LoraCase>& p) {
      return fs::path(p.param.dir).filename().string() + "_tp" + std::to_string(p.param.tp) +
             (p.param.dcp > 1 ? "_dcp" + std::to_string(p.param.dcp) : "") +
             (p.param.expert_parallel ? "_ep" : "") + (p.param.speculative ? "_spec" : "") +
             (p.param.token_sharded > 0 ? "_token_sharded" : "");
    });

TEST(StepPlan, RoundTripsAndRefusesMalformedBytes) {
  StepPlan p;
  p.step = 7;
  p.commits = {1, 3, 2};
  p.dropped = {"gone"};
  p.state_ops = {{3, -1}, {4, 9}};
  PlanPart part;
  part.decode_step = true;
  PlanSequence q;
  q.request_id = "r0";
  q.num_computed = 40;
  q.state_block = 3;
  q.tokens = {kPlaceholderToken};
  q.source_row = 2;
  q.slots = {1234};
  q.blocks_kept = 2;
  q.new_blocks = {17};
  q.lora_slot = 1;
  part.sequences = {q};
  PlanPart verify;
  verify.verify = true;
  PlanSequence vq = q;
  vq.tokens = {5, 6, 7};
  vq.slots = {1234, 1235, 1236};
  verify.sequences = {vq};
  p.parts = {part, verify};
  p.snapshots = {{3, 11}};
  p.num_sampled = 5;
  p.lora_name = "x";
  p.lora_rank = 4;
  p.lora_scale = 0.375f;
  const std::vector<uint8_t> bytes = encode_plan(p);
  const StepPlan back = decode_plan(bytes);
  EXPECT_EQ(encode_plan(back), bytes);
  EXPECT_EQ(back.parts.at(0).sequences.at(0).new_blocks, std::vector<int32_t>{17});
  EXPECT_EQ(back.state_ops.at(1).source_block, 9);
  EXPECT_EQ(back.commits, (std::vector<int32_t>{1, 3, 2}));
  EXPECT_TRUE(back.parts.at(1).verify);
  EXPECT_FALSE(back.parts.at(1).decode_step);
  EXPECT_EQ(back.parts.at(0).sequences.at(0).lora_slot, 1);
  EXPECT_EQ(back.lora_name, "x");
  EXPECT_EQ(back.lora_rank, 4);
  EXPECT_EQ(back.lora_scale, 0.375f);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    EXPECT_THROW(decode_plan(truncated), Error) << "cut at " << cut;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(decode_plan(longer), Error);
}

}  // namespace
}  // namespace hyserve
