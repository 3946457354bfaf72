// LoRA under tensor and expert parallelism (issue 48): an adapter written for the whole model
// (PEFT's shapes) is cut on each rank as the rank's weights were (LoraTargets, lora_share):
// column-parallel projections take B's rows of their heads, row-parallel ones (o_proj, down)
// A's columns, whose partial terms join the projection's partial sums before the all-reduce;
// under expert parallelism a rank keeps its own experts' pairs whole. The logits of a
// sequence with the adapter on every rank equal (bitwise across ranks, within 1e-4 of the
// largest logit) the one-rank model's with the same adapter, for a prompt and a decode step;
// with token-sharded prefill too (kv_b whole on every rank: each piece attends with its
// adapter's merged kv_b, the decode step with the view of the rank's heads), with and without
// decode context parallelism.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lora_test_util.h"
#include "model/model.h"
#include "tp_test_util.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

struct Layout {
  int tp = 1;
  bool expert_parallel = false;
  int dcp = 1;                // DCP groups of dcp consecutive ranks
  int64_t token_sharded = 0;  // --token-sharded-prefill (the 19-token prompt is sharded at 8)
};

// A prompt then one decode token, with LoRA slot `slot` (-1: none), on every rank of the
// layout; each rank's logits (all prompt positions, then the decode token's).
std::vector<std::vector<float>> run_with_adapter(const fs::path& model_dir, const fs::path& adapter,
                                                 const Layout& layout, int32_t slot) {
  using namespace std::chrono_literals;
  std::vector<std::vector<float>> logits(static_cast<size_t>(layout.tp));
  parallel::HashStore dcp_store;
  test::on_ranks(layout.tp, [&](int rank, parallel::Communicator* comm) {
    ModelOptions o;
    o.parallel.tp = {rank, layout.tp, comm};
    o.parallel.expert_parallel = layout.expert_parallel;
    o.token_sharded_prefill = layout.token_sharded;
    std::unique_ptr<parallel::Communicator> dcp_comm;
    if (layout.dcp > 1) {
      dcp_comm = parallel::make_cpu_communicator(dcp_store, rank % layout.dcp, layout.dcp, 60s,
                                                 "dcp" + std::to_string(rank / layout.dcp));
      o.parallel.dcp = {rank % layout.dcp, layout.dcp, dcp_comm.get()};
    }
    std::unique_ptr<Model> model = Model::load(model_dir, o);
    model->enable_lora(1);
    model->set_lora(0, model->read_lora(adapter, "a", 16));
    std::vector<int32_t> prompt;
    for (int i = 0; i < 19; ++i) {
      prompt.push_back((i * 41 + 3) % static_cast<int32_t>(model->config().vocab_size));
    }
    logits[rank] = test::run_steps_flat(*model, {prompt, {7}}, slot);
  });
  return logits;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(x[i]) - y[i]));
  }
  return m;
}

struct Case {
  const char* dir;
  std::vector<Layout> layouts;
};

class LoraTensorParallel : public testing::TestWithParam<Case> {};

TEST_P(LoraTensorParallel, AdapterLogitsMatchOneRankOnEveryRank) {
  const fs::path model_dir = fs::path(HYSERVE_SOURCE_DIR) / GetParam().dir;
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_lora_tp_" + std::to_string(::getpid()) + "_" + model_dir.filename().string());
  fs::remove_all(dir);
  fs::path adapter;
  {
    // An adapter on every projection and expert of the whole model.
    std::unique_ptr<Model> whole = Model::load(model_dir);
    whole->enable_lora(1);
    adapter = test::write_adapter(*whole, dir / "adapter", 77);
  }
  const std::vector<float> base = run_with_adapter(model_dir, adapter, {}, -1)[0];
  const std::vector<float> one = run_with_adapter(model_dir, adapter, {}, 0)[0];
  const double scale = max_abs(one);
  ASSERT_GT(scale, 0.0);
  // The adapter moves the logits far more than the tolerance: a rank that dropped or
  // miscut a pair would show.
  ASSERT_GT(max_diff(base, one), 1e-2 * scale);
  for (const Layout& layout : GetParam().layouts) {
    SCOPED_TRACE("tp " + std::to_string(layout.tp) +
                 (layout.expert_parallel ? " expert-parallel" : "") + " dcp " +
                 std::to_string(layout.dcp) + " token-sharded " +
                 std::to_string(layout.token_sharded));
    const std::vector<std::vector<float>> ranks = run_with_adapter(model_dir, adapter, layout, 0);
    ASSERT_EQ(ranks[0].size(), one.size());
    for (size_t r = 1; r < ranks.size(); ++r) {
      ASSERT_EQ(ranks[r].size(), one.size());
      EXPECT_EQ(0, std::memcmp(ranks[r].data(), ranks[0].data(), one.size() * 4)) << "rank " << r;
    }
    EXPECT_LE(max_diff(ranks[0], one), 1e-4 * scale) << "max |logit| " << scale;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, LoraTensorParallel,
                         testing::Values(Case{"tests/fixtures/kimi_linear_tiny",
                                              {{2, false}, {2, true}, {2, false, 1, 8}}},
                                         Case{"tests/fixtures/deepseek_v32_tiny",
                                              {{2, false},
                                               {4, false},
                                               {2, true},
                                               {2, false, 1, 8},
                                               {4, false, 1, 8},
                                               {2, false, 2, 8},
                                               {4, false, 2, 8}}}),
                         [](const testing::TestParamInfo<Case>& p) {
                           return fs::path(p.param.dir).filename().string();
                         });

// An adapter's shapes are the whole model's on every rank: one written for a rank's share
// (half the heads) is refused naming the tensor, as on one rank.
TEST(LoraTensorParallelShapes, AShareShapedAdapterIsRefusedNamingTheTensor) {
  const fs::path model_dir = fs::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/deepseek_v32_tiny";
  const fs::path dir =
      fs::temp_directory_path() / ("hyserve_lora_tp_share_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<std::string> refusals(2);
  test::on_ranks(2, [&](int rank, parallel::Communicator* comm) {
    ModelOptions o;
    o.parallel.tp = {rank, 2, comm};
    std::unique_ptr<Model> model = Model::load(model_dir, o);
    model->enable_lora(1);
    // Each rank writes an adapter of its own shares' shapes (its own folder).
    const fs::path a = test::write_adapter(*model, dir / std::to_string(rank), 5);
    try {
      model->read_lora(a, "share", 16);
    } catch (const Error& e) {
      refusals[rank] = e.what();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(refusals[rank].find("has shape"), std::string::npos) << refusals[rank];
    EXPECT_NE(refusals[rank].find("lora_"), std::string::npos) << refusals[rank];
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hyserve
