// KvCacheManager: all-or-nothing allocation (revived hit blocks counted), reverse-order free,
// usage, prefix hits only at KDA snapshot boundaries and never past prompt_len - 1, snapshot
// cuts and copies, the restore snapshot held for one step, prefix-cache token counters.
#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

constexpr int64_t kBlockSize = 4;

KvCacheConfig make_config(int32_t num_blocks, bool kda, bool prefix, int64_t every_blocks = 0) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kBlockSize;
  c.has_kda_layers = kda;
  c.enable_prefix_caching = prefix;
  c.snapshot_policy.every_blocks = every_blocks;
  return c;
}

Request make_request(const std::string& id, std::vector<int32_t> prompt) {
  return Request{.id = id, .prompt_token_ids = std::move(prompt)};
}

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

struct Step {
  int64_t num_tokens = 0;  // computed by the step
  std::optional<SnapshotCopy> copy;
};

// One scheduler-style step of `r` with at most `n` tokens; the request must fit.
Step run_step(KvCacheManager& kv, Request& r, int64_t n, int64_t num_cached = 0) {
  const int64_t computed = std::exchange(r.num_computed_tokens, r.num_computed_tokens + num_cached);
  n = kv.limit_to_snapshot_boundary(r, n);
  r.num_computed_tokens = computed;
  EXPECT_TRUE(kv.allocate_slots(r, n, num_cached)) << r.id;
  r.num_computed_tokens += num_cached;
  Step s{n, kv.cache_full_blocks(r, r.num_computed_tokens + n)};
  r.num_computed_tokens += n;
  kv.end_step();
  kv.pool().check_invariants();
  return s;
}

// Runs the whole prompt of `r` in steps of at most `chunk` tokens; returns each step's size.
std::vector<int64_t> run_prompt(KvCacheManager& kv, Request& r, int64_t chunk,
                                std::vector<SnapshotCopy>* copies = nullptr) {
  std::vector<int64_t> sizes;
  const int64_t cached = kv.get_computed_blocks(r);
  bool first = true;
  while (r.num_computed_tokens + (first ? cached : 0) < r.num_tokens()) {
    const int64_t begin = r.num_computed_tokens + (first ? cached : 0);
    Step s = run_step(kv, r, std::min(chunk, r.num_tokens() - begin), first ? cached : 0);
    first = false;
    sizes.push_back(s.num_tokens);
    if (s.copy && copies) copies->push_back(*s.copy);
  }
  return sizes;
}

TEST(KvCacheManagerTest, AllocateSlotsIsAllOrNothing) {
  for (bool kda : {false, true}) {
    KvCacheManager kv(make_config(8, kda, false));
    Request a = make_request("a", iota_tokens(20));
    ASSERT_TRUE(kv.allocate_slots(a, 20, 0));
    EXPECT_EQ(kv.block_table("a")->num_blocks(), 5);
    EXPECT_EQ(kv.block_table("a")->state_block().has_value(), kda);
    const int32_t free_before = kv.pool().num_free();
    const auto list_before = kv.pool().free_list();
    Request b = make_request("b", iota_tokens(16));
    const int64_t fitting = kda ? 1 : 3;  // token blocks b can still get (+ its state block)
    EXPECT_FALSE(kv.allocate_slots(b, fitting * kBlockSize + 1, 0));
    EXPECT_EQ(kv.pool().num_free(), free_before);
    EXPECT_EQ(kv.pool().free_list(), list_before);
    EXPECT_EQ(kv.block_table("b"), nullptr);
    ASSERT_TRUE(kv.allocate_slots(b, fitting * kBlockSize, 0));
    EXPECT_EQ(kv.pool().num_free(), 0);
    EXPECT_DOUBLE_EQ(kv.usage(), 1.0);
    kv.free(a);
    kv.free(b);
    EXPECT_DOUBLE_EQ(kv.usage(), 0.0);
    kv.pool().check_invariants();
  }
}

TEST(KvCacheManagerTest, GrowsOneBlockAtATime) {
  KvCacheManager kv(make_config(4, false, false));
  Request a = make_request("a", iota_tokens(3));
  ASSERT_TRUE(kv.allocate_slots(a, 3, 0));
  a.num_computed_tokens = 3;
  for (int t = 0; t < 10; ++t) {
    a.output_token_ids.push_back(t);
    ASSERT_TRUE(kv.allocate_slots(a, 1, 0));
    ++a.num_computed_tokens;
    EXPECT_EQ(kv.block_table("a")->num_blocks(), (a.num_computed_tokens + 3) / 4);
    EXPECT_DOUBLE_EQ(kv.usage(), static_cast<double>((a.num_computed_tokens + 3) / 4) / 4);
  }
  EXPECT_EQ(kv.block_table("a")->slot_index(12),
            int64_t{kv.block_table("a")->blocks()[3]} * kBlockSize);
}

TEST(KvCacheManagerTest, FreeReturnsBlocksLastFirstAndCachedOnesStayRevivable) {
  KvCacheManager kv(make_config(8, false, true));
  Request a = make_request("a", iota_tokens(13));
  run_prompt(kv, a, 100);
  const std::vector<int32_t> blocks(kv.block_table("a")->blocks().begin(),
                                    kv.block_table("a")->blocks().end());
  ASSERT_EQ(blocks.size(), 4u);
  kv.free(a);
  kv.pool().check_invariants();
  // Full blocks 0..2 are cached: they join the tail, the chain's tail evicted first; the
  // partial block 3 is uncached and joins the head.
  const auto list = kv.pool().free_list();
  ASSERT_EQ(list.size(), 8u);
  EXPECT_EQ(list.front(), blocks[3]);
  EXPECT_EQ(std::vector<int32_t>(list.end() - 3, list.end()),
            (std::vector<int32_t>{blocks[2], blocks[1], blocks[0]}));
  Request b = make_request("b", iota_tokens(13));
  EXPECT_EQ(kv.get_computed_blocks(b), 12);
  ASSERT_TRUE(kv.allocate_slots(b, 1, 12));
  EXPECT_EQ(std::vector<int32_t>(kv.block_table("b")->blocks().begin(),
                                 kv.block_table("b")->blocks().begin() + 3),
            std::vector<int32_t>(blocks.begin(), blocks.begin() + 3));
}

TEST(KvCacheManagerTest, HitNeverCoversTheLastPromptToken) {
  KvCacheManager kv(make_config(8, false, true));
  Request a = make_request("a", iota_tokens(8));
  run_prompt(kv, a, 100);
  kv.free(a);
  Request b = make_request("b", iota_tokens(8));
  EXPECT_EQ(kv.get_computed_blocks(b), 4);
  Request c = make_request("c", iota_tokens(9));
  EXPECT_EQ(kv.get_computed_blocks(c), 8);
  Request d = make_request("d", iota_tokens(1));
  EXPECT_EQ(kv.get_computed_blocks(d), 0);
}

TEST(KvCacheManagerTest, KdaChunksEndAtSnapshotBoundariesAndHitsLandOnlyThere) {
  // tokens per block 4; snapshots every 2 blocks and at the prompt's last full block (5).
  KvCacheManager kv(make_config(32, true, true, 2));
  Request a = make_request("a", iota_tokens(21));
  std::vector<SnapshotCopy> copies;
  EXPECT_EQ(run_prompt(kv, a, 100, &copies), (std::vector<int64_t>{8, 8, 4, 1}));
  ASSERT_EQ(copies.size(), 3u);
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(copies[i].request_id, "a");
    EXPECT_EQ(copies[i].state_block, *kv.block_table("a")->state_block());
    EXPECT_EQ(copies[i].num_tokens, (std::vector<int64_t>{8, 16, 20})[i]);
  }
  kv.free(a);
  kv.pool().check_invariants();

  struct Case {
    int shared;        // leading tokens equal to a's prompt
    int64_t kda_hit;   // at a snapshot boundary
    int64_t attn_hit;  // any block boundary
  };
  for (const Case& c : {Case{21, 20, 20}, Case{19, 16, 16}, Case{15, 8, 12}, Case{7, 0, 4}}) {
    auto prompt = iota_tokens(24);
    for (int i = c.shared; i < 24; ++i) prompt[i] = 7;
    Request b = make_request("b", prompt);
    EXPECT_EQ(kv.get_computed_blocks(b), c.kda_hit) << "shared " << c.shared;
    KvCacheManager plain(make_config(32, false, true));
    Request a2 = make_request("a", iota_tokens(21));
    run_prompt(plain, a2, 100);
    plain.free(a2);
    EXPECT_EQ(plain.get_computed_blocks(b), c.attn_hit) << "shared " << c.shared;
  }

  // A second identical prompt stores no new snapshot and does not cut its chunks.
  Request same = make_request("same", iota_tokens(21));
  copies.clear();
  EXPECT_EQ(run_prompt(kv, same, 100, &copies), (std::vector<int64_t>{1}));
  EXPECT_TRUE(copies.empty());
}

TEST(KvCacheManagerTest, RestoreSnapshotIsHeldForTheStep) {
  KvCacheManager kv(make_config(16, true, true));
  Request a = make_request("a", iota_tokens(10));
  std::vector<SnapshotCopy> copies;
  run_prompt(kv, a, 100, &copies);
  ASSERT_EQ(copies.size(), 1u);
  const int32_t snapshot = copies[0].snapshot_block;
  kv.free(a);
  EXPECT_EQ(kv.pool().ref_count(snapshot), 0);

  Request b = make_request("b", iota_tokens(10));
  ASSERT_EQ(kv.get_computed_blocks(b), 8);
  ASSERT_TRUE(kv.allocate_slots(b, 2, 8));
  EXPECT_EQ(kv.state_restore_block("b"), snapshot);
  EXPECT_EQ(kv.pool().ref_count(snapshot), 1);
  EXPECT_NE(kv.block_table("b")->state_block(), snapshot);
  kv.end_step();
  EXPECT_EQ(kv.state_restore_block("b"), std::nullopt);
  EXPECT_EQ(kv.pool().ref_count(snapshot), 0);
  EXPECT_TRUE(kv.pool().block_hash(snapshot).has_value());
  kv.pool().check_invariants();

  const PrefixCacheStats& stats = kv.prefix_cache_stats();
  EXPECT_EQ(stats.num_requests, 2);
  EXPECT_EQ(stats.num_query_tokens, 20);
  EXPECT_EQ(stats.num_hit_tokens, 8);
}

TEST(KvCacheManagerTest, RevivedHitBlocksCountAgainstFreeSpace) {
  // 6 blocks: a's 3 full blocks stay cached and free after it finishes.
  KvCacheManager kv(make_config(6, false, true));
  Request a = make_request("a", iota_tokens(12));
  run_prompt(kv, a, 100);
  kv.free(a);
  ASSERT_EQ(kv.pool().num_free(), 6);
  // Holds 3 blocks; the 3 cached ones are the only free ones left.
  Request filler = make_request("filler", iota_tokens(12, 500));
  ASSERT_TRUE(kv.allocate_slots(filler, 12, 0));
  // b shares a's first 8 tokens: it hits 2 cached blocks and needs 2 more, but reviving the
  // hit leaves only 1 free.
  auto b_prompt = iota_tokens(14);
  std::fill(b_prompt.begin() + 8, b_prompt.end(), 7);
  Request b = make_request("b", b_prompt);
  ASSERT_EQ(kv.get_computed_blocks(b), 8);
  const auto list_before = kv.pool().free_list();
  EXPECT_FALSE(kv.allocate_slots(b, 6, 8));
  EXPECT_EQ(kv.pool().free_list(), list_before);
  EXPECT_EQ(kv.block_table("b"), nullptr);
  // c needs 1 block beyond the hit: that fits.
  b_prompt.resize(12);
  Request c = make_request("c", b_prompt);
  ASSERT_EQ(kv.get_computed_blocks(c), 8);
  EXPECT_TRUE(kv.allocate_slots(c, 4, 8));
  EXPECT_EQ(kv.pool().num_free(), 0);
  kv.pool().check_invariants();
}

TEST(KvCacheManagerTest, CachedTokensMustComeFromTheLookup) {
  KvCacheManager kv(make_config(8, false, true));
  Request a = make_request("a", iota_tokens(9));
  run_prompt(kv, a, 100);
  Request b = make_request("b", iota_tokens(9));
  EXPECT_THROW(kv.allocate_slots(b, 1, 8), InvalidArgument);
  ASSERT_EQ(kv.get_computed_blocks(b), 8);
  EXPECT_THROW(kv.allocate_slots(b, 1, 4), InvalidArgument);
  EXPECT_THROW(kv.allocate_slots(b, 10, 0), InvalidArgument);  // past the request's tokens
}

TEST(KvCacheManagerTest, ConfigFromPlanAndDcpBlocks) {
  CachePlan plan;
  plan.block_size = 4;
  plan.options.dcp = 2;
  plan.kda_state_rows = 1;
  const KvCacheConfig c = make_kv_cache_config(plan, 10);
  EXPECT_EQ(c.num_blocks, 10);
  EXPECT_EQ(c.tokens_per_block(), 8);
  EXPECT_TRUE(c.has_kda_layers);
  EXPECT_FALSE(c.enable_prefix_caching);
  KvCacheManager kv(c);
  Request a = make_request("a", iota_tokens(17));
  ASSERT_TRUE(kv.allocate_slots(a, 17, 0));
  EXPECT_EQ(kv.block_table("a")->num_blocks(), 3);  // 8 positions per block over 2 ranks
  EXPECT_EQ(kv.blocks_for_request(17), 4);
  EXPECT_EQ(kv.pool().num_free(), 6);
  plan.kda_state_rows = 0;
  EXPECT_FALSE(make_kv_cache_config(plan, 10).has_kda_layers);
}

}  // namespace
}  // namespace hyserve
