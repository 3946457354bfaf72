// KvCacheManager: the scheduler's view of the packed hybrid block cache. It owns the
// BlockPool, the optional PrefixCache and, per admitted request, a BlockTable of token blocks
// plus (models with KDA layers) one KDA state block allocated at admission. It only counts:
// the model runner moves the bytes, following the instructions the scheduler passes on.
//
// A step of one request, as the scheduler drives it:
//
//   get_computed_blocks(r)            prefix lookup at admission -> num cached tokens
//   allocate_slots(r, n, cached)      all-or-nothing; false = does not fit now
//   begin_step()                      a step's scheduling starts
//   cache_full_blocks(r, end)         after every scheduling decision of the step is final:
//                                     registers r's full blocks, maybe a KDA snapshot to fill
//   ... the runner executes the step ...
//   resolve_placeholders(r)           r's sampled tokens are known (update_from_output)
//   end_step()                        drops the references held for the oldest step not
//                                     ended (steps may overlap: asynchronous scheduling)
//   free(r)                           finished, aborted or preempted
//
// Blocks are registered in the prefix cache when the step that computes them is scheduled,
// before the runner has written them (as vLLM v1 does): any later step that reuses them runs
// after this one on the same stream. A block whose last token is still a placeholder is
// registered by the next step's call, when the token is known.
//
// KDA snapshots. A KDA layer cannot rewind, so a prefix hit at boundary k (after k full
// blocks) also needs the KDA state after exactly k * tokens_per_block tokens. The runner can
// only copy the state a request has at the end of a step, so the scheduler ends a prefill
// chunk at the next boundary where the policy wants a snapshot that does not exist yet
// (limit_to_snapshot_boundary); cache_full_blocks then returns "after this step, copy r's
// state into block B". Blocks used during a step (the snapshot a hit restores from, snapshots
// being filled) keep a reference until end_step(), so nothing scheduled in the same step can
// evict and reuse them before the runner's copies have run.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/cache_plan.h"
#include "kv/prefix_cache.h"

namespace hyserve {

struct KvCacheConfig {
  int32_t num_blocks = 0;       // rows of the pool (MemoryPlan::num_blocks)
  int64_t block_size = 0;       // token slots per row on one GPU
  int64_t dcp = 1;              // one block id covers block_size * dcp positions
  bool has_kda_layers = false;  // one KDA state block per running request
  bool enable_prefix_caching = false;
  SnapshotPolicy snapshot_policy;              // KDA models with prefix caching
  std::vector<std::string> prefix_extra_keys;  // e.g. the served model id

  int64_t tokens_per_block() const { return block_size * dcp; }
};

// block_size, dcp and has_kda_layers from the plan; the rest at their defaults.
KvCacheConfig make_kv_cache_config(const CachePlan& plan, int32_t num_blocks);

// "After this step, copy request_id's KDA state (row state_block) into row snapshot_block":
// the state after exactly num_tokens tokens, which is where the request's step ends.
struct SnapshotCopy {
  std::string request_id;
  int32_t state_block = 0;
  int32_t snapshot_block = 0;
  int64_t num_tokens = 0;
};

// Prefix-cache lookups, counted once per admission (vllm:prefix_cache_queries / _hits).
struct PrefixCacheStats {
  int64_t num_requests = 0;
  int64_t num_query_tokens = 0;  // the request's num_tokens() at admission
  int64_t num_hit_tokens = 0;    // of those, tokens served from the cache
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  const BlockPool& pool() const { return pool_; }
  // Token blocks a sequence of num_tokens positions needs.
  int64_t blocks_for_tokens(int64_t num_tokens) const;
  // Blocks one request needs at once when num_tokens of its positions are computed: token
  // blocks and its KDA state block.
  int64_t blocks_for_request(int64_t num_tokens) const;

  // Prefix lookup for a request about to be admitted (num_computed_tokens == 0): the number
  // of its leading tokens already in the cache, a multiple of tokens_per_block, at most
  // num_tokens() - 1 and, on KDA models, at a boundary with a snapshot. 0 without prefix
  // caching, and for a request that asks for prompt logprobs. The hit is remembered for the
  // allocate_slots call that follows; any other call that changes the pool forgets it.
  int64_t get_computed_blocks(const Request& request);

  // Makes room for tokens [num_computed_tokens, num_computed_tokens + num_cached_tokens +
  // num_new_tokens). At admission, num_cached_tokens is 0 or the value get_computed_blocks just
  // returned for this request: those blocks are shared, and the KDA state block is allocated.
  // false when the blocks are not free now; nothing changes then.
  bool allocate_slots(const Request& request, int64_t num_new_tokens, int64_t num_cached_tokens);

  // Ends a step of `num_new_tokens` tokens (from num_computed_tokens) early at the first block
  // boundary strictly inside it where the snapshot policy wants a KDA snapshot that is not
  // cached yet. Unchanged without KDA layers or prefix caching.
  int64_t limit_to_snapshot_boundary(const Request& request, int64_t num_new_tokens);

  // Speculative decoding: how many of num_drafts drafts a decode step of the request (its last
  // known token and the drafts) may take so that it does not pass a boundary where the policy
  // wants a KDA snapshot that is not cached yet (a step with drafts takes none; boundaries past
  // the known tokens count as wanted when the policy wants them): 0 when a plain decode step
  // ends on one, else the drafts end one token before it, and a plain step reaches it later.
  int64_t drafts_before_snapshot(const Request& request, int64_t num_drafts);

  // Registers the request's full blocks of tokens [0, num_tokens) in the prefix cache, where
  // num_tokens is where its scheduled step ends. When the policy wants a snapshot at
  // boundary num_tokens and none exists, allocates one (best effort: none when the pool is
  // full) and returns the copy the runner must make after the step.
  // allow_snapshot false: blocks only (a speculative step, whose KDA state at its end is
  // not known when it is scheduled).
  std::optional<SnapshotCopy> cache_full_blocks(const Request& request, int64_t num_tokens,
                                                bool allow_snapshot = true);

  // A step's scheduling begins: blocks held from now are released by its end_step().
  void begin_step();
  // Releases the references held for the oldest step not ended (the one whose results the
  // scheduler is applying).
  void end_step();
  // The request's tokens that were placeholders when cache_full_blocks ran are known now:
  // a KDA snapshot taken at a boundary that ended in one gets its prefix-cache name (unless
  // another request cached that snapshot first).
  void resolve_placeholders(const Request& request);

  // Returns the request's blocks to the pool, last block first; cached ones stay revivable.
  // A request with no blocks is fine (e.g. aborted while waiting).
  void free(const Request& request);

  // The request's block table (token blocks and KDA state block); nullptr when it has none.
  const BlockTable* block_table(const std::string& request_id) const;
  // The snapshot block whose KDA state the runner copies into the request's state block
  // before this step: set at an admission with a prefix hit, until end_step().
  std::optional<int32_t> state_restore_block(const std::string& request_id) const;
  // state_restore_block, once: the restore belongs to the admission step alone (a next step
  // may be scheduled before this one's end_step).
  std::optional<int32_t> take_state_restore_block(const std::string& request_id);

  // Fraction of the pool referenced now (vllm:kv_cache_usage_perc); cached free blocks count
  // as free.
  double usage() const;
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }

  // vLLM's reset_prefix_cache: every cached block and KDA snapshot is forgotten (nothing
  // admitted from now on hits them). Requests running keep their blocks. Returns the number of
  // entries dropped (0 without prefix caching).
  int32_t reset_prefix_cache();
  // The model's weights changed (a weight update): from now on requests are hashed under
  // this generation, so no block computed with other weights is ever a hit, including the
  // blocks that requests admitted before the change register later. 0 at start.
  void set_weights_generation(int64_t generation) { weights_generation_ = generation; }

 private:
  struct PendingSnapshot {
    int32_t block = 0;
    int64_t boundary = 0;  // full blocks before it
  };
  struct RequestBlocks {
    BlockTable table;
    std::vector<BlockHash> hashes{};        // of the request's first hashes.size() full blocks
    int64_t num_cached_blocks = 0;          // leading table blocks registered in the prefix cache
    std::optional<int32_t> restore_from{};  // snapshot of the prefix hit, until end_step()
    // A snapshot filled after a step whose boundary ended in a placeholder, named by
    // resolve_placeholders.
    std::optional<PendingSnapshot> pending_snapshot{};
    // The weights generation the request was admitted under: its hashes stay in it.
    int64_t weights_generation = 0;
  };
  struct PendingHit {
    std::string request_id;
    PrefixHit hit;
  };

  PrefixKey prefix_key(const Request& request, int64_t weights_generation) const;
  RequestBlocks& blocks_of(const Request& request);
  const std::vector<BlockHash>& hashes_up_to(const Request& request, RequestBlocks& rb,
                                             int64_t num_blocks);
  bool snapshot_wanted(const Request& request, RequestBlocks& rb, int64_t boundary);

  KvCacheConfig config_;
  BlockPool pool_;
  std::optional<PrefixCache> prefix_cache_;
  std::unordered_map<std::string, RequestBlocks> requests_;
  std::optional<PendingHit> pending_hit_;
  void hold_for_step(int32_t block);
  // Blocks referenced until their step's end_step(), oldest step first.
  std::deque<std::vector<int32_t>> held_for_step_;
  PrefixCacheStats stats_;
  int64_t weights_generation_ = 0;
};

}  // namespace hyserve
