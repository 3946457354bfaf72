// Decode context parallelism on the CPU backend (ranks as threads, Gloo): rank r of a DCP
// group of W caches every W-th position; the logits of a prompt and of a decode step after
// it equal TP's (same group, no DCP) within float summation-order error, the same bits on
// every rank. The DSA indexer's top-k goes through the exact merge, so a DSA model selects
// exactly TP's keys; the difference is the log-sum-exp merge of the partial attentions.
// Token-sharded prefill steps under DCP attend over the group's gathered context instead:
// the same bits as token-sharded prefill without DCP, and a scratch budget that holds them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dsa_model_util.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "model/tensor_parallel.h"
#include "model/workspace.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "util/error.h"

namespace hyserve {
namespace {

using namespace std::chrono_literals;

std::filesystem::path fixture(const std::string& rel) {
  return std::filesystem::path(HYSERVE_SOURCE_DIR) / rel;
}

struct RankRun {
  std::vector<float> logits;     // prompt (all positions) then one decode step
  int64_t tokens_per_block = 0;  // of the rank's cache
  std::vector<std::string> kernel_plan;
};

// Makes a rank's model from its options (the checkpoint of a directory, or random weights).
using MakeModel = std::function<std::unique_ptr<Model>(const ModelOptions&)>;

// A group of tp ranks, DCP groups of dcp consecutive ranks (dcp 1: plain TP).
std::vector<RankRun> run_group(const MakeModel& make, int tp, int dcp,
                               const std::vector<int32_t>& prompt, bool batch_invariant = false,
                               int64_t token_sharded = 0) {
  parallel::HashStore store;
  std::vector<RankRun> runs(static_cast<size_t>(tp));
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto tp_comm = parallel::make_cpu_communicator(store, rank, tp, 60s, "tp");
        std::unique_ptr<parallel::Communicator> dcp_comm;
        ModelOptions o;
        o.batch_invariant = batch_invariant;
        o.parallel.tp = {rank, tp, tp_comm.get()};
        o.token_sharded_prefill = token_sharded;
        if (dcp > 1) {
          dcp_comm = parallel::make_cpu_communicator(store, rank % dcp, dcp, 60s,
                                                     "dcp" + std::to_string(rank / dcp));
          o.parallel.dcp = {rank % dcp, dcp, dcp_comm.get()};
        }
        std::unique_ptr<Model> model = make(o);
        SequenceState s = model->new_sequence();
        RankRun& run = runs[static_cast<size_t>(rank)];
        run.tokens_per_block = s.cache->plan().tokens_per_block();
        run.kernel_plan = model->kernel_plan();
        model->forward(prompt, s, run.logits, true);
        std::vector<float> next;
        model->forward(std::vector<int32_t>{prompt[2]}, s, next, false);
        run.logits.insert(run.logits.end(), next.begin(), next.end());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < tp; ++rank) EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << rank;
  return runs;
}

std::vector<RankRun> run_group(const std::filesystem::path& dir, int tp, int dcp,
                               const std::vector<int32_t>& prompt, bool batch_invariant = false,
                               int64_t token_sharded = 0) {
  return run_group([&](const ModelOptions& o) { return Model::load(dir, o); }, tp, dcp, prompt,
                   batch_invariant, token_sharded);
}

// The DSA kernels' shapes (dsa_model_util.h) with random weights: FP8 latent and index keys.
MakeModel fp8_dsa_model(const ModelConfig& c) {
  return [c](const ModelOptions& options) {
    ModelOptions o = options;
    o.indexer_fp8 = true;
    o.latent_cache = LatentCacheDtype::kFp8;
    return Model::create(c, std::make_unique<RandomWeights>(c, 11), o);
  };
}

std::vector<int32_t> prompt_for(const ModelConfig& c, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 53 + 11) % static_cast<int32_t>(c.vocab_size));
  return p;
}

void expect_matches(const std::vector<RankRun>& want, const std::vector<RankRun>& got, double tol) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t r = 1; r < got.size(); ++r) {
    ASSERT_EQ(got[r].logits.size(), got[0].logits.size());
    EXPECT_EQ(std::memcmp(got[r].logits.data(), got[0].logits.data(), got[0].logits.size() * 4), 0)
        << "rank " << r << " differs from rank 0";
  }
  const std::vector<float>& a = want[0].logits;
  const std::vector<float>& b = got[0].logits;
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(a[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_GT(max_abs, 0.0);
  EXPECT_LE(max_diff, tol * max_abs) << "max |logit| " << max_abs;
}

struct DcpCase {
  const char* dir;
  int tp;
  int dcp;
};

class ContextParallel : public testing::TestWithParam<DcpCase> {};

TEST_P(ContextParallel, LogitsMatchTensorParallel) {
  const DcpCase k = GetParam();
  const std::filesystem::path dir = fixture(k.dir);
  const ModelConfig c = ModelConfig::load(dir);
  // Longer than index_topk (the tiny DSA model's 8): the merge decides.
  const std::vector<int32_t> prompt = prompt_for(c, 37);
  const std::vector<RankRun> tp = run_group(dir, k.tp, 1, prompt);
  const std::vector<RankRun> dcp = run_group(dir, k.tp, k.dcp, prompt);
  expect_matches(tp, dcp, 1e-4);
  // One block id covers W times the positions.
  EXPECT_EQ(dcp[0].tokens_per_block, tp[0].tokens_per_block * k.dcp);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ContextParallel,
                         testing::Values(DcpCase{"tests/fixtures/deepseek_v32_tiny", 2, 2},
                                         DcpCase{"tests/fixtures/deepseek_v32_tiny", 4, 2},
                                         DcpCase{"tests/fixtures/deepseek_v32_tiny", 4, 4},
                                         DcpCase{"tests/fixtures/kimi_linear_tiny", 2, 2}),
                         [](const testing::TestParamInfo<DcpCase>& p) {
                           return std::filesystem::path(p.param.dir).filename().string() + "_tp" +
                                  std::to_string(p.param.tp) + "_dcp" + std::to_string(p.param.dcp);
                         });

// The FP8 latent (the DSA kernels' path) on the DSA-shaped tiny model (dsa_model_util.h):
// the group's queries absorbed, the generic indexer with the exact merge, the sparse kernel
// over the rank's pages, the partial o_lat merged in the latent space; the fused DSA decode
// step is not used under DCP (its top-k would be local).
class ContextParallelFp8 : public testing::TestWithParam<DcpCase> {};

TEST_P(ContextParallelFp8, LogitsMatchTensorParallel) {
  const DcpCase k = GetParam();
  const ModelConfig c = test::dsa_config(k.dir);
  const MakeModel make = fp8_dsa_model(c);
  // Longer than the top-8: the merge decides.
  const std::vector<int32_t> prompt = prompt_for(c, 29);
  const std::vector<RankRun> dcp = run_group(make, k.tp, k.dcp, prompt);
  expect_matches(run_group(make, k.tp, 1, prompt), dcp, 1e-4);
  // The kernel plan says so: the split, the merge, and no fused DSA decode step.
  bool parallel_line = false;
  for (const std::string& line : dcp[0].kernel_plan) {
    if (line.find("MLA") != std::string::npos) {
      EXPECT_NE(line.find("fused DSA decode step not under DCP"), std::string::npos) << line;
    }
    if (line.starts_with("parallel:")) {
      parallel_line = true;
      EXPECT_NE(line.find(str_cat("DCP ", k.dcp)), std::string::npos) << line;
      EXPECT_NE(line.find("exact top-k merge"), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(parallel_line);
}

INSTANTIATE_TEST_SUITE_P(Groups, ContextParallelFp8,
                         testing::Values(DcpCase{"tests/fixtures/deepseek_v32_tiny", 2, 2},
                                         DcpCase{"tests/fixtures/deepseek_v32_tiny", 4, 2},
                                         DcpCase{"tests/fixtures/deepseek_v32_tiny", 4, 4}),
                         [](const testing::TestParamInfo<DcpCase>& p) {
                           return "tp" + std::to_string(p.param.tp) + "_dcp" +
                                  std::to_string(p.param.dcp);
                         });

TEST(ContextParallelInvariance, BatchInvariantRunsAreBitwiseRepeatable) {
  const std::filesystem::path dir = fixture("tests/fixtures/deepseek_v32_tiny");
  const std::vector<int32_t> prompt = prompt_for(ModelConfig::load(dir), 30);
  const std::vector<RankRun> a = run_group(dir, 2, 2, prompt, true);
  const std::vector<RankRun> b = run_group(dir, 2, 2, prompt, true);
  ASSERT_EQ(a[0].logits.size(), b[0].logits.size());
  EXPECT_EQ(std::memcmp(a[0].logits.data(), b[0].logits.data(), a[0].logits.size() * 4), 0);
}

// Token-sharded prefill: each rank runs the indexer and the attention of its 2 of 2N pieces of
// the prompt with every head; the same per-(query, head) arithmetic as head-sharded prefill,
// so the logits are the same bits (the decode step after it is head-sharded in both).
class TokenShardedPrefill : public testing::TestWithParam<DcpCase> {};

TEST_P(TokenShardedPrefill, EqualsHeadShardedPrefillBitwise) {
  const DcpCase k = GetParam();
  const std::filesystem::path dir = fixture(k.dir);
  const ModelConfig c = ModelConfig::load(dir);
  for (const int n : {37, 5, 3}) {  // 3 tokens over 2N = 8 pieces: some ranks get none
    SCOPED_TRACE(n);
    const std::vector<int32_t> prompt = prompt_for(c, n);
    const std::vector<RankRun> heads = run_group(dir, k.tp, 1, prompt);
    const std::vector<RankRun> tokens = run_group(dir, k.tp, 1, prompt, false, 1);
    ASSERT_EQ(heads[0].logits.size(), tokens[0].logits.size());
    EXPECT_EQ(
        std::memcmp(heads[0].logits.data(), tokens[0].logits.data(), heads[0].logits.size() * 4),
        0);
    expect_matches(heads, tokens, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TokenShardedPrefill,
                         testing::Values(DcpCase{"tests/fixtures/deepseek_v32_tiny", 2, 1},
                                         DcpCase{"tests/fixtures/deepseek_v32_tiny", 4, 1},
                                         DcpCase{"tests/fixtures/kimi_linear_tiny", 2, 1}),
                         [](const testing::TestParamInfo<DcpCase>& p) {
                           return std::filesystem::path(p.param.dir).filename().string() + "_tp" +
                                  std::to_string(p.param.tp);
                         });

// Over the FP8 latent (the DSA kernels' absorbed form): every head's queries absorbed with
// the whole kv_b_proj on the rank's tokens, the sparse kernel over the cache (or, with DCP,
// over the gathered context); the same bits as the head-sharded DSA prefill.
TEST(TokenShardedPrefillFp8, EqualsHeadShardedPrefillBitwise) {
  const ModelConfig c = test::dsa_config("tests/fixtures/deepseek_v32_tiny");
  const MakeModel make = fp8_dsa_model(c);
  for (const int tp : {2, 4}) {
    for (const int n : {37, 3}) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << ", " << n << " tokens");
      const std::vector<int32_t> prompt = prompt_for(c, n);
      const std::vector<RankRun> tokens = run_group(make, tp, 1, prompt, false, 1);
      expect_matches(run_group(make, tp, 1, prompt), tokens, 0.0);
      // With DCP 2, the gathered context in the DSA kernels' page form: the prompt's logits
      // the same bits, the decode step after it (DCP's merged form) within 1e-4.
      const std::vector<RankRun> gathered = run_group(make, tp, 2, prompt, false, 1);
      const size_t prompt_logits = static_cast<size_t>(n) * static_cast<size_t>(c.vocab_size);
      ASSERT_EQ(gathered[0].logits.size(), tokens[0].logits.size());
      EXPECT_EQ(std::memcmp(gathered[0].logits.data(), tokens[0].logits.data(), prompt_logits * 4),
                0);
      expect_matches(tokens, gathered, 1e-4);
    }
  }
}

// Token-sharded prefill with decode context parallelism attends over the gathered context:
// every sequence's latents and index keys all-gathered from the DCP group into position
// order, so the indexer and the attention see what token-sharded prefill without DCP sees
// in its replicated cache, and the logits are the same bits. Decode steps after it keep
// DCP's merged form (kv_b_proj for the group's heads, a view of the whole one).
struct GroupOptions {
  int tp = 1;
  int dcp = 1;
  int64_t token_sharded = 0;
  bool indexer_fp8 = false;
  LatentCacheDtype latent = LatentCacheDtype::kFp32;
};

// One forward of a run: (sequence, new tokens) pairs, run as one batch.
using Step = std::vector<std::pair<int, int>>;

struct StepsRun {
  std::vector<float> prefill;  // every step's logits (all positions), in order
  std::vector<float> decode;   // then one decode step of each sequence, in turn
  // DCP: the same decode steps by a model without token-sharded prefill (DCP's merged
  // prefill and decode), over copies of the caches the run's prefill wrote.
  std::vector<float> plain_decode;
};

SequenceState copy_state(const Model& model, const SequenceState& s) {
  SequenceState c;
  c.cache = std::make_unique<KvCache>(model.backend(), s.cache->plan(), s.cache->num_blocks());
  std::memcpy(c.cache->base(), s.cache->base(), s.cache->num_bytes());
  c.blocks = s.blocks;
  c.state_block = s.state_block;
  c.num_tokens = s.num_tokens;
  return c;
}

std::vector<StepsRun> run_steps(const std::filesystem::path& dir, const GroupOptions& g,
                                const std::vector<Step>& steps) {
  parallel::HashStore store;
  const ModelConfig config = ModelConfig::load(dir);
  std::vector<int32_t> prompts[2] = {prompt_for(config, 64), {}};
  for (int i = 0; i < 64; ++i) {
    prompts[1].push_back((i * 31 + 5) % static_cast<int32_t>(config.vocab_size));
  }
  std::vector<StepsRun> runs(static_cast<size_t>(g.tp));
  std::vector<std::string> errors(static_cast<size_t>(g.tp));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < g.tp; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto tp_comm = parallel::make_cpu_communicator(store, rank, g.tp, 60s, "tp");
        std::unique_ptr<parallel::Communicator> dcp_comm;
        ModelOptions o;
        o.parallel.tp = {rank, g.tp, tp_comm.get()};
        o.token_sharded_prefill = g.token_sharded;
        o.indexer_fp8 = g.indexer_fp8;
        o.latent_cache = g.latent;
        if (g.dcp > 1) {
          dcp_comm = parallel::make_cpu_communicator(store, rank % g.dcp, g.dcp, 60s,
                                                     "dcp" + std::to_string(rank / g.dcp));
          o.parallel.dcp = {rank % g.dcp, g.dcp, dcp_comm.get()};
        }
        std::unique_ptr<Model> model = Model::load(dir, o);
        StepsRun& run = runs[static_cast<size_t>(rank)];
        std::vector<SequenceState> seqs;
        for (int i = 0; i < 2; ++i) seqs.push_back(model->new_sequence());
        Workspace ws(&model->backend());
        std::vector<float> logits;
        for (const Step& step : steps) {
          std::vector<SequenceInput> batch;
          for (const auto& [i, n] : step) {
            SequenceState& st = seqs[static_cast<size_t>(i)];
            const std::span<const int32_t> tokens(prompts[i].data() + st.num_tokens,
                                                  static_cast<size_t>(n));
            batch.push_back(model->prepare(st, tokens, true));
            batch.back().prefill = true;
          }
          model->forward(batch, logits, ws);
          run.prefill.insert(run.prefill.end(), logits.begin(), logits.end());
          for (const auto& [i, n] : step) seqs[static_cast<size_t>(i)].num_tokens += n;
        }
        std::unique_ptr<Model> plain;
        if (g.dcp > 1) {
          o.token_sharded_prefill = 0;
          plain = Model::load(dir, o);
        }
        for (int i = 0; i < 2; ++i) {
          SequenceState& st = seqs[static_cast<size_t>(i)];
          if (st.num_tokens == 0) continue;
          const std::vector<int32_t> next = {prompts[i][static_cast<size_t>(st.num_tokens)]};
          if (plain) {
            SequenceState copy = copy_state(*plain, st);
            plain->forward(next, copy, logits);
            run.plain_decode.insert(run.plain_decode.end(), logits.begin(), logits.end());
          }
          model->forward(next, st, logits);
          run.decode.insert(run.decode.end(), logits.begin(), logits.end());
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < g.tp; ++rank) EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << rank;
  return runs;
}

testing::AssertionResult same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return testing::AssertionFailure() << a.size() << " against " << b.size() << " values";
  }
  if (a.empty()) return testing::AssertionFailure() << "no values";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return testing::AssertionFailure() << "value " << i << ": " << a[i] << " against " << b[i];
    }
  }
  return testing::AssertionSuccess();
}

double max_relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(a[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return max_abs > 0 ? max_diff / max_abs : 1.0;
}

struct GatheredCase {
  const char* dir;
  int tp;
  int dcp;
  bool indexer_fp8;
  LatentCacheDtype latent;
};

class GatheredContextPrefill : public testing::TestWithParam<GatheredCase> {};

TEST_P(GatheredContextPrefill, EqualsTokenShardedPrefillWithoutDcpBitwise) {
  const GatheredCase k = GetParam();
  const std::filesystem::path dir = fixture(k.dir);
  const GroupOptions without{k.tp, 1, 1, k.indexer_fp8, k.latent};
  const GroupOptions with{k.tp, k.dcp, 1, k.indexer_fp8, k.latent};
  // One prompt; a prompt in two chunks (the second over a cached prefix of 20); a few tokens
  // over 2N pieces (ranks without a piece) continued; a batch of two sequences, one of them
  // continuing its prefix, the other fresh.
  const std::vector<std::vector<Step>> cases = {
      {{{0, 37}}}, {{{0, 20}}, {{0, 17}}}, {{{0, 3}}, {{0, 6}}}, {{{0, 11}}, {{0, 9}, {1, 14}}}};
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "case " << i);
    const std::vector<StepsRun> want = run_steps(dir, without, cases[i]);
    const std::vector<StepsRun> got = run_steps(dir, with, cases[i]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_TRUE(same_floats(got[r].prefill, want[0].prefill)) << "rank " << r;
      // The decode after it is DCP's own, bit for bit, and within DCP's tolerance of TP's.
      EXPECT_TRUE(same_floats(got[r].decode, got[r].plain_decode)) << "rank " << r;
      EXPECT_LE(max_relative_diff(want[0].decode, got[r].decode), 1e-4) << "rank " << r;
    }
  }
}

// Steps below the threshold keep DCP's merged prefill between token-sharded ones: the logits
// stay within DCP's tolerance of the same steps without DCP.
TEST_P(GatheredContextPrefill, ShortStepsBetweenKeepTheMergedForm) {
  const GatheredCase k = GetParam();
  const std::filesystem::path dir = fixture(k.dir);
  const std::vector<Step> steps = {{{0, 20}}, {{0, 5}}, {{0, 12}}};
  const std::vector<StepsRun> want = run_steps(dir, {k.tp, 1, 10, k.indexer_fp8, k.latent}, steps);
  const std::vector<StepsRun> got =
      run_steps(dir, {k.tp, k.dcp, 10, k.indexer_fp8, k.latent}, steps);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got[0].prefill.size(), want[0].prefill.size());
  // The first step is token-sharded in both: the same bits.
  const auto first = static_cast<std::ptrdiff_t>(20 * ModelConfig::load(dir).vocab_size);
  EXPECT_TRUE(same_floats({got[0].prefill.begin(), got[0].prefill.begin() + first},
                          {want[0].prefill.begin(), want[0].prefill.begin() + first}));
  EXPECT_LE(max_relative_diff(want[0].prefill, got[0].prefill), 1e-4);
  EXPECT_LE(max_relative_diff(want[0].decode, got[0].decode), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, GatheredContextPrefill,
    testing::Values(
        GatheredCase{"tests/fixtures/deepseek_v32_tiny", 2, 2, false, LatentCacheDtype::kFp32},
        GatheredCase{"tests/fixtures/deepseek_v32_tiny", 4, 2, false, LatentCacheDtype::kFp32},
        GatheredCase{"tests/fixtures/deepseek_v32_tiny", 4, 4, false, LatentCacheDtype::kFp32},
        GatheredCase{"tests/fixtures/deepseek_v32_tiny", 2, 2, true, LatentCacheDtype::kBf16},
        GatheredCase{"tests/fixtures/kimi_linear_tiny", 2, 2, false, LatentCacheDtype::kFp32},
        GatheredCase{"tests/fixtures/kimi_linear_tiny", 2, 2, false, LatentCacheDtype::kBf16}),
    [](const testing::TestParamInfo<GatheredCase>& p) {
      return std::filesystem::path(p.param.dir).filename().string() + "_tp" +
             std::to_string(p.param.tp) + "_dcp" + std::to_string(p.param.dcp) +
             (p.param.indexer_fp8 ? "_fp8keys" : "") +
             (p.param.latent == LatentCacheDtype::kBf16 ? "_bf16" : "");
    });

// The gathered context of one sequence of the longest context is counted in the scratch
// budget (Model::context_transient_bytes), on top of the indexer's score chunk, and only
// where the gathered form runs.
TEST(GatheredContextPrefillBudget, ContextTransientCountsTheGatheredContext) {
  const std::filesystem::path dir = fixture("tests/fixtures/deepseek_v32_tiny");
  const ModelConfig c = ModelConfig::load(dir);
  constexpr int64_t kContext = 1000;
  int64_t bytes[3] = {0, 0, 0};  // TP 2 with token-sharded prefill; + DCP 2; DCP 2 alone
  parallel::HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto tp_comm = parallel::make_cpu_communicator(store, rank, 2, 60s, "tp");
        auto dcp_comm = parallel::make_cpu_communicator(store, rank, 2, 60s, "dcp");
        for (int i = 0; i < 3; ++i) {
          ModelOptions o;
          o.parallel.tp = {rank, 2, tp_comm.get()};
          o.token_sharded_prefill = i < 2 ? 1 : 0;
          if (i > 0) o.parallel.dcp = {rank, 2, dcp_comm.get()};
          const auto model = Model::load(dir, o);
          if (rank == 0) bytes[i] = model->context_transient_bytes(kContext);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << rank;
  const int64_t scores = 256 * kContext * 4;
  EXPECT_EQ(bytes[0], scores);
  EXPECT_EQ(bytes[2], scores);
  // fp32 latents and index keys of every position, with the all-gather's buffers.
  const int64_t row = (c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim) * 4;
  EXPECT_GE(bytes[1] - scores, kContext * row);
  EXPECT_LE(bytes[1] - scores, 3 * kContext * row);
}

// As `hyserve serve` plans the scratch (tests/memory_budget_test.cpp): a warm-up step of
// kStep fresh tokens plus context_transient_bytes of the longest context, reserved at once,
// holds gathered-context prefill steps up to that context and the decode step after them;
// without the context term the same steps grow it. A model without an indexer, so that the
// gathered context is the whole term (no score chunk).
TEST(GatheredContextPrefillBudget, ReservedScratchHoldsStepsUpToTheLongestContext) {
  const std::filesystem::path dir = fixture("tests/fixtures/kimi_linear_tiny");
  constexpr int64_t kStep = 256, kContext = 8192;
  parallel::HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto tp_comm = parallel::make_cpu_communicator(store, rank, 2, 60s, "tp");
        auto dcp_comm = parallel::make_cpu_communicator(store, rank, 2, 60s, "dcp");
        ModelOptions o;
        o.parallel.tp = {rank, 2, tp_comm.get()};
        o.parallel.dcp = {rank, 2, dcp_comm.get()};
        o.token_sharded_prefill = 1;
        const auto model = Model::load(dir, o);
        ASSERT_FALSE(model->config().has_indexer());
        std::vector<float> logits;
        SequenceState warm = model->new_sequence();
        model->forward(std::vector<int32_t>(kStep, 5), warm, logits);
        const size_t profiled = warm.workspace->capacity_bytes();
        const auto transient = static_cast<size_t>(model->context_transient_bytes(kContext));
        EXPECT_GT(transient, 0u);
        for (const bool with_term : {true, false}) {
          SequenceState s = model->new_sequence(kContext);
          s.workspace = std::make_unique<Workspace>(&model->backend());
          s.workspace->reserve(profiled + (with_term ? transient : 0));
          const size_t reserved = s.workspace->capacity_bytes();
          for (int64_t done = 0; done < kContext - 1; done += kStep) {
            const auto n = static_cast<size_t>(std::min(kStep, kContext - 1 - done));
            model->forward(std::vector<int32_t>(n, 7), s, logits);
          }
          model->forward(std::vector<int32_t>{9}, s, logits);
          if (with_term) {
            EXPECT_EQ(s.workspace->capacity_bytes(), reserved) << "rank " << rank;
            EXPECT_EQ(s.workspace->num_blocks(), 1u) << "rank " << rank;
          } else {
            EXPECT_GT(s.workspace->capacity_bytes(), reserved) << "rank " << rank;
          }
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << rank;
}

TEST(ContextParallelConfig, RefusesAGroupThatDoesNotDivideTheTpGroup) {
  parallel::HashStore store;
  auto comm = parallel::make_cpu_communicator(store, 0, 1, 10s, "one");
  ModelOptions o;
  o.parallel.dcp = {0, 2, comm.get()};
  try {
    Model::load(fixture("tests/fixtures/deepseek_v32_tiny"), o);
    FAIL() << "dcp 2 inside tp 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "decode context parallel size 2 must divide the tensor parallel size 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hyserve
