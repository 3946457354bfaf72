#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace hyserve {

KvCacheConfig make_kv_cache_config(const CachePlan& plan, int32_t num_blocks) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = plan.block_size;
  c.dcp = plan.options.dcp;
  c.has_kda_layers = plan.kda_state_rows > 0;
  return c;
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.num_blocks) {
  CHECK(config.num_blocks >= 1, "num_blocks must be >= 1, got ", config.num_blocks);
  CHECK(config.block_size >= 1 && config.dcp >= 1, "block_size and dcp must be >= 1, got ",
        config.block_size, ", ", config.dcp);
  if (config.enable_prefix_caching) {
    prefix_cache_.emplace(pool_, config.tokens_per_block(), config.has_kda_layers,
                          config.snapshot_policy);
  }
}

int64_t KvCacheManager::blocks_for_tokens(int64_t num_tokens) const {
  const int64_t tpb = config_.tokens_per_block();
  return (num_tokens + tpb - 1) / tpb;
}

int64_t KvCacheManager::blocks_for_request(int64_t num_tokens) const {
  return blocks_for_tokens(num_tokens) + (config_.has_kda_layers ? 1 : 0);
}

PrefixKey KvCacheManager::prefix_key(const Request& request, int64_t weights_generation) const {
  PrefixKey key{request.cache_salt, config_.prefix_extra_keys};
  // Blocks computed with other weights never match (weight updates while serving).
  if (weights_generation > 0)
    key.extra_keys.push_back("weights:" + std::to_string(weights_generation));
  // A LoRA adapter's blocks are its own: no request with another adapter, or none, or a
  // replaced one (another generation in the key) reads them.
  if (request.lora != nullptr) key.extra_keys.push_back(request.lora_key);
  return key;
}

KvCacheManager::RequestBlocks& KvCacheManager::blocks_of(const Request& request) {
  auto it = requests_.find(request.id);
  if (it == requests_.end()) {
    it = requests_.emplace(request.id, RequestBlocks{BlockTable(config_.block_size, config_.dcp)})
             .first;
    it->second.weights_generation = weights_generation_;
  }
  return it->second;
}

const std::vector<BlockHash>& KvCacheManager::hashes_up_to(const Request& request,
                                                           RequestBlocks& rb, int64_t num_blocks) {
  if (static_cast<int64_t>(rb.hashes.size()) < num_blocks) {
    const auto tokens = request.tokens(0, num_blocks * config_.tokens_per_block());
    rb.hashes = prefix_cache_->hash_blocks(tokens, prefix_key(request, rb.weights_generation));
  }
  return rb.hashes;
}

int64_t KvCacheManager::get_computed_blocks(const Request& request) {
  CHECK(request.num_computed_tokens == 0, "get_computed_blocks: request ", request.id,
        " already has ", request.num_computed_tokens, " computed tokens");
  pending_hit_.reset();
  // Prompt logprobs need every prompt position computed, so such a request reads nothing
  // from the cache (as vLLM does); its blocks are still cached for others.
  if (!prefix_cache_ || request.sampling_params.prompt_logprobs) return 0;
  const auto tokens = request.tokens(0, request.num_tokens());
  PrefixHit hit =
      prefix_cache_->find_longest_prefix(tokens, prefix_key(request, weights_generation_));
  const int64_t num_cached = hit.num_cached_tokens;
  pending_hit_ = PendingHit{request.id, std::move(hit)};
  return num_cached;
}

bool KvCacheManager::allocate_slots(const Request& request, int64_t num_new_tokens,
                                    int64_t num_cached_tokens) {
  CHECK(num_new_tokens >= 0 && num_cached_tokens >= 0, "allocate_slots: request ", request.id,
        ": negative token count (", num_new_tokens, " new, ", num_cached_tokens, " cached)");
  const int64_t end = request.num_computed_tokens + num_cached_tokens + num_new_tokens;
  // (Drafts to verify take slots after the request's tokens.)
  const int64_t limit = request.num_scheduled_tokens() + std::ssize(request.spec_token_ids);
  CHECK(end <= limit, "allocate_slots: request ", request.id, " has ",
        request.num_scheduled_tokens(), " tokens and ", request.spec_token_ids.size(),
        " drafts, asked for slots up to ", end);
  std::optional<PendingHit> pending = std::move(pending_hit_);
  pending_hit_.reset();
  const auto existing = requests_.find(request.id);
  const bool admission = existing == requests_.end() || (existing->second.table.num_blocks() == 0 &&
                                                         !existing->second.table.state_block());

  const PrefixHit* hit = nullptr;
  if (num_cached_tokens > 0) {
    CHECK(admission && request.num_computed_tokens == 0, "allocate_slots: request ", request.id,
          " passes cached tokens after admission");
    CHECK(pending && pending->request_id == request.id &&
              pending->hit.num_cached_tokens == num_cached_tokens,
          "allocate_slots: request ", request.id, " passes ", num_cached_tokens,
          " cached tokens that the last get_computed_blocks did not return");
    hit = &pending->hit;
  }
  RequestBlocks& rb = blocks_of(request);

  const int64_t num_hit_blocks = hit ? static_cast<int64_t>(hit->blocks.size()) : 0;
  const int64_t num_new_blocks = blocks_for_tokens(end) - rb.table.num_blocks() - num_hit_blocks;
  const int64_t num_state_blocks = admission && config_.has_kda_layers ? 1 : 0;
  // Hit blocks nobody references sit in the free list: reviving them takes them out of it.
  int64_t num_revived = 0;
  if (hit) {
    for (int32_t b : hit->blocks) num_revived += pool_.ref_count(b) == 0 ? 1 : 0;
    if (hit->snapshot_block) num_revived += pool_.ref_count(*hit->snapshot_block) == 0 ? 1 : 0;
  }
  const int64_t num_needed = std::max<int64_t>(num_new_blocks, 0) + num_state_blocks;
  if (num_needed > pool_.num_free() - num_revived) {
    if (admission) requests_.erase(request.id);
    return false;
  }

  if (hit) {
    prefix_cache_->acquire(*hit);
    rb.table.append(hit->blocks);
    rb.num_cached_blocks = num_hit_blocks;
    if (hit->snapshot_block) hold_for_step(*hit->snapshot_block);
    rb.restore_from = hit->snapshot_block;
  }
  if (num_state_blocks > 0) rb.table.set_state_block(pool_.allocate(1)->front());
  if (num_new_blocks > 0) rb.table.append(*pool_.allocate(static_cast<int32_t>(num_new_blocks)));
  if (admission && prefix_cache_) {
    ++stats_.num_requests;
    stats_.num_query_tokens += request.num_tokens();
    stats_.num_hit_tokens += num_cached_tokens;
  }
  return true;
}

bool KvCacheManager::snapshot_wanted(const Request& request, RequestBlocks& rb, int64_t boundary) {
  if (!prefix_cache_->should_snapshot(boundary, request.num_prompt_tokens())) return false;
  return !prefix_cache_->has_snapshot(hashes_up_to(request, rb, boundary)[boundary - 1]);
}

int64_t KvCacheManager::limit_to_snapshot_boundary(const Request& request, int64_t num_new_tokens) {
  if (!prefix_cache_ || !config_.has_kda_layers) return num_new_tokens;
  const int64_t tpb = config_.tokens_per_block();
  const int64_t begin = request.num_computed_tokens;
  const int64_t end = begin + num_new_tokens;
  RequestBlocks& rb = blocks_of(request);
  for (int64_t k = begin / tpb + 1; k * tpb < end; ++k) {
    if (snapshot_wanted(request, rb, k)) return k * tpb - begin;
  }
  return num_new_tokens;
}

int64_t KvCacheManager::drafts_before_snapshot(const Request& request, int64_t num_drafts) {
  if (!prefix_cache_ || !config_.has_kda_layers || num_drafts == 0) return num_drafts;
  const int64_t tpb = config_.tokens_per_block();
  const int64_t begin = request.num_computed_tokens;
  const int64_t plain_end = begin + 1;
  RequestBlocks& rb = blocks_of(request);
  for (int64_t k = begin / tpb + 1; k * tpb <= plain_end + num_drafts; ++k) {
    const int64_t boundary = k * tpb;
    const bool wanted = boundary <= request.num_tokens()
                            ? snapshot_wanted(request, rb, k)
                            : prefix_cache_->should_snapshot(k, request.num_prompt_tokens());
    if (!wanted) continue;
    return boundary == plain_end ? 0 : std::min(num_drafts, boundary - plain_end - 1);
  }
  return num_drafts;
}

std::optional<SnapshotCopy> KvCacheManager::cache_full_blocks(const Request& request,
                                                              int64_t num_tokens,
                                                              bool allow_snapshot) {
  pending_hit_.reset();
  if (!prefix_cache_) return std::nullopt;
  const auto it = requests_.find(request.id);
  CHECK(it != requests_.end(), "cache_full_blocks: request ", request.id, " holds no blocks");
  RequestBlocks& rb = it->second;
  const int64_t tpb = config_.tokens_per_block();
  const int64_t num_full = num_tokens / tpb;
  CHECK(num_full <= rb.table.num_blocks() && num_tokens <= request.num_scheduled_tokens(),
        "cache_full_blocks: request ", request.id, " has no slots for ", num_tokens, " tokens");
  // Only blocks of known tokens have a hash; one that ends in a placeholder is registered by
  // a later step's call.
  const int64_t num_known_full = std::min(num_tokens, request.num_tokens()) / tpb;
  if (num_known_full > rb.num_cached_blocks) {
    const auto& hashes = hashes_up_to(request, rb, num_known_full);
    const auto first = static_cast<size_t>(rb.num_cached_blocks);
    const auto count = static_cast<size_t>(num_known_full) - first;
    prefix_cache_->cache_full_blocks(std::span(hashes).subspan(first, count),
                                     rb.table.blocks().subspan(first, count));
    rb.num_cached_blocks = num_known_full;
  }
  if (!allow_snapshot || num_full == 0 || num_tokens % tpb != 0 || !config_.has_kda_layers) {
    return std::nullopt;
  }
  if (num_tokens > request.num_tokens()) {
    // The boundary's last token is a placeholder: the state is copied after the step into
    // a block of its own, which resolve_placeholders names once the token is known.
    if (rb.pending_snapshot ||
        !prefix_cache_->should_snapshot(num_full, request.num_prompt_tokens()))
      return std::nullopt;
    auto block = pool_.allocate(1);
    if (!block) return std::nullopt;
    hold_for_step(block->front());
    rb.pending_snapshot = PendingSnapshot{block->front(), num_full};
    return SnapshotCopy{request.id, *rb.table.state_block(), block->front(), num_tokens};
  }
  if (!snapshot_wanted(request, rb, num_full)) return std::nullopt;
  const auto snapshot = prefix_cache_->store_snapshot(rb.hashes[num_full - 1]);
  if (!snapshot) return std::nullopt;
  hold_for_step(*snapshot);
  return SnapshotCopy{request.id, *rb.table.state_block(), *snapshot, num_tokens};
}

void KvCacheManager::resolve_placeholders(const Request& request) {
  const auto it = requests_.find(request.id);
  if (it == requests_.end() || !it->second.pending_snapshot) return;
  RequestBlocks& rb = it->second;
  const PendingSnapshot p = *rb.pending_snapshot;
  if (request.num_tokens() < p.boundary * config_.tokens_per_block()) return;
  rb.pending_snapshot.reset();
  const BlockHash key =
      PrefixCache::snapshot_key(hashes_up_to(request, rb, p.boundary)[p.boundary - 1]);
  // The block stays held until its step ends; cached, it is then revivable like any snapshot.
  if (!pool_.lookup(key)) pool_.cache_block(p.block, key);
}

void KvCacheManager::begin_step() {
  held_for_step_.emplace_back();
}

void KvCacheManager::hold_for_step(int32_t block) {
  if (held_for_step_.empty()) held_for_step_.emplace_back();
  held_for_step_.back().push_back(block);
}

void KvCacheManager::end_step() {
  pending_hit_.reset();
  if (!held_for_step_.empty()) {
    pool_.free(held_for_step_.front());
    held_for_step_.pop_front();
  }
  for (auto& [id, rb] : requests_) rb.restore_from.reset();
}

int32_t KvCacheManager::reset_prefix_cache() {
  if (!prefix_cache_) return 0;
  pending_hit_.reset();
  return pool_.drop_hashes();
}

void KvCacheManager::free(const Request& request) {
  pending_hit_.reset();
  const auto it = requests_.find(request.id);
  if (it == requests_.end()) return;
  const BlockTable& table = it->second.table;
  if (table.state_block()) pool_.free(std::vector<int32_t>{*table.state_block()});
  pool_.free(table.blocks());
  requests_.erase(it);
}

const BlockTable* KvCacheManager::block_table(const std::string& request_id) const {
  const auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : &it->second.table;
}

std::optional<int32_t> KvCacheManager::state_restore_block(const std::string& request_id) const {
  const auto it = requests_.find(request_id);
  return it == requests_.end() ? std::nullopt : it->second.restore_from;
}

std::optional<int32_t> KvCacheManager::take_state_restore_block(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  return it == requests_.end() ? std::nullopt
                               : std::exchange(it->second.restore_from, std::nullopt);
}

double KvCacheManager::usage() const {
  return 1.0 - static_cast<double>(pool_.num_free()) / pool_.num_blocks();
}

}  // namespace hyserve
