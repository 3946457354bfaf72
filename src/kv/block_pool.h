// BlockPool: the rows of the packed hybrid cache on one GPU (token blocks and KDA state
// blocks alike), with reference counts, the hash -> block map of the prefix cache, and a
// free list kept in eviction order.
//
//   free list:  head -> [uncached free blocks ...][cached free blocks, LRU ... MRU] <- tail
//
// allocate() takes from the head, so blocks holding nothing are used before any cached block
// is evicted, and cached blocks are evicted least recently freed first. A freed block whose
// reference count reaches 0 goes to the head when uncached and to the tail when cached: it
// keeps its hash and can be revived by touch() until allocate() evicts it (which removes the
// hash mapping). "Does not fit now" is std::nullopt, not an error.
//
// The pool only counts: it never touches device memory. Under DCP every rank runs the same
// sequence of calls, so block ids agree across ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace hyserve {

// 128-bit hash of a block's content key (XXH3-128, see prefix_cache.h).
struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low ^ h.high); }
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t num_free() const { return num_free_; }  // allocatable now (incl. cached, unreferenced)
  int32_t num_cached() const { return static_cast<int32_t>(cached_.size()); }

  // n blocks with reference count 1, or nullopt when fewer than n are free. Evicts cached
  // blocks (LRU first) when no uncached free block is left.
  std::optional<std::vector<int32_t>> allocate(int32_t n);
  // Takes one more reference on each block; an unreferenced cached block leaves the free
  // list (revival).
  void touch(std::span<const int32_t> blocks);
  // Drops one reference on each block, last block first, so that a request's chain tail is
  // evicted before its head. Blocks reaching 0 join the free list.
  void free(std::span<const int32_t> blocks);

  // Registers a referenced block under `hash`. Returns false (and leaves the block uncached)
  // when another block already holds that hash; a block holds at most one hash.
  bool cache_block(int32_t block, const BlockHash& hash);
  std::optional<int32_t> lookup(const BlockHash& hash) const;
  // Forgets every hash (vLLM's reset_prefix_cache): no lookup finds a block any more. Blocks
  // still referenced keep their contents and owners; cached free blocks become uncached free
  // blocks (the next ones allocated). Returns the number of hashes dropped.
  int32_t drop_hashes();

  int32_t ref_count(int32_t block) const;
  std::optional<BlockHash> block_hash(int32_t block) const;
  // Blocks of the free list from head (next allocated) to tail.
  std::vector<int32_t> free_list() const;

  // Throws InvalidArgument describing the first broken invariant: the free list is a
  // consistent doubly-linked list of exactly the unreferenced blocks, uncached before cached,
  // cached ones in increasing free time; the hash map and the per-block hashes agree.
  void check_invariants() const;

 private:
  static constexpr int32_t kNone = -1;
  void check_block(int32_t block) const;
  void unlink(int32_t block);
  void push_front(int32_t block);
  void push_back(int32_t block);

  std::vector<int32_t> ref_count_;    // [num_blocks]
  std::vector<int32_t> prev_, next_;  // [num_blocks] free-list links, kNone at the ends
  std::vector<bool> in_free_list_;    // [num_blocks]
  std::vector<bool> has_hash_;        // [num_blocks]
  std::vector<BlockHash> hash_;       // [num_blocks], valid where has_hash_
  std::vector<uint64_t> freed_at_;    // [num_blocks] tick of the last free (LRU order)
  int32_t head_ = kNone, tail_ = kNone;
  int32_t num_free_ = 0;
  uint64_t tick_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
};

}  // namespace hyserve
