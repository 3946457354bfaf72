// PrefixCache: prefix caching over the packed hybrid cache (DESIGN.md). A full block of
// tokens_per_block positions is keyed by its token chain:
//
//   root     = XXH3-128(cache_salt, extra keys)         (length-prefixed, so keys never merge)
//   hash[i]  = XXH3-128(hash[i-1] or root, tokens of block i)
//
// so a hash names the whole prefix up to the end of its block, and requests with different
// salts or extra keys (model id, ...) never share a block. Attention pages can be reused at
// any block boundary, but KDA layers cannot rewind: a hit at boundary k (after k full blocks)
// also needs the KDA state at exactly that boundary. Those states are kept as snapshots, each
// a pool block cached under snapshot_key(hash[k-1]) and evicted by the same LRU as every
// other cached block. A model without KDA layers needs no snapshots.
//
// The pool blocks a lookup returns are not referenced: touch them (acquire()) before
// anything can allocate, and free them with the request. On a hit the engine copies the
// snapshot row into the request's own KDA state block; the snapshot stays shared.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "kv/cache_plan.h"

namespace hyserve {

// What isolates one request's cache entries from another's besides its tokens.
struct PrefixKey {
  std::string cache_salt;               // the request's cache_salt; empty: none
  std::vector<std::string> extra_keys;  // e.g. the served model id
};

struct PrefixHit {
  int64_t num_cached_tokens = 0;          // a multiple of tokens_per_block, <= prompt_len - 1
  std::vector<int32_t> blocks;            // token blocks of the cached prefix, in order
  std::optional<int32_t> snapshot_block;  // KDA state at num_cached_tokens (KDA models, hit)
};

class PrefixCache {
 public:
  // kda_snapshots: the model has KDA layers, so a hit needs a state snapshot.
  PrefixCache(BlockPool& pool, int64_t tokens_per_block, bool kda_snapshots,
              SnapshotPolicy policy = {});

  int64_t tokens_per_block() const { return tokens_per_block_; }
  const SnapshotPolicy& policy() const { return policy_; }

  // Hashes of the full blocks of `tokens` (tokens.size() / tokens_per_block of them).
  std::vector<BlockHash> hash_blocks(std::span<const int32_t> tokens, const PrefixKey& key) const;
  static BlockHash snapshot_key(const BlockHash& block_hash);

  // The longest cached prefix of the prompt `tokens` that ends at a block boundary, is at
  // most tokens.size() - 1 long (the last prompt token is always computed, for its logits)
  // and, on KDA models, has a KDA snapshot at its end. Empty when nothing matches.
  PrefixHit find_longest_prefix(std::span<const int32_t> tokens, const PrefixKey& key) const;
  // Takes references on the hit's blocks and snapshot (BlockPool::touch).
  void acquire(const PrefixHit& hit);

  // Registers a request's full token blocks (blocks[i] holds the block hashed hashes[i]).
  // A block whose hash is already cached elsewhere stays uncached (the first copy wins).
  void cache_full_blocks(std::span<const BlockHash> hashes, std::span<const int32_t> blocks);

  // Whether the policy keeps a snapshot at boundary k for a prompt of prompt_len tokens.
  bool should_snapshot(int64_t boundary, int64_t prompt_len) const;
  // A new snapshot block (reference count 1) for the boundary ending in the block hashed
  // `block_hash`, registered in the cache: the caller copies the KDA state into it, then
  // frees it. nullopt when a snapshot for that boundary exists already, when the model has
  // no KDA layers, or when no block is free now. It is findable at once: the engine must
  // enqueue the copy into it before any later restore from it (same stream: in order).
  std::optional<int32_t> store_snapshot(const BlockHash& block_hash);
  bool has_snapshot(const BlockHash& block_hash) const;

 private:
  BlockPool& pool_;
  int64_t tokens_per_block_;
  bool kda_snapshots_;
  SnapshotPolicy policy_;
};

}  // namespace hyserve
