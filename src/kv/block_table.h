// BlockTable: one request's blocks, the slot of each of its token positions, and the
// translation of block ids into the byte addresses kernels read (pure arithmetic).
//
// Position p of a sequence lives on DCP rank p % dcp, at local slot q = p / dcp (the rule of
// core/dcp_position.h):
//
//   block = blocks[q / block_size], offset = q % block_size
//
// so block id i covers positions [i * block_size * dcp, (i + 1) * block_size * dcp) spread
// over the ranks. Addresses within the pool (base = start of the pool on this GPU):
//
//   row(block)          = base + block * row_bytes
//   latent page         = row(block) + page(layer).latent_offset
//   latent of one token = latent page + offset * latent bytes per token   (same for index keys)
//   KDA conv state      = row(state_block) + kda_page(layer).conv_offset  (recurrent alike)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/cache_plan.h"

namespace hyserve {

struct Slot {
  int32_t rank = 0;    // DCP rank that stores the position
  int32_t block = 0;   // block id (row)
  int32_t offset = 0;  // token slot within the block, [0, block_size)
};

class BlockTable {
 public:
  BlockTable(int64_t block_size, int64_t dcp = 1);

  void append(std::span<const int32_t> blocks);
  std::span<const int32_t> blocks() const { return blocks_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Positions the table's blocks hold over the DCP group.
  int64_t capacity_tokens() const { return num_blocks() * block_size_ * dcp_; }

  // Where position `token_pos` is stored; it must be < capacity_tokens().
  Slot slot(int64_t token_pos) const;
  // The flat slot index block * block_size + offset on the owning rank (kernel slot mapping).
  int64_t slot_index(int64_t token_pos) const;

  void set_state_block(int32_t block) { state_block_ = block; }
  std::optional<int32_t> state_block() const { return state_block_; }  // KDA state row

 private:
  int64_t block_size_;
  int64_t dcp_;
  std::vector<int32_t> blocks_;
  std::optional<int32_t> state_block_;
};

struct KdaStateAddress {
  uint64_t conv = 0;       // [3, conv_kernel - 1, heads_per_gpu * head_dim] fp32
  uint64_t recurrent = 0;  // [heads_per_gpu, head_dim, head_dim] fp32
};

uint64_t row_address(uint64_t base, const CachePlan& plan, int32_t block);
uint64_t latent_page_address(uint64_t base, const CachePlan& plan, int32_t block, int64_t layer);
uint64_t index_page_address(uint64_t base, const CachePlan& plan, int32_t block, int64_t layer);
uint64_t latent_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot, int64_t layer);
// An index key's codes, and its scales (FP8 / MXFP4 keys): the page holds every token's
// codes, then every token's scales.
uint64_t index_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot, int64_t layer);
uint64_t index_scale_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot,
                                  int64_t layer);
KdaStateAddress kda_state_address(uint64_t base, const CachePlan& plan, int32_t state_block,
                                  int64_t layer);

}  // namespace hyserve
