// KvCache: the packed hybrid block cache in device memory (DESIGN.md "The packed hybrid
// block cache"): num_blocks rows of plan.row_bytes, laid out by a CachePlan. A row is either
// a token block (the latent and index-key pages of every full-attention layer) or a KDA
// state block (one request's conv and recurrent states of every KDA layer); the block pool
// (kv/block_pool.h) decides which. This class only owns the bytes and turns (block, layer)
// into addresses; what a row holds is the engine's business.
//
//   pool:  | row 0 | row 1 | ... | row num_blocks-1 | scratch |   row = plan.row_bytes bytes
//   latent page of `layer` in block b:     base + b * row_bytes + page(layer).latent_offset
//   index-key page (FP8):                  [block_size x index_head_dim codes | block_size fp32
//   scales] KDA conv state of `layer` in row b:    [3 (q, k, v), conv_kernel - 1, H*K] fp32 KDA
//   recurrent state:                   [H, K, K] fp32
#pragma once

#include <cstdint>

#include "backend/device.h"
#include "core/paged.h"
#include "kv/cache_plan.h"

namespace hyserve {

class KvCache {
 public:
  KvCache(Device& device, CachePlan plan, int64_t num_blocks);

  const CachePlan& plan() const { return plan_; }
  int64_t num_blocks() const { return num_blocks_; }
  // One more row after the pool's: padding rows of a captured decode batch read it and
  // write their KDA state there. The block pool never hands it out.
  int32_t scratch_block() const { return static_cast<int32_t>(num_blocks_); }
  int64_t block_size() const { return plan_.block_size; }
  size_t num_bytes() const { return pool_.size(); }
  uint8_t* base() const { return pool_.as<uint8_t>(); }

  // Page of block 0 of full-attention layer `layer`: the base kernels index with
  // PagedRows (core/paged.h).
  float* latent_page(int64_t layer) const;
  uint8_t* index_page(int64_t layer) const;
  // FP8 index keys: the fp32 scales follow the block_size codes rows inside the page.
  float* index_scale_page(int64_t layer) const;
  // PagedRows over a block table (in device memory) for this pool.
  PagedRows pages(const int32_t* block_table) const;

  // KDA state tensors of layer `layer` in state row `block`; which: 0 q, 1 k, 2 v.
  float* kda_conv_state(int32_t block, int64_t layer, int which) const;
  float* kda_recurrent_state(int32_t block, int64_t layer) const;

  // Stream-ordered row operations: a fresh request's state (zeros), KDA snapshots and
  // their restore (row copies).
  void zero_block(int32_t block);
  void copy_block(int32_t dst, int32_t src);

  // Makes the pool num_blocks rows long, keeping the rows it had (a standalone sequence
  // growing its private cache; the engine's pool never grows).
  void grow(int64_t num_blocks);

  // Sleep mode: release() frees the pool's memory (its contents are forgotten); restore()
  // allocates it again, zeroed, usually at another address. Nothing may read the cache between.
  void release();
  void restore();
  bool resident() const { return pool_.data() != nullptr; }

 private:
  void check_block(int32_t block) const;  // 0 <= block <= num_blocks (the scratch row)
  uint8_t* row(int32_t block) const;
  uint64_t address() const;

  Device* device_;
  CachePlan plan_;
  int64_t num_blocks_;
  DeviceAllocation pool_;
};

}  // namespace hyserve
