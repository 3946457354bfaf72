// The decode step (engine/decode_step.h) on the CPU backend: its eager step computes what
// Model::forward_logits computes for the same batch, bitwise, and it copies a block-table
// row only where it changed: nothing in a step where no sequence crossed a block boundary,
// one entry per sequence that did, whole rows when the batch's order changes. Rows with LoRA
// adapters decode there too (each row's slot in the step's inputs; a slot with a merged kv_b
// in a slice of its own), bitwise as the forward computes them.
#include "engine/decode_step.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "lora_test_util.h"
#include "model/model.h"
#include "model/workspace.h"

namespace hyserve {
namespace {

std::vector<int32_t> random_prompt(size_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

bool same_bits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * 4) == 0;
}

struct Seq {
  std::vector<int32_t> blocks;
  int32_t state = -1;
  int64_t length = 0;
  int32_t next = 0;
};

// A pool and the workspace its forwards run in.
struct Pool {
  KvCache* cache;
  Workspace* ws;
};

// Prefills `prompt` as sequence s (its blocks and state row set) in two identical pools, with
// LoRA slot `slot` (-1: none), its KDA state zeroed first: s's length and greedy next token.
void prefill_both(const Model& model, Pool a, Pool b, Seq& s, const std::vector<int32_t>& prompt,
                  int32_t slot) {
  std::vector<float> l;
  for (const Pool& p : {a, b}) {
    if (s.state >= 0) p.cache->zero_block(s.state);
    SequenceInput in{p.cache, s.blocks, s.state, 0, prompt, false};
    in.lora_slot = slot;
    model.forward(std::span<const SequenceInput>(&in, 1), l, *p.ws);
  }
  s.length = std::ssize(prompt);
  s.next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

TEST(DecodeStep, EagerStepEqualsTheForwardAndCopiesOnlyChangedTableEntries) {
  const auto model =
      Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", {});
  const int64_t vocab = model->config().vocab_size;
  const CachePlan plan = model->cache_plan();
  const int64_t bs = plan.block_size;
  const bool kda = plan.kda_state_rows > 0;
  // Two identical pools: the decode step runs on one, Model::forward_logits on the other.
  auto cache_s = model->new_cache(40), cache_f = model->new_cache(40);
  Workspace ws_s(&model->backend()), ws_f(&model->backend());
  DecodeStep step(*model, *cache_s, ws_s, {4, 8 * bs, 0});
  EXPECT_EQ(step.num_graphs(), 0);

  // Sequence i: state row 30 + i; token blocks handed out from 0 as it grows. Prompts end
  // a few tokens before a block boundary so that decode crosses one.
  std::vector<Seq> seqs(3);
  int32_t next_block = 0;
  for (int i = 0; i < 3; ++i) {
    Seq& s = seqs[static_cast<size_t>(i)];
    s.state = kda ? 30 + i : -1;
    const auto prompt = random_prompt(static_cast<size_t>(bs - 2 - 3 * i + bs * (i == 2)),
                                      5 + static_cast<uint32_t>(i), vocab);
    while (std::ssize(s.blocks) * bs < std::ssize(prompt) + 1) s.blocks.push_back(next_block++);
    prefill_both(*model, {cache_s.get(), &ws_s}, {cache_f.get(), &ws_f}, s, prompt, -1);
  }

  std::vector<int> order = {0, 1, 2};
  for (int t = 0; t < 12; ++t) {
    if (t == 8) std::swap(order[0], order[1]);  // the batch's order changes
    // Blocks each sequence needs for its new token.
    std::vector<bool> added(seqs.size(), false);
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      if (std::ssize(s.blocks) * bs < s.length + 1) {
        s.blocks.push_back(next_block++);
        added[i] = true;
      }
    }
    std::vector<SequenceInput> batch_s, batch_f;
    for (int i : order) {
      Seq& s = seqs[static_cast<size_t>(i)];
      const std::span<const int32_t> tok(&s.next, 1);
      batch_s.push_back({cache_s.get(), s.blocks, s.state, s.length, tok, false});
      batch_f.push_back({cache_f.get(), s.blocks, s.state, s.length, tok, false});
    }
    ASSERT_TRUE(step.accepts(batch_s));
    const float* got = step.run(batch_s);
    std::vector<float> want;
    model->forward(batch_f, want, ws_f);
    ASSERT_TRUE(same_bits(want, got, want.size())) << "step " << t;

    // Entries copied: every sequence's table at the first step; then one per sequence that
    // took a block; when rows 0 and 1 swap sequences, each row up to the longer table.
    int64_t expected = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (t == 0) {
        expected += std::ssize(seqs[i].blocks);
      } else if (t == 8 && i < 2) {
        expected += std::max(std::ssize(seqs[0].blocks), std::ssize(seqs[1].blocks));
      } else {
        expected += added[i] ? 1 : 0;
      }
    }
    EXPECT_EQ(step.table_entries_uploaded(), expected) << "step " << t;
    for (size_t k = 0; k < order.size(); ++k) {
      Seq& s = seqs[static_cast<size_t>(order[k])];
      const float* row = got + static_cast<int64_t>(k) * vocab;
      s.next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      ++s.length;
    }
  }
}

// Three sequences decode with adapters x (every target but kv_b: the slots ride in the
// step's inputs), none, and x again, then x, none and y (every target, kv_b merged: one
// slice per sequence): every step's logits bitwise the forward's. The layout generation (a
// graph's LoRA key) changes only when a projection's op gains or loses its last adapter.
TEST(DecodeStep, LoraRowsEqualTheForwardWithAndWithoutAMergedKvB) {
  const auto model =
      Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", {});
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("hyserve_decode_lora_" + std::to_string(getpid()));
  model->enable_lora(3);
  const auto no_kv_b = [](const std::string& name) {
    return name.find("kv_b_proj") == std::string::npos;
  };
  const auto x = model->read_lora(test::write_adapter(*model, dir / "x", 41, no_kv_b), "x", 16);
  const auto x2 = model->read_lora(test::write_adapter(*model, dir / "x2", 42, no_kv_b), "x2", 16);
  const auto y = model->read_lora(test::write_adapter(*model, dir / "y", 43), "y", 16);
  std::filesystem::remove_all(dir);
  const int64_t g0 = model->lora_generation();
  model->set_lora(0, x);
  const int64_t g1 = model->lora_generation();
  EXPECT_NE(g1, g0);
  model->set_lora(0, x2);  // the same projections: the same layout
  EXPECT_EQ(model->lora_generation(), g1);
  model->set_lora(0, x);
  EXPECT_EQ(model->lora_generation(), g1);
  EXPECT_FALSE(model->lora_merges(0));

  const int64_t vocab = model->config().vocab_size;
  const CachePlan plan = model->cache_plan();
  const int64_t bs = plan.block_size;
  const bool kda = plan.kda_state_rows > 0;
  auto cache_s = model->new_cache(40), cache_f = model->new_cache(40);
  Workspace ws_s(&model->backend()), ws_f(&model->backend());
  DecodeStep step(*model, *cache_s, ws_s, {4, 8 * bs, 0});
  std::vector<Seq> seqs(3);
  std::vector<int32_t> slot = {0, -1, 0};
  int32_t next_block = 0;
  for (int i = 0; i < 3; ++i) {
    Seq& s = seqs[static_cast<size_t>(i)];
    s.state = kda ? 30 + i : -1;
    const auto prompt =
        random_prompt(static_cast<size_t>(9 + 4 * i), 70 + static_cast<uint32_t>(i), vocab);
    while (std::ssize(s.blocks) * bs < std::ssize(prompt) + 12) s.blocks.push_back(next_block++);
    prefill_both(*model, {cache_s.get(), &ws_s}, {cache_f.get(), &ws_f}, s, prompt,
                 slot[static_cast<size_t>(i)]);
  }
  for (int t = 0; t < 8; ++t) {
    if (t == 4) {
      // kv_b gains its first adapter, merged (no op of its own): the same layout.
      model->set_lora(2, y);
      EXPECT_EQ(model->lora_generation(), g1);
      EXPECT_TRUE(model->lora_merges(2));
      slot[2] = 2;
    }
    std::vector<SequenceInput> batch_s, batch_f;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const std::span<const int32_t> tok(&s.next, 1);
      batch_s.push_back({cache_s.get(), s.blocks, s.state, s.length, tok, false});
      batch_f.push_back({cache_f.get(), s.blocks, s.state, s.length, tok, false});
      batch_s.back().lora_slot = slot[i];
      batch_f.back().lora_slot = slot[i];
    }
    ASSERT_TRUE(step.accepts(batch_s));
    const float* got = step.run(batch_s);
    std::vector<float> want;
    model->forward(batch_f, want, ws_f);
    ASSERT_TRUE(same_bits(want, got, want.size())) << "step " << t;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const float* row = got + static_cast<int64_t>(i) * vocab;
      s.next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      ++s.length;
    }
  }
  model->set_lora(2, nullptr);  // x still adapts every projection y's ops did
  EXPECT_EQ(model->lora_generation(), g1);
  model->set_lora(0, nullptr);  // now none does
  EXPECT_NE(model->lora_generation(), g1);
}

TEST(DecodeStep, RefusesWhatIsNotABatchedDecodeOfItsCache) {
  const auto model =
      Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", {});
  const int64_t bs = model->cache_plan().block_size;
  auto cache = model->new_cache(8), other = model->new_cache(8);
  Workspace ws(&model->backend());
  DecodeStep step(*model, *cache, ws, {2, 2 * bs, 0});
  const std::vector<int32_t> blocks = {0}, two = {1, 2}, one = {1}, bad = {7 + 100};
  const std::vector<SequenceInput> prefill = {{cache.get(), blocks, 6, 0, two, false}};
  EXPECT_FALSE(step.accepts(prefill));
  EXPECT_ANY_THROW(step.run(prefill));
  const std::vector<SequenceInput> foreign = {{other.get(), blocks, 6, 0, one, false}};
  EXPECT_FALSE(step.accepts(foreign));
  const std::vector<SequenceInput> too_many = {{cache.get(), blocks, 5, 0, one, false},
                                               {cache.get(), blocks, 6, 0, one, false},
                                               {cache.get(), blocks, 7, 0, one, false}};
  EXPECT_FALSE(step.accepts(too_many));
  const std::vector<SequenceInput> too_long = {{cache.get(), blocks, 6, 2 * bs, one, false}};
  EXPECT_FALSE(step.accepts(too_long));
  const std::vector<SequenceInput> outside = {{cache.get(), bad, 6, 0, one, false}};
  EXPECT_ANY_THROW(step.run(outside));
}

}  // namespace
}  // namespace hyserve
