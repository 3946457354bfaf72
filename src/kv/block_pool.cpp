#include "kv/block_pool.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_count_(num_blocks, 0),
      prev_(num_blocks, kNone),
      next_(num_blocks, kNone),
      in_free_list_(num_blocks, false),
      has_hash_(num_blocks, false),
      hash_(num_blocks),
      freed_at_(num_blocks, 0) {
  CHECK(num_blocks >= 0, "num_blocks must be >= 0, got ", num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) push_back(b);
}

void BlockPool::check_block(int32_t block) const {
  CHECK(block >= 0 && block < num_blocks(), "block ", block, " out of range [0, ", num_blocks(),
        ")");
}

void BlockPool::unlink(int32_t b) {
  (prev_[b] == kNone ? head_ : next_[prev_[b]]) = next_[b];
  (next_[b] == kNone ? tail_ : prev_[next_[b]]) = prev_[b];
  prev_[b] = next_[b] = kNone;
  in_free_list_[b] = false;
  --num_free_;
}

void BlockPool::push_front(int32_t b) {
  prev_[b] = kNone;
  next_[b] = head_;
  (head_ == kNone ? tail_ : prev_[head_]) = b;
  head_ = b;
  in_free_list_[b] = true;
  ++num_free_;
}

void BlockPool::push_back(int32_t b) {
  next_[b] = kNone;
  prev_[b] = tail_;
  (tail_ == kNone ? head_ : next_[tail_]) = b;
  tail_ = b;
  in_free_list_[b] = true;
  ++num_free_;
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int32_t n) {
  CHECK(n >= 0, "cannot allocate ", n, " blocks");
  if (n > num_free_) return std::nullopt;
  std::vector<int32_t> blocks;
  blocks.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    unlink(b);
    if (has_hash_[b]) {
      cached_.erase(hash_[b]);
      has_hash_[b] = false;
    }
    ref_count_[b] = 1;
    blocks.push_back(b);
  }
  return blocks;
}

int32_t BlockPool::drop_hashes() {
  const auto dropped = static_cast<int32_t>(cached_.size());
  // The cached free blocks sit at the tail of the free list: move each to the head (they
  // hold nothing findable now), keeping the list's order among them.
  std::vector<int32_t> cached_free;
  for (int32_t b = head_; b != kNone; b = next_[b]) {
    if (has_hash_[b]) cached_free.push_back(b);
  }
  for (auto it = cached_free.rbegin(); it != cached_free.rend(); ++it) {
    unlink(*it);
    push_front(*it);
  }
  std::fill(has_hash_.begin(), has_hash_.end(), false);
  cached_.clear();
  return dropped;
}

void BlockPool::touch(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    check_block(b);
    CHECK(ref_count_[b] > 0 || has_hash_[b], "touch of free uncached block ", b,
          ": its content is gone");
  }
  for (int32_t b : blocks) {
    if (ref_count_[b] == 0) unlink(b);
    ++ref_count_[b];
  }
}

void BlockPool::free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) check_block(b);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    CHECK(ref_count_[b] > 0, "free of unreferenced block ", b);
    if (--ref_count_[b] > 0) continue;
    freed_at_[b] = ++tick_;
    if (has_hash_[b]) {
      push_back(b);
    } else {
      push_front(b);
    }
  }
}

bool BlockPool::cache_block(int32_t block, const BlockHash& hash) {
  check_block(block);
  CHECK(ref_count_[block] > 0, "cache_block of unreferenced block ", block);
  if (has_hash_[block]) {
    CHECK(hash_[block] == hash, "block ", block, " is already cached under another hash");
    return true;
  }
  if (cached_.contains(hash)) return false;
  cached_.emplace(hash, block);
  hash_[block] = hash;
  has_hash_[block] = true;
  return true;
}

std::optional<int32_t> BlockPool::lookup(const BlockHash& hash) const {
  const auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

int32_t BlockPool::ref_count(int32_t block) const {
  check_block(block);
  return ref_count_[block];
}

std::optional<BlockHash> BlockPool::block_hash(int32_t block) const {
  check_block(block);
  if (!has_hash_[block]) return std::nullopt;
  return hash_[block];
}

std::vector<int32_t> BlockPool::free_list() const {
  std::vector<int32_t> out;
  out.reserve(num_free_);
  for (int32_t b = head_; b != kNone; b = next_[b]) out.push_back(b);
  return out;
}

void BlockPool::check_invariants() const {
  const int32_t n = num_blocks();
  int32_t count = 0;
  bool seen_cached = false;
  uint64_t last_cached_free = 0;
  for (int32_t b = head_, prev = kNone; b != kNone; prev = b, b = next_[b]) {
    CHECK(count < n, "free list has a cycle");
    CHECK(b >= 0 && b < n, "free list holds invalid block ", b);
    CHECK(prev_[b] == prev, "free list: block ", b, " has prev ", prev_[b], ", expected ", prev);
    CHECK(in_free_list_[b], "free list: block ", b, " not marked free");
    CHECK(ref_count_[b] == 0, "free list: block ", b, " has ", ref_count_[b], " references");
    if (has_hash_[b]) {
      CHECK(freed_at_[b] > last_cached_free || !seen_cached, "free list: cached block ", b,
            " is out of LRU order");
      seen_cached = true;
      last_cached_free = freed_at_[b];
    } else {
      CHECK(!seen_cached, "free list: uncached block ", b, " after a cached one");
    }
    ++count;
    if (next_[b] == kNone) CHECK(tail_ == b, "free list: tail is ", tail_, ", expected ", b);
  }
  CHECK(head_ != kNone || tail_ == kNone, "free list: empty with a tail");
  CHECK(count == num_free_, "free list has ", count, " blocks, num_free is ", num_free_);
  int32_t num_hashed = 0;
  for (int32_t b = 0; b < n; ++b) {
    CHECK(ref_count_[b] >= 0, "block ", b, " has a negative reference count");
    CHECK(in_free_list_[b] == (ref_count_[b] == 0), "block ", b, " with ", ref_count_[b],
          " references is ", in_free_list_[b] ? "" : "not ", "in the free list");
    if (has_hash_[b]) {
      ++num_hashed;
      const auto it = cached_.find(hash_[b]);
      CHECK(it != cached_.end() && it->second == b, "block ", b, " hash not mapped to it");
    }
  }
  CHECK(num_hashed == static_cast<int32_t>(cached_.size()), "hash map has ", cached_.size(),
        " entries for ", num_hashed, " cached blocks");
}

}  // namespace hyserve
