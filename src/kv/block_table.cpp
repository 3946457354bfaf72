#include "kv/block_table.h"

#include "core/dcp_position.h"
#include "core/paged.h"

#include "util/error.h"

namespace hyserve {

BlockTable::BlockTable(int64_t block_size, int64_t dcp) : block_size_(block_size), dcp_(dcp) {
  CHECK(block_size >= 1 && dcp >= 1, "block_size and dcp must be >= 1, got ", block_size, ", ",
        dcp);
}

void BlockTable::append(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) CHECK(b >= 0, "negative block id ", b);
  blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
}

Slot BlockTable::slot(int64_t token_pos) const {
  CHECK(token_pos >= 0 && token_pos < capacity_tokens(), "position ", token_pos,
        " outside the table's ", capacity_tokens(), " positions");
  const int64_t local = dcp_local_slot(token_pos, dcp_);
  return {static_cast<int32_t>(dcp_owner(token_pos, dcp_)), blocks_[local / block_size_],
          static_cast<int32_t>(local % block_size_)};
}

int64_t BlockTable::slot_index(int64_t token_pos) const {
  CHECK(token_pos >= 0 && token_pos < capacity_tokens(), "position ", token_pos,
        " outside the table's ", capacity_tokens(), " positions");
  return hyserve::slot_index(blocks_.data(), block_size_, dcp_local_slot(token_pos, dcp_));
}

uint64_t row_address(uint64_t base, const CachePlan& plan, int32_t block) {
  CHECK(block >= 0, "negative block id ", block);
  return base + static_cast<uint64_t>(block) * static_cast<uint64_t>(plan.row_bytes);
}

uint64_t latent_page_address(uint64_t base, const CachePlan& plan, int32_t block, int64_t layer) {
  return row_address(base, plan, block) + plan.page(layer).latent_offset;
}

uint64_t index_page_address(uint64_t base, const CachePlan& plan, int32_t block, int64_t layer) {
  return row_address(base, plan, block) + plan.page(layer).index_offset;
}

uint64_t latent_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot,
                             int64_t layer) {
  CHECK(slot.offset >= 0 && slot.offset < plan.block_size, "slot offset ", slot.offset,
        " outside the block");
  return latent_page_address(base, plan, slot.block, layer) +
         slot.offset * (plan.page(layer).latent_bytes / plan.block_size);
}

uint64_t index_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot, int64_t layer) {
  CHECK(slot.offset >= 0 && slot.offset < plan.block_size, "slot offset ", slot.offset,
        " outside the block");
  return index_page_address(base, plan, slot.block, layer) +
         slot.offset * plan.page(layer).index_code_bytes;
}

uint64_t index_scale_slot_address(uint64_t base, const CachePlan& plan, const Slot& slot,
                                  int64_t layer) {
  CHECK(slot.offset >= 0 && slot.offset < plan.block_size, "slot offset ", slot.offset,
        " outside the block");
  const CachePage& page = plan.page(layer);
  CHECK(page.index_scale_bytes > 0, "layer ", layer, ": its index keys have no scales");
  return index_page_address(base, plan, slot.block, layer) +
         plan.block_size * page.index_code_bytes + slot.offset * page.index_scale_bytes;
}

KdaStateAddress kda_state_address(uint64_t base, const CachePlan& plan, int32_t state_block,
                                  int64_t layer) {
  const KdaStatePage& p = plan.kda_page(layer);
  const uint64_t row = row_address(base, plan, state_block);
  return {row + p.conv_offset, row + p.recurrent_offset};
}

}  // namespace hyserve
