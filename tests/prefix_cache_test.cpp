// PrefixCache: hits only at block boundaries with a KDA snapshot, never past prompt_len - 1,
// salt / extra-key isolation, LRU eviction of blocks and snapshots, revival of freed blocks.
#include "kv/prefix_cache.h"

#include <numeric>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

constexpr int64_t kTpb = 4;  // tokens per block

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A finished request: its full blocks are cached, snapshots stored at `boundaries`
// (1-based), and every reference released.
void run_request(BlockPool& pool, PrefixCache& cache, const std::vector<int32_t>& tokens,
                 const PrefixKey& key, const std::vector<int64_t>& boundaries) {
  const auto hashes = cache.hash_blocks(tokens, key);
  const auto hit = cache.find_longest_prefix(tokens, key);
  cache.acquire(hit);
  const int64_t num_blocks = (static_cast<int64_t>(tokens.size()) + kTpb - 1) / kTpb;
  auto fresh = pool.allocate(static_cast<int32_t>(num_blocks - hit.blocks.size()));
  ASSERT_TRUE(fresh.has_value());
  std::vector<int32_t> blocks = hit.blocks;
  blocks.insert(blocks.end(), fresh->begin(), fresh->end());
  cache.cache_full_blocks(hashes, std::span<const int32_t>(blocks).first(hashes.size()));
  for (int64_t k : boundaries) {
    if (auto s = cache.store_snapshot(hashes[k - 1])) pool.free(std::vector<int32_t>{*s});
  }
  pool.free(blocks);
  if (hit.snapshot_block) pool.free(std::vector<int32_t>{*hit.snapshot_block});
  pool.check_invariants();
}

TEST(PrefixCacheTest, HashesFormAChainOverFullBlocks) {
  BlockPool pool(1);
  PrefixCache cache(pool, kTpb, true);
  const auto t = iota_tokens(11);
  const auto hashes = cache.hash_blocks(t, {});
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(cache.hash_blocks(std::span(t).first(4), {})[0], hashes[0]);
  // The same four tokens after a different first block hash differently.
  std::vector<int32_t> u = t;
  u[0] = 7;
  const auto other = cache.hash_blocks(u, {});
  EXPECT_NE(other[0], hashes[0]);
  EXPECT_NE(other[1], hashes[1]);
  EXPECT_NE(PrefixCache::snapshot_key(hashes[0]), hashes[0]);
}

TEST(PrefixCacheTest, KdaHitNeedsASnapshotAtTheBoundary) {
  BlockPool pool(16);
  PrefixCache cache(pool, kTpb, true);
  const auto first = iota_tokens(10);  // blocks [0,4) [4,8) cached, snapshot only at 1
  run_request(pool, cache, first, {}, {1});
  auto longer = iota_tokens(16);
  PrefixHit hit = cache.find_longest_prefix(longer, {});
  EXPECT_EQ(hit.num_cached_tokens, 4);
  ASSERT_EQ(hit.blocks.size(), 1u);
  ASSERT_TRUE(hit.snapshot_block.has_value());
  EXPECT_EQ(pool.block_hash(*hit.snapshot_block),
            PrefixCache::snapshot_key(cache.hash_blocks(first, {})[0]));

  run_request(pool, cache, first, {}, {2});  // adds the snapshot at boundary 2
  hit = cache.find_longest_prefix(longer, {});
  EXPECT_EQ(hit.num_cached_tokens, 8);
  EXPECT_EQ(hit.blocks.size(), 2u);
  longer[6] = -1;  // diverges inside block 2
  EXPECT_EQ(cache.find_longest_prefix(longer, {}).num_cached_tokens, 4);
  longer[1] = -1;  // diverges inside block 1
  const PrefixHit miss = cache.find_longest_prefix(longer, {});
  EXPECT_EQ(miss.num_cached_tokens, 0);
  EXPECT_TRUE(miss.blocks.empty());
  EXPECT_FALSE(miss.snapshot_block.has_value());
}

TEST(PrefixCacheTest, WithoutKdaEveryCachedBoundaryHits) {
  BlockPool pool(16);
  PrefixCache cache(pool, kTpb, false);
  run_request(pool, cache, iota_tokens(10), {}, {1, 2});
  EXPECT_EQ(pool.num_cached(), 2);  // no snapshots stored
  const PrefixHit hit = cache.find_longest_prefix(iota_tokens(16), {});
  EXPECT_EQ(hit.num_cached_tokens, 8);
  EXPECT_FALSE(hit.snapshot_block.has_value());
  EXPECT_FALSE(cache.should_snapshot(2, 10));
}

TEST(PrefixCacheTest, NeverHitsThePromptsLastToken) {
  BlockPool pool(16);
  PrefixCache cache(pool, kTpb, true);
  run_request(pool, cache, iota_tokens(12), {}, {1, 2, 3});
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(12), {}).num_cached_tokens, 8);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(9), {}).num_cached_tokens, 8);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(8), {}).num_cached_tokens, 4);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(5), {}).num_cached_tokens, 4);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(4), {}).num_cached_tokens, 0);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(1), {}).num_cached_tokens, 0);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(0), {}).num_cached_tokens, 0);
  EXPECT_EQ(cache.find_longest_prefix(iota_tokens(13), {}).num_cached_tokens, 12);
}

TEST(PrefixCacheTest, SaltAndExtraKeysIsolate) {
  BlockPool pool(32);
  PrefixCache cache(pool, kTpb, true);
  const auto t = iota_tokens(9);
  const PrefixKey a{"a", {}};
  run_request(pool, cache, t, a, {1, 2});
  EXPECT_EQ(cache.find_longest_prefix(t, a).num_cached_tokens, 8);
  EXPECT_EQ(cache.find_longest_prefix(t, {}).num_cached_tokens, 0);
  EXPECT_EQ(cache.find_longest_prefix(t, PrefixKey{"b", {}}).num_cached_tokens, 0);
  EXPECT_EQ(cache.find_longest_prefix(t, PrefixKey{"a", {"m"}}).num_cached_tokens, 0);
  // Keys are length-prefixed: ("ab") and ("a", "b") differ.
  EXPECT_NE(cache.hash_blocks(t, PrefixKey{"ab", {}})[0],
            cache.hash_blocks(t, PrefixKey{"a", {"b"}})[0]);
  EXPECT_NE(cache.hash_blocks(t, PrefixKey{"", {"a", ""}})[0],
            cache.hash_blocks(t, PrefixKey{"", {"a"}})[0]);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedAndRevivesFreedBlocks) {
  // 7 blocks: A and B each take 2 full blocks, a partial one and a snapshot; afterwards
  // the pool holds 6 cached, unreferenced blocks and one uncached.
  BlockPool pool(7);
  PrefixCache cache(pool, kTpb, true);
  const auto a = iota_tokens(9, 0), b = iota_tokens(9, 1000);
  run_request(pool, cache, a, {}, {2});
  run_request(pool, cache, b, {}, {2});
  EXPECT_EQ(pool.num_cached(), 6);
  EXPECT_EQ(pool.num_free(), 7);

  // Revive A: the same block ids come back, referenced, out of the free list.
  const PrefixHit hit_a = cache.find_longest_prefix(a, {});
  ASSERT_EQ(hit_a.num_cached_tokens, 8);
  cache.acquire(hit_a);
  for (int32_t blk : hit_a.blocks) EXPECT_EQ(pool.ref_count(blk), 1);
  EXPECT_EQ(pool.ref_count(*hit_a.snapshot_block), 1);
  EXPECT_EQ(pool.num_free(), 4);
  pool.check_invariants();
  pool.free(hit_a.blocks);  // A becomes the most recently used
  pool.free(std::vector<int32_t>{*hit_a.snapshot_block});

  // Three new blocks take the uncached one and evict B's snapshot and first block (least
  // recently used), not A.
  const auto taken = pool.allocate(3);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(cache.find_longest_prefix(b, {}).num_cached_tokens, 0);
  const PrefixHit again = cache.find_longest_prefix(a, {});
  EXPECT_EQ(again.num_cached_tokens, 8);
  EXPECT_EQ(again.blocks, hit_a.blocks);
  EXPECT_EQ(again.snapshot_block, hit_a.snapshot_block);
  pool.free(*taken);
  pool.check_invariants();
}

TEST(PrefixCacheTest, SnapshotsAreEvictedLikeOtherBlocks) {
  BlockPool pool(4);
  PrefixCache cache(pool, kTpb, true);
  const auto t = iota_tokens(9);
  run_request(pool, cache, t, {}, {1});  // blocks 0..2, snapshot in block 3
  const auto hashes = cache.hash_blocks(t, {});
  EXPECT_TRUE(cache.has_snapshot(hashes[0]));
  // The snapshot was released when stored, before the request's blocks: free list
  // [uncached third block, snapshot, block 1, block 0].
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{2, 3, 1, 0}));
  auto taken = *pool.allocate(1);
  EXPECT_TRUE(cache.has_snapshot(hashes[0]));
  auto last = *pool.allocate(1);
  EXPECT_EQ(last, std::vector<int32_t>{3});
  EXPECT_FALSE(cache.has_snapshot(hashes[0]));
  EXPECT_EQ(pool.lookup(hashes[0]), 0);  // the token block is still cached, but useless
  EXPECT_EQ(cache.find_longest_prefix(t, {}).num_cached_tokens, 0);
  pool.free(taken);
  pool.free(last);
  pool.check_invariants();
}

TEST(PrefixCacheTest, StoreSnapshotRefusesDuplicatesFullPoolsAndNonKdaModels) {
  BlockPool pool(2);
  PrefixCache cache(pool, kTpb, true);
  const BlockHash hash = cache.hash_blocks(iota_tokens(4), {})[0];
  const auto s = cache.store_snapshot(hash);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(pool.ref_count(*s), 1);
  EXPECT_FALSE(cache.store_snapshot(hash).has_value());  // exists already
  const auto rest = *pool.allocate(1);
  const BlockHash other = cache.hash_blocks(iota_tokens(4, 7), {})[0];
  EXPECT_FALSE(cache.store_snapshot(other).has_value());  // no block free now
  pool.free(rest);
  pool.free(std::vector<int32_t>{*s});
  BlockPool pool2(2);
  PrefixCache no_kda(pool2, kTpb, false);
  EXPECT_FALSE(no_kda.store_snapshot(hash).has_value());
  pool.check_invariants();
}

TEST(PrefixCacheTest, SnapshotPolicyPicksPromptEndAndEveryNth) {
  BlockPool pool(1);
  PrefixCache cache(pool, kTpb, true, {.every_blocks = 3, .at_prompt_end = true});
  // prompt of 30 tokens: 7 full blocks; boundaries 3, 6 (periodic) and 7 (prompt end).
  std::vector<int64_t> picked;
  for (int64_t k = 0; k <= 10; ++k) {
    if (cache.should_snapshot(k, 30)) picked.push_back(k);
  }
  EXPECT_EQ(picked, (std::vector<int64_t>{3, 6, 7, 9}));
  PrefixCache end_only(pool, kTpb, true);
  EXPECT_TRUE(end_only.should_snapshot(2, 8));
  EXPECT_FALSE(end_only.should_snapshot(1, 8));
  EXPECT_THROW({ PrefixCache bad(pool, 0, true); }, InvalidArgument);
}

}  // namespace
}  // namespace hyserve
