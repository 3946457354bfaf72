// CachePlan: the row layout of the packed hybrid block cache (DESIGN.md "The packed hybrid
// block cache"), planned from a model's CacheSpec. How many rows fit on one GPU is the
// memory plan's (memory_plan.h).
//
// One pool of rows per GPU. A row ("block") serves one of two purposes:
//
//   token block, block_size slots of every full-attention layer, back to back:
//   | L3 latent (bs*576 B) | L3 index keys (bs*132 B) | L7 latent | L7 index keys | ... | pad |
//   ^ row start          ^ index_offset               each page start 256-B aligned
//
//   KDA state block, one request's state of every KDA layer, fp32:
//   | L0 conv | L0 recurrent S | L1 conv | L1 recurrent S | ... |        unused          |
//
// block_size is the smallest power of two >= min_block_size whose token row is at least as
// large as one request's KDA state, so a state always takes exactly one row.
//
// Page alignment is 256 bytes: every page (and every KDA tensor) starts on a 256-B boundary
// and row_bytes is a multiple of 256, so with a 256-B aligned pool base every page address is
// 256-B aligned (TMA / 128-B coalesced loads, bulk copies). The padding this costs is counted
// in `padding_bytes`; with block_size a multiple of 64 it is zero for every cache dtype of
// MODEL.md §6 (576, 656, 352, 1152, 132 and 68 B per token times 64 are multiples of 256).
//
// min_block_size defaults to 64: KDA prefill runs in chunks of 64 tokens, so every block
// boundary (where prefix-cache snapshots of the KDA state are taken) is a chunk boundary,
// and 64 keeps every page padding-free (above).
//
// Parallel layout (DESIGN.md "Parallelism"): TP splits KDA heads, so the KDA state per GPU
// holds linear_num_heads / tp heads; MLA latents and index keys are replicated under TP.
// DCP (dcp ranks, reusing the TP group: tp % dcp == 0) splits tokens: position p lives on
// rank p % dcp at local slot p / dcp. Every rank's pool has the same block ids in lock-step,
// so one block id covers tokens_per_block() = block_size * dcp positions of a sequence
// (block_size on each rank), and a KDA state block exists on every rank (its head shard).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/cache_format.h"
#include "kv/cache_spec.h"

namespace hyserve {

inline constexpr int64_t kCachePageAlignBytes = 256;

// The pages of one full-attention layer inside a token row (offsets from the row start).
struct CachePage {
  int64_t layer = 0;  // model layer index
  int64_t latent_offset = 0;
  int64_t latent_bytes = 0;  // block_size * latent bytes per token
  int64_t index_offset = 0;
  int64_t index_bytes = 0;  // block_size * index-key bytes per token; 0 without indexer
  // Inside the index page: [block_size x code bytes | block_size x scale bytes].
  int64_t index_code_bytes = 0;   // per token
  int64_t index_scale_bytes = 0;  // per token (0 for fp32 keys)
};

// The tensors of one KDA layer inside a state row (offsets from the row start), fp32.
struct KdaStatePage {
  int64_t layer = 0;        // model layer index
  int64_t conv_offset = 0;  // [3 (q,k,v), conv_kernel - 1, heads_per_gpu * head_dim]
  int64_t conv_bytes = 0;
  int64_t recurrent_offset = 0;  // [heads_per_gpu, head_dim (K), head_dim (V)]
  int64_t recurrent_bytes = 0;
};

struct CachePlanOptions {
  LatentCacheDtype latent = LatentCacheDtype::kFp8;
  IndexCacheDtype index = IndexCacheDtype::kFp8;
  int64_t tp = 1;
  int64_t dcp = 1;
  int64_t min_block_size = 64;  // power of two
};

struct CachePlan {
  CachePlanOptions options;
  int64_t block_size = 0;               // token slots per row on one GPU (power of two)
  int64_t row_bytes = 0;                // multiple of kCachePageAlignBytes
  int64_t token_bytes_per_slot = 0;     // sum of every layer's latent + index bytes per token
  int64_t padding_bytes = 0;            // alignment padding inside a token row
  std::vector<CachePage> pages;         // one per full-attention layer, in layer order
  int64_t kda_state_bytes = 0;          // one request's KDA state on one GPU (incl. alignment)
  int64_t kda_state_rows = 0;           // rows one request's KDA state takes: 1 (or 0 without KDA)
  std::vector<KdaStatePage> kda_pages;  // one per KDA layer, in layer order
  int64_t kda_heads_per_gpu = 0;
  std::vector<int32_t> layer_page;  // [num_layers]: index into pages or kda_pages

  // Sequence positions one block id covers across the DCP group.
  int64_t tokens_per_block() const { return block_size * options.dcp; }
  // Token blocks a sequence of `num_tokens` positions needs.
  int64_t blocks_for_tokens(int64_t num_tokens) const;
  // The page of full-attention layer `layer` (model layer index); throws for a KDA layer.
  const CachePage& page(int64_t layer) const;
  // The state tensors of KDA layer `layer` (model layer index); throws for an MLA layer.
  const KdaStatePage& kda_page(int64_t layer) const;
};

CachePlan plan_cache(const CacheSpec& spec, const CachePlanOptions& options);

// When a request's KDA state is kept as a prefix-cache snapshot (one row each), counting
// boundaries k = 1, 2, ... (the boundary after k full blocks of tokens_per_block positions).
struct SnapshotPolicy {
  int64_t every_blocks = 0;   // also every N-th boundary (k % N == 0); 0: none
  bool at_prompt_end = true;  // the last boundary inside the prompt: k = prompt_len / tpb
  bool should_snapshot(int64_t boundary, int64_t prompt_full_blocks) const;
  // Snapshots one sequence with `num_full_blocks` full blocks keeps (prompt = sequence).
  int64_t num_snapshots(int64_t num_full_blocks) const;
};

// Human-readable layout (offset and width of every page) for `hyserve info`.
std::string format_cache_plan(const CachePlan& plan);

}  // namespace hyserve
