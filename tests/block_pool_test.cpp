// BlockPool: free-list order (uncached first, cached LRU), revival, eviction, and 10,000
// random operations checked step by step against a naive model and check_invariants().
#include "kv/block_pool.h"

#include <algorithm>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

BlockHash h(uint64_t id) {
  return {id, id * 7 + 1};
}

TEST(BlockPoolTest, FreshPoolAllocatesInOrderAndRefusesWhatDoesNotFit) {
  BlockPool pool(4);
  pool.check_invariants();
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(pool.allocate(5).has_value());
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(*pool.allocate(0), std::vector<int32_t>{});
  EXPECT_EQ(*pool.allocate(3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.allocate(2).has_value());
  EXPECT_EQ(pool.ref_count(1), 1);
  pool.check_invariants();
  BlockPool empty(0);
  EXPECT_FALSE(empty.allocate(1).has_value());
  empty.check_invariants();
}

TEST(BlockPoolTest, CachedBlocksAreEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(4);
  const auto blocks = *pool.allocate(4);
  for (int32_t b : blocks) EXPECT_TRUE(pool.cache_block(b, h(b)));
  pool.free(std::vector<int32_t>{0, 1});  // last block first: 1 is evicted before 0
  pool.free(std::vector<int32_t>{3});
  pool.free(std::vector<int32_t>{2});
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{1, 0, 3, 2}));
  EXPECT_EQ(pool.num_cached(), 4);
  pool.check_invariants();

  EXPECT_EQ(*pool.allocate(1), std::vector<int32_t>{1});
  EXPECT_FALSE(pool.lookup(h(1)).has_value());
  EXPECT_FALSE(pool.block_hash(1).has_value());
  EXPECT_EQ(pool.num_cached(), 3);

  pool.touch(std::vector<int32_t>{3});  // revive: leaves the free list with its hash
  EXPECT_EQ(pool.ref_count(3), 1);
  EXPECT_EQ(pool.lookup(h(3)), 3);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{0, 2}));
  pool.free(std::vector<int32_t>{3});  // now the most recently used
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(*pool.allocate(2), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(pool.lookup(h(3)), 3);
  pool.check_invariants();
}

TEST(BlockPoolTest, UncachedFreedBlocksAreUsedBeforeCachedOnes) {
  BlockPool pool(3);
  const auto blocks = *pool.allocate(3);
  ASSERT_TRUE(pool.cache_block(blocks[0], h(10)));
  pool.free(blocks);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(*pool.allocate(2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(pool.lookup(h(10)), 0);
  pool.check_invariants();
}

TEST(BlockPoolTest, SharedBlocksAndDuplicateHashes) {
  BlockPool pool(3);
  const auto a = *pool.allocate(2);
  EXPECT_TRUE(pool.cache_block(a[0], h(1)));
  EXPECT_TRUE(pool.cache_block(a[0], h(1)));   // idempotent
  EXPECT_FALSE(pool.cache_block(a[1], h(1)));  // first copy wins
  EXPECT_FALSE(pool.block_hash(a[1]).has_value());
  EXPECT_THROW(pool.cache_block(a[0], h(2)), InvalidArgument);
  pool.touch(std::vector<int32_t>{a[0]});  // a second request shares it
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.free(std::vector<int32_t>{a[0]});
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.num_free(), 1);
  pool.free(a);
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
}

TEST(BlockPoolTest, RefusesMisuse) {
  BlockPool pool(2);
  EXPECT_THROW(pool.free(std::vector<int32_t>{0}), InvalidArgument);
  EXPECT_THROW(pool.touch(std::vector<int32_t>{0}), InvalidArgument);  // free, uncached
  EXPECT_THROW(pool.cache_block(0, h(1)), InvalidArgument);            // unreferenced
  EXPECT_THROW(pool.touch(std::vector<int32_t>{2}), InvalidArgument);
  EXPECT_THROW(pool.allocate(-1), InvalidArgument);
  pool.check_invariants();
}

// The pool's contract written the naive way: the free list as a vector.
struct NaivePool {
  std::vector<int32_t> free;
  std::vector<int32_t> refs;
  std::vector<std::optional<BlockHash>> hash;
  std::map<uint64_t, int32_t> by_id;  // hash id -> block (ids map 1:1 to h(id))

  explicit NaivePool(int32_t n) : refs(n, 0), hash(n) {
    for (int32_t b = 0; b < n; ++b) free.push_back(b);
  }
  std::optional<std::vector<int32_t>> allocate(int32_t n) {
    if (n > static_cast<int32_t>(free.size())) return std::nullopt;
    std::vector<int32_t> out(free.begin(), free.begin() + n);
    free.erase(free.begin(), free.begin() + n);
    for (int32_t b : out) {
      if (hash[b]) by_id.erase(hash[b]->low);
      hash[b].reset();
      refs[b] = 1;
    }
    return out;
  }
  void touch(int32_t b) {
    if (refs[b] == 0) free.erase(std::find(free.begin(), free.end(), b));
    ++refs[b];
  }
  void release(const std::vector<int32_t>& blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (--refs[*it] > 0) continue;
      if (hash[*it]) {
        free.push_back(*it);
      } else {
        free.insert(free.begin(), *it);
      }
    }
  }
  bool cache(int32_t b, uint64_t id) {
    if (hash[b]) return *hash[b] == h(id);
    if (by_id.contains(id)) return false;
    by_id[id] = b;
    hash[b] = h(id);
    return true;
  }
};

TEST(BlockPoolTest, RandomOperationsMatchNaiveModelAndKeepInvariants) {
  constexpr int32_t kBlocks = 32;
  BlockPool pool(kBlocks);
  NaivePool model(kBlocks);
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> held;  // one reference per entry
  auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int num_evictions = 0, num_revivals = 0, num_refused = 0;
  for (int step = 0; step < 10000; ++step) {
    // allocate 25%, free 30%, cache 20%, revive 22.5%, pressure 2.5%
    const int r = static_cast<int>(pick(40));
    const int op = r < 10 ? 0 : r < 22 ? 1 : r < 30 ? 2 : r < 39 ? 3 : 4;
    if (op == 0) {  // allocate
      const int32_t n = static_cast<int32_t>(pick(7));
      const int32_t cached_before = pool.num_cached();
      const auto got = pool.allocate(n);
      const auto want = model.allocate(n);
      ASSERT_EQ(got, want) << "step " << step;
      if (got) {
        held.push_back(*got);
        num_evictions += cached_before - pool.num_cached();
      } else {
        ++num_refused;
      }
    } else if (op == 1 && !held.empty()) {  // free one holder's references
      const size_t i = pick(held.size());
      pool.free(held[i]);
      model.release(held[i]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 2 && !held.empty()) {  // cache a held block
      const auto& blocks = held[pick(held.size())];
      if (blocks.empty()) continue;
      const int32_t b = blocks[pick(blocks.size())];
      // A cached block may only be re-cached under its own hash.
      const uint64_t id = model.hash[b] ? model.hash[b]->low : pick(48);
      ASSERT_EQ(pool.cache_block(b, h(id)), model.cache(b, id)) << "step " << step;
    } else if (op == 3) {  // revive or share a cached block by its hash
      const uint64_t id = pick(48);
      const auto b = pool.lookup(h(id));
      ASSERT_EQ(b.has_value(), model.by_id.contains(id)) << "step " << step;
      if (!b) continue;
      ASSERT_EQ(*b, model.by_id[id]);
      num_revivals += pool.ref_count(*b) == 0;
      pool.touch(std::vector<int32_t>{*b});
      model.touch(*b);
      held.push_back({*b});
    } else if (op == 4) {  // pressure: take every free block, then give them back
      const int32_t n = pool.num_free();
      const int32_t cached_before = pool.num_cached();
      const auto got = pool.allocate(n);
      ASSERT_EQ(got, model.allocate(n));
      num_evictions += cached_before - pool.num_cached();
      pool.free(*got);
      model.release(*got);
    }
    pool.check_invariants();
    ASSERT_EQ(pool.free_list(), model.free) << "step " << step;
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(pool.ref_count(b), model.refs[b]) << "step " << step << " block " << b;
      ASSERT_EQ(pool.block_hash(b), model.hash[b]) << "step " << step << " block " << b;
    }
  }
  // The sequence exercised every path.
  EXPECT_GT(num_evictions, 100);
  EXPECT_GT(num_revivals, 100);
  EXPECT_GT(num_refused, 10);
}

}  // namespace
}  // namespace hyserve
