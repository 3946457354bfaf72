// CUDA graphs for batched decode (engine/decode_step.h): a replayed graph computes
// exactly what the eager step that captured it computed, padding rows of a batch leave every
// real sequence's cache and state alone, and graph decode follows eager decode, with LoRA
// adapters too (each row's slot replayed from the step's inputs).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/decode_step.h"
#include "engine/engine.h"
#include "gpu/gpu_test_util.h"
#include "gpu/tiny_model_util.h"
#include "lora_test_util.h"
#include "model/model.h"

namespace hyserve {
namespace {

using test::load_tiny_on_gpu;
using test::random_prompt;

std::string request_id(int i) {
  std::string id = "r";
  id += std::to_string(i);
  return id;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// One decode step's logits on the host.
std::vector<float> run(DecodeStep& step, const Model& m, std::span<const SequenceInput> batch) {
  std::vector<float> l(batch.size() * static_cast<size_t>(m.config().vocab_size));
  m.backend().download(l.data(), step.run(batch), l.size() * 4);
  return l;
}

// A step of sequences decoded from graphs (lg) and eagerly (le): every logit within 1e-3 +
// 1e-3 relative (the graph's key bound changes the split-KV plan, so the sums' order
// differs) and the same greedy token, which becomes each sequence's next input; raises worst.
void follow_eager(const std::vector<float>& lg, const std::vector<float>& le, int64_t vocab,
                  int step, std::vector<int32_t>& next, std::vector<int64_t>& length,
                  float& worst) {
  ASSERT_EQ(lg.size(), le.size());
  for (size_t i = 0; i < next.size(); ++i) {
    const float* g = &lg[i * static_cast<size_t>(vocab)];
    const float* e = &le[i * static_cast<size_t>(vocab)];
    for (int64_t j = 0; j < vocab; ++j) {
      const float diff = std::fabs(g[j] - e[j]);
      worst = std::max(worst, diff);
      ASSERT_LE(diff, 1e-3f + 1e-3f * std::fabs(e[j]))
          << "step " << step << " sequence " << i << " logit " << j << ": graph " << g[j]
          << ", eager " << e[j];
    }
    const int32_t tg = argmax(g, vocab), te = argmax(e, vocab);
    ASSERT_EQ(tg, te) << "step " << step << " sequence " << i;
    next[i] = tg;
    ++length[i];
  }
}

// Two identical sequences in different rows of one pool: the first decode step captures
// the graph (and runs eagerly), the second replays it; their logits are bitwise equal.
TEST(GpuDecodeGraph, ReplayEqualsTheCapturingStepBitwise) {
  REQUIRE_GPU();
  auto model = load_tiny_on_gpu();
  const int64_t vocab = model->config().vocab_size;
  auto cache = model->new_cache(16);
  Workspace ws(&model->backend());
  DecodeStep graphs(*model, *cache, ws, {8, 4096, 8});
  const std::vector<int32_t> a_blocks = {0}, b_blocks = {2};
  const auto prompt = random_prompt(37, 1, vocab);
  std::vector<float> logits;
  model->forward(std::vector<SequenceInput>{{cache.get(), a_blocks, 1, 0, prompt, false}}, logits,
                 ws);
  cache->copy_block(2, 0);
  cache->copy_block(3, 1);
  const std::vector<int32_t> next = {5};
  const std::vector<float> first =
      run(graphs, *model, std::vector<SequenceInput>{{cache.get(), a_blocks, 1, 37, next, false}});
  EXPECT_EQ(graphs.num_graphs(), 1);
  const std::vector<float> second =
      run(graphs, *model, std::vector<SequenceInput>{{cache.get(), b_blocks, 3, 37, next, false}});
  EXPECT_EQ(graphs.num_graphs(), 1);
  ASSERT_EQ(first.size(), static_cast<size_t>(vocab));
  ASSERT_EQ(second.size(), first.size());
  for (int64_t i = 0; i < vocab; ++i) {
    ASSERT_EQ(std::memcmp(&first[i], &second[i], 4), 0)
        << "logit " << i << ": captured step " << first[i] << ", replay " << second[i];
  }
}

// Three sequences decode 12 steps together (a batch of 3 runs in the graph of 4: one padding
// row), from graphs and eagerly (Model::forward_logits): the same greedy tokens, logits within a
// tolerance (the graph's key bound changes the split-KV plan, so the sums' order differs).
// A fourth sequence in the same pool, never scheduled, keeps its cache rows bitwise.
TEST(GpuDecodeGraph, GraphDecodeFollowsEagerDecodeAndPaddingTouchesNothing) {
  REQUIRE_GPU();
  auto graphs = load_tiny_on_gpu();
  auto eager = load_tiny_on_gpu();
  const int64_t vocab = graphs->config().vocab_size;
  auto cache_g = graphs->new_cache(16), cache_e = eager->new_cache(16);
  Workspace ws_g(&graphs->backend()), ws_e(&eager->backend());
  DecodeStep step_g(*graphs, *cache_g, ws_g, {8, 4096, 8});
  // Sequence i: token block 2i, state row 2i + 1.
  std::vector<std::vector<int32_t>> blocks = {{0}, {2}, {4}, {6}};
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> length;
  for (int i = 0; i < 4; ++i) {
    tokens.push_back(random_prompt(5 + 9 * i, 10 + static_cast<uint32_t>(i), vocab));
    length.push_back(static_cast<int64_t>(tokens.back().size()));
    std::vector<float> l;
    for (auto* m : {graphs.get(), eager.get()}) {
      KvCache* cache = m == graphs.get() ? cache_g.get() : cache_e.get();
      m->forward(std::vector<SequenceInput>{{cache, blocks[i], 2 * i + 1, 0, tokens[i], false}}, l,
                 m == graphs.get() ? ws_g : ws_e);
    }
  }
  const size_t row = static_cast<size_t>(cache_g->plan().row_bytes);
  std::vector<uint8_t> idle_before(2 * row);
  graphs->backend().download(idle_before.data(), cache_g->base() + 6 * row, idle_before.size());

  std::vector<int32_t> next = {7, 8, 9};
  float worst = 0.0f;
  for (int step = 0; step < 12; ++step) {
    std::vector<float> le;
    std::vector<SequenceInput> bg, be;
    for (int i = 0; i < 3; ++i) {
      const std::span<const int32_t> tok(&next[static_cast<size_t>(i)], 1);
      bg.push_back({cache_g.get(), blocks[i], 2 * i + 1, length[i], tok, false});
      be.push_back({cache_e.get(), blocks[i], 2 * i + 1, length[i], tok, false});
    }
    const std::vector<float> lg = run(step_g, *graphs, bg);
    eager->forward(be, le, ws_e);
    follow_eager(lg, le, vocab, step, next, length, worst);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(step_g.num_graphs(), 1);
  std::vector<uint8_t> idle_after(2 * row);
  graphs->backend().download(idle_after.data(), cache_g->base() + 6 * row, idle_after.size());
  EXPECT_TRUE(idle_before == idle_after) << "the idle sequence's rows changed";
  std::printf("graph vs eager decode: worst logit difference %g\n", static_cast<double>(worst));
}

// Three sequences with adapter x, none and x decode from graphs and eagerly (the eager model's
// forward, per-sequence slots): the same greedy tokens, logits within the graph-vs-eager
// tolerance above. Midway slot 0 takes adapter x2 (the same projections: the same layout), and
// the replayed graph follows it (its kernels read the slot's matrices from the device
// table); a batch without adapters runs a graph of its own, without LoRA ops.
TEST(GpuDecodeGraph, LoraGraphsFollowEagerDecodeAndAReplacedAdapter) {
  REQUIRE_GPU();
  auto graphs = load_tiny_on_gpu();
  auto eager = load_tiny_on_gpu();
  const int64_t vocab = graphs->config().vocab_size;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("hyserve_gpu_lora_graph_" + std::to_string(::getpid()));
  // Every target: kv_b in the MLA op, the routed experts in the MoE kernels.
  for (auto* m : {graphs.get(), eager.get()}) m->enable_lora(2);
  test::write_adapter(*graphs, dir / "x", 51);
  test::write_adapter(*graphs, dir / "x2", 52);
  for (auto* m : {graphs.get(), eager.get()}) m->set_lora(0, m->read_lora(dir / "x", "x", 16));
  auto cache_g = graphs->new_cache(16), cache_e = eager->new_cache(16);
  Workspace ws_g(&graphs->backend()), ws_e(&eager->backend());
  DecodeStep step_g(*graphs, *cache_g, ws_g, {8, 4096, 8});
  std::vector<std::vector<int32_t>> blocks = {{0}, {2}, {4}};
  std::vector<int32_t> slot = {0, -1, 0};
  std::vector<int64_t> length;
  for (int i = 0; i < 3; ++i) {
    const auto prompt = random_prompt(6 + 7 * i, 60 + static_cast<uint32_t>(i), vocab);
    length.push_back(static_cast<int64_t>(prompt.size()));
    std::vector<float> l;
    for (auto* m : {graphs.get(), eager.get()}) {
      KvCache* cache = m == graphs.get() ? cache_g.get() : cache_e.get();
      SequenceInput in{cache, blocks[i], 2 * i + 1, 0, prompt, false};
      in.lora_slot = slot[static_cast<size_t>(i)];
      m->forward(std::vector<SequenceInput>{in}, l, m == graphs.get() ? ws_g : ws_e);
    }
  }
  std::vector<int32_t> next = {7, 8, 9};
  float worst = 0.0f;
  for (int step = 0; step < 10; ++step) {
    if (step == 4) {
      for (auto* m : {graphs.get(), eager.get()}) {
        m->set_lora(0, m->read_lora(dir / "x2", "x2", 16));
      }
    }
    if (step == 8) slot = {-1, -1, -1};  // no adapter: another graph
    std::vector<float> le;
    std::vector<SequenceInput> bg, be;
    for (int i = 0; i < 3; ++i) {
      const std::span<const int32_t> tok(&next[static_cast<size_t>(i)], 1);
      bg.push_back({cache_g.get(), blocks[i], 2 * i + 1, length[i], tok, false});
      be.push_back({cache_e.get(), blocks[i], 2 * i + 1, length[i], tok, false});
      bg.back().lora_slot = be.back().lora_slot = slot[static_cast<size_t>(i)];
    }
    const std::vector<float> lg = run(step_g, *graphs, bg);
    eager->forward(be, le, ws_e);
    follow_eager(lg, le, vocab, step, next, length, worst);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(step_g.num_graphs(), step < 8 ? 1 : 2) << "step " << step;
  }
  std::filesystem::remove_all(dir);
  std::printf("LoRA graph vs eager decode: worst logit difference %g\n",
              static_cast<double>(worst));
}

// The engine on the GPU with decode graphs and without: 6 concurrent greedy requests of
// different lengths (so decode batches shrink through the graph sizes as they finish) give
// the same tokens.
TEST(GpuDecodeGraph, EngineWithGraphsGivesTheEagerEngineTokens) {
  REQUIRE_GPU();
  std::map<std::string, std::vector<int32_t>> out[2];
  for (int use_graphs = 0; use_graphs < 2; ++use_graphs) {
    auto model = load_tiny_on_gpu();
    const int64_t vocab = model->config().vocab_size;
    EngineConfig config;
    config.decode_graph_max_batch = use_graphs ? 8 : 0;
    config.scheduler.max_model_len = 1024;
    config.scheduler.max_num_seqs = 8;
    Engine engine(std::move(model), config);
    for (int i = 0; i < 6; ++i) {
      Request r;
      r.id = request_id(i);
      r.prompt_token_ids = random_prompt(3 + 17 * i, 40 + static_cast<uint32_t>(i), vocab);
      r.sampling_params.temperature = 0.0f;
      r.sampling_params.max_tokens = 4 + 5 * i;
      r.sampling_params.ignore_eos = true;
      auto& dst = out[use_graphs][r.id];
      engine.add_request(std::move(r), [&dst](const RequestOutput& o) {
        for (const OutputToken& t : o.new_tokens) dst.push_back(t.token);
      });
    }
    for (int i = 0; i < 10000 && engine.step(); ++i) {
    }
    if (use_graphs) {
      EXPECT_GE(engine.runner().decode_step().num_graphs(), 3) << "batches of 6, 4 (5), 2 (3), 1";
    }
  }
  for (int i = 0; i < 6; ++i) {
    const std::string id = request_id(i);
    EXPECT_EQ(out[1][id].size(), static_cast<size_t>(4 + 5 * i)) << id;
    EXPECT_EQ(out[1][id], out[0][id]) << id;
  }
}

}  // namespace
}  // namespace hyserve
