// Decode context parallelism on the CPU backend (ranks as threads, Gloo): rank r of a DCP
// group of W caches every W-th position; the logits of a prompt and of a decode step after
// it equal TP's (same group, no DCP) within float summation-order error, the same bits on
// every rank. The DSA indexer's top-k goes through the exact merge, so a DSA model selects
// exactly TP's keys; the difference is the log-sum-exp merge of the partial attentions.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"

namespace hyserve {
namespace {

using namespace std::chrono_literals;

std::filesystem::path fixture(const std::string& rel) {
  return std::filesystem::path(HYSERVE_SOURCE_DIR) / rel;
}

struct RankRun {
  std::vector<float> logits;     // prompt (all positions) then one decode step
  int64_t tokens_per_block = 0;  // of the rank's cache
};

// A group of tp ranks, DCP groups of dcp consecutive ranks (dcp 1: plain TP).
std::vector<RankRun> run_group(const std::filesystem::path& dir, int tp, int dcp,
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
        o.tp = {rank, tp, tp_comm.get()};
        o.token_sharded_prefill = token_sharded;
        if (dcp > 1) {
          dcp_comm = parallel::make_cpu_communicator(store, rank % dcp, dcp, 60s,
                                                     "dcp" + std::to_string(rank / dcp));
          o.dcp = {rank % dcp, dcp, dcp_comm.get()};
        }
        std::unique_ptr<Model> model = Model::load(dir, o);
        SequenceState s = model->new_sequence();
        RankRun& run = runs[static_cast<size_t>(rank)];
        run.tokens_per_block = s.cache->plan().tokens_per_block();
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

TEST(ContextParallelConfig, RefusesAGroupThatDoesNotDivideTheTpGroup) {
  parallel::HashStore store;
  auto comm = parallel::make_cpu_communicator(store, 0, 1, 10s, "one");
  ModelOptions o;
  o.dcp = {0, 2, comm.get()};
  try {
    Model::load(fixture("tests/fixtures/deepseek_v32_tiny"), o);
    FAIL() << "dcp 2 inside tp 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decode context parallelism"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hyserve
