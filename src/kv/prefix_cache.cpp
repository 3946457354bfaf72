#include "kv/prefix_cache.h"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/error.h"

namespace hyserve {
namespace {

void append_bytes(std::vector<unsigned char>& out, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  out.insert(out.end(), p, p + size);
}

void append_string(std::vector<unsigned char>& out, const std::string& s) {
  const uint64_t size = s.size();
  append_bytes(out, &size, sizeof size);
  append_bytes(out, s.data(), s.size());
}

void append_hash(std::vector<unsigned char>& out, const BlockHash& h) {
  append_bytes(out, &h.low, sizeof h.low);
  append_bytes(out, &h.high, sizeof h.high);
}

BlockHash xxh128(const std::vector<unsigned char>& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.low64, h.high64};
}

BlockHash root_hash(const PrefixKey& key) {
  std::vector<unsigned char> bytes;
  const std::string tag = "hyserve prefix v1";
  append_string(bytes, tag);
  append_string(bytes, key.cache_salt);
  const uint64_t num_extra = key.extra_keys.size();
  append_bytes(bytes, &num_extra, sizeof num_extra);
  for (const auto& k : key.extra_keys) append_string(bytes, k);
  return xxh128(bytes);
}

}  // namespace

PrefixCache::PrefixCache(BlockPool& pool, int64_t tokens_per_block, bool kda_snapshots,
                         SnapshotPolicy policy)
    : pool_(pool),
      tokens_per_block_(tokens_per_block),
      kda_snapshots_(kda_snapshots),
      policy_(policy) {
  CHECK(tokens_per_block >= 1, "tokens_per_block must be >= 1, got ", tokens_per_block);
  CHECK(policy.every_blocks >= 0, "snapshot interval must be >= 0, got ", policy.every_blocks);
}

std::vector<BlockHash> PrefixCache::hash_blocks(std::span<const int32_t> tokens,
                                                const PrefixKey& key) const {
  const size_t tpb = static_cast<size_t>(tokens_per_block_);
  const size_t n = tokens.size() / tpb;
  std::vector<BlockHash> hashes;
  hashes.reserve(n);
  BlockHash parent = root_hash(key);
  std::vector<unsigned char> bytes;
  for (size_t i = 0; i < n; ++i) {
    bytes.clear();
    append_hash(bytes, parent);
    append_bytes(bytes, tokens.data() + i * tpb, tpb * sizeof(int32_t));
    parent = xxh128(bytes);
    hashes.push_back(parent);
  }
  return hashes;
}

BlockHash PrefixCache::snapshot_key(const BlockHash& block_hash) {
  std::vector<unsigned char> bytes;
  append_hash(bytes, block_hash);
  append_string(bytes, "kda state");
  return xxh128(bytes);
}

PrefixHit PrefixCache::find_longest_prefix(std::span<const int32_t> tokens,
                                           const PrefixKey& key) const {
  PrefixHit hit;
  if (tokens.empty()) return hit;
  const size_t max_blocks = (tokens.size() - 1) / static_cast<size_t>(tokens_per_block_);
  const auto hashes = hash_blocks(tokens.first(max_blocks * tokens_per_block_), key);
  std::vector<int32_t> chain;
  size_t best = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto block = pool_.lookup(hashes[i]);
    if (!block) break;
    chain.push_back(*block);
    if (!kda_snapshots_) {
      best = i + 1;
      continue;
    }
    if (const auto snapshot = pool_.lookup(snapshot_key(hashes[i]))) {
      best = i + 1;
      hit.snapshot_block = snapshot;
    }
  }
  chain.resize(best);
  hit.blocks = std::move(chain);
  hit.num_cached_tokens = static_cast<int64_t>(best) * tokens_per_block_;
  return hit;
}

void PrefixCache::acquire(const PrefixHit& hit) {
  pool_.touch(hit.blocks);
  if (hit.snapshot_block) pool_.touch(std::span<const int32_t>(&*hit.snapshot_block, 1));
}

void PrefixCache::cache_full_blocks(std::span<const BlockHash> hashes,
                                    std::span<const int32_t> blocks) {
  CHECK(hashes.size() == blocks.size(), "cache_full_blocks: ", hashes.size(), " hashes for ",
        blocks.size(), " blocks");
  for (size_t i = 0; i < hashes.size(); ++i) pool_.cache_block(blocks[i], hashes[i]);
}

bool PrefixCache::should_snapshot(int64_t boundary, int64_t prompt_len) const {
  return kda_snapshots_ && policy_.should_snapshot(boundary, prompt_len / tokens_per_block_);
}

std::optional<int32_t> PrefixCache::store_snapshot(const BlockHash& block_hash) {
  if (!kda_snapshots_) return std::nullopt;
  const BlockHash key = snapshot_key(block_hash);
  if (pool_.lookup(key)) return std::nullopt;
  auto blocks = pool_.allocate(1);
  if (!blocks) return std::nullopt;
  const int32_t block = blocks->front();
  pool_.cache_block(block, key);
  return block;
}

bool PrefixCache::has_snapshot(const BlockHash& block_hash) const {
  return pool_.lookup(snapshot_key(block_hash)).has_value();
}

}  // namespace hyserve
