// Speculative decoding on the CPU backend: the verification form (DecodeStep::verify, then
// commit) gives every verified position the logits the decode step gives it one token at a
// time, bitwise, and after a rejection at any draft position leaves the KDA states and the
// cache as decoding the accepted tokens would; the engine's outputs with ngram drafts are the
// same tokens as without them (greedy and seeded sampling), with prefix caching, preemption
// and batch-invariant mode too; the drafters, the synthetic acceptance and the JSON config.
#include "engine/speculative.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/decode_step.h"
#include "engine/engine.h"
#include "kernels/sampling/params.h"
#include "model/model.h"
#include "model/workspace.h"
#include "server/speculative_config.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load(const std::string& dir) {
  return Model::load(fs::path(HYSERVE_SOURCE_DIR) / dir);
}

std::vector<int32_t> random_tokens(size_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

const char* const kCheckpoints[] = {"models/tiny-kimi-k3", "tests/fixtures/kimi_linear_tiny",
                                    "tests/fixtures/deepseek_v32_tiny",
                                    "tests/fixtures/kimi_k3_published_tiny"};

// A test-name suffix for a checkpoint folder: its name with '_' for the other characters.
std::string checkpoint_name(const ::testing::TestParamInfo<const char*>& p) {
  std::string name = fs::path(p.param).filename().string();
  for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

class Verification : public ::testing::TestWithParam<const char*> {};

INSTANTIATE_TEST_SUITE_P(Checkpoints, Verification, ::testing::ValuesIn(kCheckpoints),
                         checkpoint_name);

struct Seq {
  std::vector<int32_t> blocks;
  int32_t state = -1;
  int64_t length = 0;  // tokens in the cache
  int32_t next = 0;    // the token after them (not computed)
};

// Rejection at every draft position: three sequences verify 1 + k tokens each (k = 0, 2, 4)
// and keep 1 + a of them, for every a; the reference decodes the kept tokens one at a time on
// a second pool. Each kept position's logits are bitwise the reference's, the KDA state rows
// are the same bytes after the commit, and decoding on from there gives the same logits.
TEST_P(Verification, RejectionAtEveryPositionLeavesTheStateOfTheAcceptedTokens) {
  const auto model = load(GetParam());
  const int64_t vocab = model->config().vocab_size;
  const CachePlan plan = model->cache_plan();
  const int64_t bs = plan.block_size;
  const bool kda = plan.kda_state_rows > 0;
  const int64_t max_drafts = 4;
  for (int64_t accept = 0; accept <= max_drafts; ++accept) {
    auto cache_v = model->new_cache(40), cache_d = model->new_cache(40);
    Workspace ws_v(&model->backend()), ws_d(&model->backend());
    DecodeStep verify(*model, *cache_v, ws_v, {4, 8 * bs, 0, 16});
    DecodeStep decode(*model, *cache_d, ws_d, {4, 8 * bs, 0, 0});
    std::vector<Seq> seqs(3);
    int32_t next_block = 0;
    for (int i = 0; i < 3; ++i) {
      Seq& s = seqs[static_cast<size_t>(i)];
      s.state = kda ? 30 + i : -1;
      // Prompts ending just before a block boundary: the drafts cross it.
      const auto prompt =
          random_tokens(static_cast<size_t>(bs - 2 - i), 11 + static_cast<uint32_t>(i), vocab);
      while (std::ssize(s.blocks) * bs < std::ssize(prompt) + 2 * max_drafts + 2) {
        s.blocks.push_back(next_block++);
      }
      if (kda) {
        cache_v->zero_block(s.state);
        cache_d->zero_block(s.state);
      }
      std::vector<float> l;
      for (KvCache* cache : {cache_v.get(), cache_d.get()}) {
        const SequenceInput in{cache, s.blocks, s.state, 0, prompt, false};
        model->forward(std::span<const SequenceInput>(&in, 1), l,
                       cache == cache_v.get() ? ws_v : ws_d);
      }
      s.length = std::ssize(prompt);
      s.next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    }
    // The verification: sequence i brings its next token and 2i drafts.
    std::vector<std::vector<int32_t>> tokens(3);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < 3; ++i) {
      Seq& s = seqs[static_cast<size_t>(i)];
      tokens[static_cast<size_t>(i)] = {s.next};
      const auto drafts =
          random_tokens(static_cast<size_t>(2 * i), 40 + static_cast<uint32_t>(i), vocab);
      tokens[static_cast<size_t>(i)].insert(tokens[static_cast<size_t>(i)].end(), drafts.begin(),
                                            drafts.end());
      batch.push_back(
          {cache_v.get(), s.blocks, s.state, s.length, tokens[static_cast<size_t>(i)], false});
    }
    ASSERT_TRUE(verify.accepts_verify(batch));
    const float* got = verify.verify(batch);
    const std::vector<float> verified(got, got + (1 + 3 + 5) * vocab);
    std::vector<int32_t> counts;
    for (int i = 0; i < 3; ++i)
      counts.push_back(static_cast<int32_t>(1 + std::min<int64_t>(accept, 2 * i)));
    verify.commit(counts);

    // The reference: the kept tokens one step at a time; their logits are the verified rows.
    int64_t first_row = 0;
    std::vector<int64_t> rows_of(3);
    for (int i = 0; i < 3; ++i) {
      rows_of[static_cast<size_t>(i)] = first_row;
      first_row += std::ssize(tokens[static_cast<size_t>(i)]);
    }
    for (int32_t j = 0; j < *std::max_element(counts.begin(), counts.end()); ++j) {
      std::vector<SequenceInput> step;
      std::vector<int> who;
      for (int i = 0; i < 3; ++i) {
        if (j >= counts[static_cast<size_t>(i)]) continue;
        const Seq& s = seqs[static_cast<size_t>(i)];
        step.push_back(
            {cache_d.get(), s.blocks, s.state, s.length + j,
             std::span<const int32_t>(&tokens[static_cast<size_t>(i)][static_cast<size_t>(j)], 1),
             false});
        who.push_back(i);
      }
      const float* want = decode.run(step);
      for (size_t b = 0; b < who.size(); ++b) {
        const float* row = verified.data() + (rows_of[static_cast<size_t>(who[b])] + j) * vocab;
        ASSERT_EQ(std::memcmp(row, want + static_cast<int64_t>(b) * vocab,
                              static_cast<size_t>(vocab) * 4),
                  0)
            << "sequence " << who[b] << " position " << j << " (accepting " << accept << ")";
      }
    }
    for (int i = 0; i < 3; ++i) {
      Seq& s = seqs[static_cast<size_t>(i)];
      if (kda) {
        const size_t row = static_cast<size_t>(plan.row_bytes);
        EXPECT_EQ(
            std::memcmp(cache_v->base() + s.state * row, cache_d->base() + s.state * row, row), 0)
            << "KDA state of sequence " << i << " after accepting "
            << counts[static_cast<size_t>(i)] - 1;
      }
      s.length += counts[static_cast<size_t>(i)];
    }
    // Decoding on from the kept tokens: the same logits on both pools (the rejected drafts'
    // slots are overwritten, never read).
    for (int t = 0; t < 3; ++t) {
      std::vector<SequenceInput> bv, bd;
      std::vector<int32_t> next(3);
      for (int i = 0; i < 3; ++i) {
        next[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + t * 13) % vocab);
      }
      for (int i = 0; i < 3; ++i) {
        const Seq& s = seqs[static_cast<size_t>(i)];
        const std::span<const int32_t> tok(&next[static_cast<size_t>(i)], 1);
        bv.push_back({cache_v.get(), s.blocks, s.state, s.length, tok, false});
        bd.push_back({cache_d.get(), s.blocks, s.state, s.length, tok, false});
      }
      const float* a = verify.run(bv);
      const std::vector<float> av(a, a + 3 * vocab);
      const float* b = decode.run(bd);
      ASSERT_EQ(std::memcmp(av.data(), b, static_cast<size_t>(3 * vocab) * 4), 0)
          << "decode step " << t << " after accepting " << accept;
      for (Seq& s : seqs) ++s.length;
    }
  }
}

// --- The engine -------------------------------------------------------------------------

struct Result {
  std::vector<int32_t> tokens;
  std::string finish_reason;
};

struct EngineRun {
  std::map<std::string, Result> results;
  EngineStats stats;
};

// A prompt that repeats itself, so that prompt lookup finds drafts.
std::vector<int32_t> repetitive_prompt(int64_t n, uint32_t seed, int64_t vocab) {
  const std::vector<int32_t> motif = random_tokens(5 + seed % 4, seed, vocab);
  std::vector<int32_t> p;
  while (std::ssize(p) < n) p.push_back(motif[p.size() % motif.size()]);
  return p;
}

struct Workload {
  std::vector<Request> requests;
};

// Requests with repetitive prompts. A tiny random model's own outputs hardly repeat, so that
// drafts get accepted request i % 3 == 1 biases a few tokens up (its outputs then cycle among
// them, the model choosing which: drafts accepted and rejected) and i % 3 == 2 one token (its
// outputs repeat it: every draft accepted).
Workload workload(int64_t vocab, int num, float temperature, int64_t max_tokens) {
  Workload w;
  for (int i = 0; i < num; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.prompt_token_ids = repetitive_prompt(12 + 5 * i, 3 + static_cast<uint32_t>(i), vocab);
    r.sampling_params.temperature = temperature;
    r.sampling_params.seed = 100 + static_cast<uint64_t>(i);
    r.sampling_params.max_tokens = max_tokens + i;
    r.sampling_params.ignore_eos = true;
    if (i % 3 == 1) {
      for (int32_t id : {3, 17, 29})
        r.sampling_params.logit_bias.push_back({id % static_cast<int32_t>(vocab), 40.0f});
    } else if (i % 3 == 2) {
      r.sampling_params.logit_bias.push_back({7, 60.0f});
    }
    w.requests.push_back(std::move(r));
  }
  return w;
}

EngineRun run_engine(const std::string& dir, EngineConfig config, const Workload& w,
                     ModelOptions mo = {}) {
  Engine engine(Model::load(fs::path(HYSERVE_SOURCE_DIR) / dir, mo), config);
  EngineRun run;
  for (const Request& r : w.requests) {
    engine.add_request(r, [&run](const RequestOutput& o) {
      Result& res = run.results[o.request_id];
      for (const OutputToken& t : o.new_tokens) res.tokens.push_back(t.token);
      if (o.finished) res.finish_reason = o.finish_reason;
    });
  }
  for (int i = 0; i < 20000 && engine.step(); ++i) {
  }
  run.stats = engine.stats();
  return run;
}

EngineConfig base_config() {
  EngineConfig c;
  c.scheduler.max_model_len = 160;
  c.scheduler.max_num_batched_tokens = 256;
  c.scheduler.max_num_seqs = 4;
  c.min_block_size = 16;
  return c;
}

SpeculativeConfig ngram(int64_t k) {
  SpeculativeConfig s;
  s.method = SpeculativeMethod::kNgram;
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = 1;
  s.prompt_lookup_max = 3;
  return s;
}

void expect_same_outputs(const EngineRun& want, const EngineRun& got, const std::string& what) {
  ASSERT_EQ(want.results.size(), got.results.size()) << what;
  for (const auto& [id, r] : want.results) {
    const auto it = got.results.find(id);
    ASSERT_NE(it, got.results.end()) << what << ": " << id;
    EXPECT_EQ(it->second.tokens, r.tokens) << what << ": " << id;
    EXPECT_EQ(it->second.finish_reason, r.finish_reason) << what << ": " << id;
  }
}

class SpeculativeEngine : public ::testing::TestWithParam<const char*> {};

INSTANTIATE_TEST_SUITE_P(Checkpoints, SpeculativeEngine, ::testing::ValuesIn(kCheckpoints),
                         checkpoint_name);

TEST_P(SpeculativeEngine, NgramDraftsGiveTheSameTokensGreedyAndSeededSampling) {
  const int64_t vocab = load(GetParam())->config().vocab_size;
  for (float temperature : {0.0f, 0.8f}) {
    const Workload w = workload(vocab, 4, temperature, 40);
    const EngineRun plain = run_engine(GetParam(), base_config(), w);
    for (int64_t k : {1, 3, 8}) {
      EngineConfig c = base_config();
      c.speculative = ngram(k);
      const EngineRun spec = run_engine(GetParam(), c, w);
      const std::string what =
          "temperature " + std::to_string(temperature) + ", " + std::to_string(k) + " drafts";
      expect_same_outputs(plain, spec, what);
      // The drafts were verified, and prompt lookup on repetitive text gets some accepted.
      const SpecDecodeCounts& s = spec.stats.spec_decode;
      EXPECT_GT(s.num_drafts, 0) << what;
      EXPECT_GT(s.num_draft_tokens, s.num_drafts - 1) << what;
      EXPECT_LE(s.num_accepted_tokens, s.num_draft_tokens) << what;
      ASSERT_EQ(std::ssize(s.accepted_per_pos), k) << what;
      for (int64_t i = 1; i < k; ++i) {
        EXPECT_LE(s.accepted_per_pos[static_cast<size_t>(i)],
                  s.accepted_per_pos[static_cast<size_t>(i - 1)])
            << what;
      }
      int64_t sum = 0;
      for (int64_t a : s.accepted_per_pos) sum += a;
      EXPECT_EQ(sum, s.num_accepted_tokens) << what;
      if (temperature == 0.0f) {
        EXPECT_GT(s.num_accepted_tokens, 0) << what;
      }
      // Fewer steps than tokens when drafts are accepted: every request's tokens came.
      EXPECT_EQ(spec.stats.generation_tokens, plain.stats.generation_tokens) << what;
    }
  }
}

TEST_P(SpeculativeEngine, PrefixCachingPreemptionAndBatchInvariantKeepTheTokens) {
  const int64_t vocab = load(GetParam())->config().vocab_size;
  const Workload w = workload(vocab, 4, 0.0f, 48);
  // Prefix caching: the requests share their prompts' starts with a second round.
  Workload twice = w;
  for (const Request& r : w.requests) {
    Request again = r;
    again.id = r.id + "-again";
    twice.requests.push_back(again);
  }
  {
    EngineConfig c = base_config();
    c.enable_prefix_caching = true;
    c.min_block_size = 64;
    const EngineRun plain = run_engine(GetParam(), c, twice);
    c.speculative = ngram(4);
    expect_same_outputs(plain, run_engine(GetParam(), c, twice), "prefix caching");
  }
  {
    // A pool too small for every request at once: requests are preempted and recomputed.
    EngineConfig c = base_config();
    c.scheduler.max_model_len = 320;
    const Workload longer = workload(vocab, 4, 0.0f, 150);
    const auto model = load(GetParam());
    const CachePlan plan = model->cache_plan(c.min_block_size);
    c.num_blocks = static_cast<int32_t>(plan.blocks_for_tokens(c.scheduler.max_model_len) + 1);
    const EngineRun plain = run_engine(GetParam(), c, longer);
    c.speculative = ngram(4);
    const EngineRun spec = run_engine(GetParam(), c, longer);
    expect_same_outputs(plain, spec, "preemption");
    // (A model whose KDA state makes blocks longer than these sequences is not preempted.)
    if (plan.block_size <= 128) {
      EXPECT_GT(spec.stats.num_preemptions, 0);
    }
  }
  {
    EngineConfig c = base_config();
    c.min_block_size = 64;
    ModelOptions mo;
    mo.batch_invariant = true;
    const EngineRun plain = run_engine(GetParam(), c, w, mo);
    c.speculative = ngram(4);
    expect_same_outputs(plain, run_engine(GetParam(), c, w, mo), "batch invariant");
  }
}

// Requests whose sampling reads the outputs before each position (penalties) get no drafts and
// decode as without speculation; short max_tokens leave no room for drafts, stop tokens among
// accepted drafts end the request there.
TEST(SpeculativeEngine, PenaltiesShortRequestsAndStopTokens) {
  const int64_t vocab = load("tests/fixtures/kimi_linear_tiny")->config().vocab_size;
  Workload w = workload(vocab, 6, 0.0f, 30);
  w.requests[0].sampling_params.repetition_penalty = 1.3f;
  w.requests[1].sampling_params.presence_penalty = 0.5f;
  w.requests[2].sampling_params.max_tokens = 1;
  w.requests[3].sampling_params.max_tokens = 2;
  // Request 5 repeats token 7 (logit_bias): a stop at 7 after min_tokens 5 ends it mid-step.
  w.requests[5].sampling_params.stop_token_ids = {7};
  w.requests[5].sampling_params.min_tokens = 5;
  const EngineRun plain = run_engine("tests/fixtures/kimi_linear_tiny", base_config(), w);
  EngineConfig c = base_config();
  c.speculative = ngram(4);
  const EngineRun spec = run_engine("tests/fixtures/kimi_linear_tiny", c, w);
  expect_same_outputs(plain, spec, "penalties, short and stopped requests");
  EXPECT_EQ(spec.results.at("r2").tokens.size(), 1u);
  EXPECT_EQ(spec.results.at("r3").tokens.size(), 2u);
  EXPECT_EQ(spec.results.at("r5").tokens.size(), 6u);
  EXPECT_EQ(spec.results.at("r5").finish_reason, "stop");
  // Only requests 4 and 5 drafted (r0, r1: penalties; r2, r3: no room).
  EXPECT_GT(spec.stats.spec_decode.num_accepted_tokens, 0);
}

// A KDA snapshot at every block boundary (every_blocks 1): drafts stop short of each boundary
// and a plain decode step ends on it, so a second request whose prompt is the first's prompt and
// outputs gets the same prefix hit as without speculation (and the same tokens).
TEST(SpeculativeEngine, GeneratedBlocksGetTheirKdaSnapshots) {
  const std::string dir = "tests/fixtures/kimi_linear_tiny";
  const int64_t vocab = load(dir)->config().vocab_size;
  struct Out {
    std::vector<int32_t> tokens;
    int64_t cached = 0;
    SpecDecodeCounts spec;
  };
  const auto run_pair = [&](bool speculate) {
    EngineConfig c = base_config();
    c.scheduler.max_model_len = 600;
    c.enable_prefix_caching = true;
    c.snapshot_policy.every_blocks = 1;
    if (speculate) c.speculative = ngram(4);
    Engine engine(Model::load(fs::path(HYSERVE_SOURCE_DIR) / dir), c);
    Workload w = workload(vocab, 3, 0.0f, 300);  // r2: biased to one token, all drafts accepted
    Request first = w.requests[2];
    std::vector<Out> out(2);
    engine.add_request(first, [&](const RequestOutput& o) {
      for (const OutputToken& t : o.new_tokens) out[0].tokens.push_back(t.token);
    });
    for (int i = 0; i < 20000 && engine.step(); ++i) {
    }
    Request second = first;
    second.id = "second";
    second.prompt_token_ids.insert(second.prompt_token_ids.end(), out[0].tokens.begin(),
                                   out[0].tokens.end());
    second.sampling_params.max_tokens = 8;
    engine.add_request(second, [&](const RequestOutput& o) {
      for (const OutputToken& t : o.new_tokens) out[1].tokens.push_back(t.token);
      out[1].cached = o.num_cached_tokens;
    });
    for (int i = 0; i < 20000 && engine.step(); ++i) {
    }
    out[0].spec = engine.stats().spec_decode;
    return out;
  };
  const std::vector<Out> plain = run_pair(false);
  const std::vector<Out> spec = run_pair(true);
  EXPECT_EQ(spec[0].tokens, plain[0].tokens);
  EXPECT_EQ(spec[1].tokens, plain[1].tokens);
  const int64_t bs = load(dir)->cache_plan(base_config().min_block_size).block_size;
  EXPECT_GE(plain[1].cached, 2 * bs);  // the generated blocks' snapshots were hit
  EXPECT_EQ(spec[1].cached, plain[1].cached);
  EXPECT_GT(spec[0].spec.num_accepted_tokens, 100);
}

// A random workload: prompts sharing prefixes, greedy and seeded sampling with top-k / top-p,
// logit_bias, min_tokens, stop tokens, penalties, max_tokens from 1 to 60, a token budget of 48
// (prefill chunks in the same steps as verifications), prefix caching and a pool small enough
// to preempt. Every request's tokens are those without speculation.
TEST_P(SpeculativeEngine, RandomWorkloadEqualsNoSpeculation) {
  const int64_t vocab = load(GetParam())->config().vocab_size;
  std::mt19937 rng(2024);
  const std::vector<int32_t> shared = random_tokens(70, 5, vocab);
  Workload w;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.id = "q" + std::to_string(i);
    const int64_t keep = std::uniform_int_distribution<int64_t>(0, 70)(rng);
    r.prompt_token_ids.assign(shared.begin(), shared.begin() + keep);
    const auto tail = repetitive_prompt(1 + static_cast<int64_t>(rng() % 40),
                                        50 + static_cast<uint32_t>(i), vocab);
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
    SamplingParams& sp = r.sampling_params;
    sp.temperature = rng() % 2 == 0 ? 0.0f : 0.9f;
    sp.seed = rng();
    if (rng() % 3 == 0) sp.top_k = 5;
    if (rng() % 3 == 0) sp.top_p = 0.8f;
    sp.max_tokens = 1 + static_cast<int64_t>(rng() % 60);
    sp.ignore_eos = rng() % 2 == 0;
    if (rng() % 2 == 0) {
      for (int32_t id : {3, 17, 29}) sp.logit_bias.push_back({id, 25.0f});
    }
    if (rng() % 4 == 0) sp.min_tokens = 3;
    if (rng() % 4 == 0) sp.stop_token_ids = {17};
    if (rng() % 6 == 0) sp.frequency_penalty = 0.4f;
    w.requests.push_back(std::move(r));
  }
  EngineConfig c = base_config();
  c.scheduler.max_model_len = 200;
  c.scheduler.max_num_batched_tokens = 48;
  c.enable_prefix_caching = true;
  c.min_block_size = 64;
  const CachePlan plan = load(GetParam())->cache_plan(c.min_block_size);
  c.num_blocks = static_cast<int32_t>(3 * plan.blocks_for_tokens(c.scheduler.max_model_len) + 3);
  const EngineRun plain = run_engine(GetParam(), c, w);
  for (int64_t k : {2, 5}) {
    c.speculative = ngram(k);
    const EngineRun spec = run_engine(GetParam(), c, w);
    expect_same_outputs(plain, spec, "random workload, " + std::to_string(k) + " drafts");
    EXPECT_GT(spec.stats.spec_decode.num_accepted_tokens, 0);
  }
}

// disable_by_batch_size: no drafts while that many requests run; the same tokens either way.
TEST(SpeculativeEngine, DisableByBatchSizeDraftsOnlyForSmallBatches) {
  const std::string dir = "tests/fixtures/kimi_linear_tiny";
  const int64_t vocab = load(dir)->config().vocab_size;
  Workload w = workload(vocab, 4, 0.0f, 20);
  w.requests[3].sampling_params.max_tokens = 80;  // runs alone at the end
  EngineConfig c = base_config();
  c.speculative = ngram(3);
  const EngineRun always = run_engine(dir, c, w);
  c.speculative.disable_by_batch_size = 2;
  const EngineRun small = run_engine(dir, c, w);
  expect_same_outputs(always, small, "disable_by_batch_size");
  EXPECT_GT(small.stats.spec_decode.num_drafts, 0);
  EXPECT_LT(small.stats.spec_decode.num_drafts, always.stats.spec_decode.num_drafts);
}

TEST(SpeculativeEngine, SyntheticAcceptsAtTheConfiguredMeanLength) {
  const int64_t vocab = load("models/tiny-kimi-k3")->config().vocab_size;
  const Workload w = workload(vocab, 4, 0.0f, 120);
  for (double length : {1.0, 2.0, 3.36}) {
    EngineConfig c = base_config();
    c.scheduler.max_model_len = 256;
    c.speculative.method = SpeculativeMethod::kSynthetic;
    c.speculative.num_speculative_tokens = 5;
    c.speculative.acceptance_length = length;
    const EngineRun run = run_engine("models/tiny-kimi-k3", c, w);
    const SpecDecodeCounts& s = run.stats.spec_decode;
    ASSERT_GT(s.num_drafts, 30);
    const double mean =
        1.0 + static_cast<double>(s.num_accepted_tokens) / static_cast<double>(s.num_drafts);
    // Steps near max_tokens verify fewer drafts, which lowers the mean a little.
    EXPECT_NEAR(mean, length, 0.15 * length) << "acceptance length " << length;
    for (const auto& [id, r] : run.results) EXPECT_EQ(r.finish_reason, "length") << id;
  }
}

// The target distribution under speculation, by a chi-square test: requests whose outputs are
// confined to three tokens (logit_bias; the model still weighs them by its logits), prompts that
// repeat those tokens so that prompt lookup always drafts, three outputs each. The exact
// distribution of (x1, x2, x3) is the product of the sampling rule's probabilities
// (kernels/sampling/params.h weights) over the model's logits of each context, computed one
// token at a time; the counts of 3000 seeded requests (x2 and often x3 drawn in a verification
// step) must fit it (p > 0.001).
TEST(SpeculativeSampling, FollowsTheTargetDistribution) {
  const auto model = load("tests/fixtures/kimi_linear_tiny");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> ids = {11, 12, 13};
  const std::vector<int32_t> prompt = {11, 12, 13, 11, 12, 13, 11, 12};
  const float bias = 50.0f;
  for (const float temperature : {0.7f, 1.5f}) {
    // P(x | context) under the rule, for the contexts the three outputs can have.
    std::map<std::vector<int32_t>, std::vector<double>> dist;
    const auto probabilities = [&](const std::vector<int32_t>& context) {
      SequenceState st = model->new_sequence();
      std::vector<float> l;
      model->forward(context, st, l);
      for (int32_t id : ids) l[static_cast<size_t>(id)] += bias;
      const float top = *std::max_element(l.begin(), l.end());
      std::vector<double> w(static_cast<size_t>(vocab));
      double total = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        w[static_cast<size_t>(i)] = static_cast<double>(sampling::token_weight(
            l[static_cast<size_t>(i)], top, sampling::inverse_temperature(temperature)));
        total += w[static_cast<size_t>(i)];
      }
      for (double& x : w) x /= total;
      return w;
    };
    std::map<std::vector<int32_t>, double> expected;  // (x1, x2, x3) -> probability
    const std::vector<double> p1 = probabilities(prompt);
    for (int32_t a : ids) {
      std::vector<int32_t> ca = prompt;
      ca.push_back(a);
      const std::vector<double> p2 = probabilities(ca);
      for (int32_t b : ids) {
        std::vector<int32_t> cb = ca;
        cb.push_back(b);
        const std::vector<double> p3 = probabilities(cb);
        for (int32_t c : ids) {
          expected[{a, b, c}] =
              p1[static_cast<size_t>(a)] * p2[static_cast<size_t>(b)] * p3[static_cast<size_t>(c)];
        }
      }
    }
    Workload w;
    const int n = 3000;
    for (int i = 0; i < n; ++i) {
      Request r;
      r.id = "s" + std::to_string(i);
      r.prompt_token_ids = prompt;
      r.sampling_params.temperature = temperature;
      r.sampling_params.seed = 1000 + static_cast<uint64_t>(i);
      r.sampling_params.max_tokens = 3;
      r.sampling_params.ignore_eos = true;
      for (int32_t id : ids) r.sampling_params.logit_bias.push_back({id, bias});
      w.requests.push_back(std::move(r));
    }
    EngineConfig c = base_config();
    c.scheduler.max_num_seqs = 64;
    c.scheduler.max_num_batched_tokens = 1024;
    c.speculative = ngram(2);
    const EngineRun run = run_engine("tests/fixtures/kimi_linear_tiny", c, w);
    std::map<std::vector<int32_t>, int64_t> counts;
    for (const auto& [id, res] : run.results) {
      ASSERT_EQ(res.tokens.size(), 3u) << id;
      ++counts[res.tokens];
    }
    EXPECT_GT(run.stats.spec_decode.num_accepted_tokens, n / 10);
    // Cells with an expected count under 5 are pooled into one.
    double chi2 = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
    int cells = 0;
    for (const auto& [key, p] : expected) {
      const double e = p * n;
      const double o = static_cast<double>(counts.count(key) ? counts.at(key) : 0);
      if (e < 5.0) {
        pooled_expected += e;
        pooled_observed += o;
        continue;
      }
      chi2 += (o - e) * (o - e) / e;
      ++cells;
    }
    if (pooled_expected > 0.0) {
      chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) /
              std::max(pooled_expected, 1.0);
      ++cells;
    }
    // Every output was one of the three tokens.
    int64_t total = 0;
    for (const auto& [key, count] : counts) total += count;
    ASSERT_EQ(total, n);
    ASSERT_GE(cells, 4);
    // The chi-square critical value at p = 0.001 (Wilson-Hilferty, z = 3.09).
    const double df = cells - 1;
    const double h = 2.0 / (9.0 * df);
    const double critical = df * std::pow(1.0 - h + 3.09 * std::sqrt(h), 3.0);
    EXPECT_LT(chi2, critical) << "temperature " << temperature << ", " << cells << " cells";
  }
}

// --- Drafters, acceptance, config -----------------------------------------------------

TEST(Ngram, ProposesWhatFollowedTheLongestMostRecentMatch) {
  // Suffix [7, 8] occurred twice; the most recent earlier occurrence is followed by 1, 2.
  const std::vector<int32_t> t = {7, 8, 9, 9, 7, 8, 1, 2, 3, 7, 8};
  EXPECT_EQ(ngram_drafts(t, 1, 3, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ngram_drafts(t, 1, 3, 5), (std::vector<int32_t>{1, 2, 3, 7, 8}));
  // Longest first: [3, 7, 8] never occurred before, [7, 8] did.
  EXPECT_EQ(ngram_drafts(t, 2, 3, 1), (std::vector<int32_t>{1}));
  // min 3: no match of 3 tokens.
  EXPECT_TRUE(ngram_drafts(t, 3, 3, 4).empty());
  // The continuation stops at the end of the tokens.
  const std::vector<int32_t> u = {4, 5, 6, 4, 5};
  EXPECT_EQ(ngram_drafts(u, 1, 2, 8), (std::vector<int32_t>{6, 4, 5}));
  EXPECT_TRUE(ngram_drafts(u, 1, 2, 0).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1}, 1, 2, 3).empty());
  // A run of one token: the match with room for the drafts, or the one with the most after it.
  const std::vector<int32_t> run = {1, 2, 2, 2, 2, 2};
  EXPECT_EQ(ngram_drafts(run, 1, 3, 3), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(ngram_drafts(run, 1, 3, 2), (std::vector<int32_t>{2, 2}));
  const std::vector<int32_t> longer = {2, 2, 2, 2, 2, 2, 2, 2};
  EXPECT_EQ(ngram_drafts(longer, 1, 3, 4), (std::vector<int32_t>{2, 2, 2, 2}));
}

TEST(SyntheticAcceptance, RateGivesTheMeanLengthAndDrawsAreDeterministic) {
  for (int64_t k : {1, 3, 7}) {
    for (double length : {1.0, 2.0, 3.36, 4.6}) {
      if (length > static_cast<double>(k + 1)) continue;
      const double rate = acceptance_rate(length, k);
      double sum = 0.0;
      const int n = 40000;
      for (int i = 0; i < n; ++i)
        sum += 1.0 + static_cast<double>(synthetic_accepted(rate, k, 5, i));
      EXPECT_NEAR(sum / n, length, 0.03 * length) << k << " drafts, length " << length;
    }
  }
  EXPECT_EQ(synthetic_accepted(0.5, 7, 9, 3), synthetic_accepted(0.5, 7, 9, 3));
  EXPECT_EQ(synthetic_accepted(1.0, 7, 9, 3), 7);
  EXPECT_EQ(synthetic_accepted(0.0, 7, 9, 3), 0);
  EXPECT_THROW(acceptance_rate(9.0, 7), Error);
}

TEST(SpeculativeConfigJson, ReadsVllmFieldsAndRefusesWhatItCannotRun) {
  SpeculativeConfig c =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5})");
  EXPECT_EQ(c.method, SpeculativeMethod::kNgram);
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_EQ(c.prompt_lookup_min, 5);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})");
  EXPECT_EQ(c.prompt_lookup_min, 4);
  c = parse_speculative_config(
      R"({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 3, "disable_by_batch_size": 8})");
  EXPECT_EQ(c.method, SpeculativeMethod::kNgram);
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  EXPECT_EQ(c.disable_by_batch_size, 8);
  c = parse_speculative_config(
      R"({"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 3.84})");
  EXPECT_EQ(c.method, SpeculativeMethod::kSynthetic);
  EXPECT_DOUBLE_EQ(c.acceptance_length, 3.84);

  const auto refused = [](const char* json, const char* names) {
    try {
      parse_speculative_config(json);
      ADD_FAILURE() << json << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  refused(R"({"method": "dspark", "num_speculative_tokens": 7})", "dspark");
  refused(R"({"method": "eagle", "num_speculative_tokens": 2})", "eagle");
  refused(R"({"method": "ngram"})", "num_speculative_tokens");
  refused(R"({"method": "ngram", "num_speculative_tokens": 9})", "num_speculative_tokens");
  refused(R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens");
  refused(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
      "prompt_lookup_min");
  refused(R"({"method": "ngram", "num_speculative_tokens": 2, "speculative_token_tree": "x"})",
          "speculative_token_tree");
  refused(R"({"method": "synthetic", "num_speculative_tokens": 3})", "acceptance_length");
  refused(R"({"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 4.5})",
          "acceptance_length");
  refused(R"({"method": "ngram", "num_speculative_tokens": 2, "draft_sample_method": "beam"})",
          "draft_sample_method");
  refused(R"({"method": "mtp", "num_speculative_tokens": 1})", "mtp");
  refused(R"({"model": "/models/small", "num_speculative_tokens": 3})", "draft_model");
  refused(R"([1, 2])", "object");
  refused(R"({"method": )", "JSON");
}

}  // namespace
}  // namespace hyserve
