#include "kv/kv_cache.h"

#include "kv/block_table.h"

#include "util/error.h"

namespace hyserve {

KvCache::KvCache(Device& device, CachePlan plan, int64_t num_blocks)
    : device_(&device), plan_(std::move(plan)), num_blocks_(num_blocks) {
  CHECK(num_blocks >= 1, "KV cache: num_blocks must be >= 1, got ", num_blocks);
  CHECK(plan_.row_bytes > 0 && plan_.block_size > 0, "KV cache: empty plan");
  pool_ = DeviceAllocation(device_, static_cast<size_t>((num_blocks + 1) * plan_.row_bytes));
}

void KvCache::release() {
  pool_ = DeviceAllocation();
}

void KvCache::restore() {
  if (resident()) return;
  pool_ = DeviceAllocation(device_, static_cast<size_t>((num_blocks_ + 1) * plan_.row_bytes));
}

void KvCache::check_block(int32_t block) const {
  CHECK(block >= 0 && block <= num_blocks_, "KV cache: block ", block, " outside the pool of ",
        num_blocks_, " (+1 scratch)");
}

uint8_t* KvCache::row(int32_t block) const {
  check_block(block);
  return reinterpret_cast<uint8_t*>(row_address(address(), plan_, block));
}

// Addresses come from the block-table arithmetic of kv/block_table.h, the one definition
// of the row layout.
uint64_t KvCache::address() const {
  return reinterpret_cast<uint64_t>(base());
}

float* KvCache::latent_page(int64_t layer) const {
  return reinterpret_cast<float*>(latent_page_address(address(), plan_, 0, layer));
}

uint8_t* KvCache::index_page(int64_t layer) const {
  CHECK(plan_.page(layer).index_bytes > 0, "KV cache: layer ", layer, " has no index keys");
  return reinterpret_cast<uint8_t*>(index_page_address(address(), plan_, 0, layer));
}

float* KvCache::index_scale_page(int64_t layer) const {
  return reinterpret_cast<float*>(index_scale_slot_address(address(), plan_, Slot{}, layer));
}

PagedRows KvCache::pages(const int32_t* block_table) const {
  return {block_table, plan_.block_size, plan_.row_bytes};
}

float* KvCache::kda_conv_state(int32_t block, int64_t layer, int which) const {
  CHECK(which >= 0 && which < 3, "KV cache: conv state ", which);
  check_block(block);
  const int64_t one_conv_bytes = plan_.kda_page(layer).conv_bytes / 3;
  return reinterpret_cast<float*>(kda_state_address(address(), plan_, block, layer).conv +
                                  which * one_conv_bytes);
}

float* KvCache::kda_recurrent_state(int32_t block, int64_t layer) const {
  check_block(block);
  return reinterpret_cast<float*>(kda_state_address(address(), plan_, block, layer).recurrent);
}

void KvCache::zero_block(int32_t block) {
  device_->fill_zero(row(block), static_cast<size_t>(plan_.row_bytes));
}

void KvCache::copy_block(int32_t dst, int32_t src) {
  if (dst == src) return;
  device_->copy(row(dst), row(src), static_cast<size_t>(plan_.row_bytes));
}

void KvCache::grow(int64_t num_blocks) {
  if (num_blocks <= num_blocks_) return;
  DeviceAllocation bigger(device_, static_cast<size_t>((num_blocks + 1) * plan_.row_bytes));
  device_->copy(bigger.data(), pool_.data(), static_cast<size_t>(num_blocks_ * plan_.row_bytes));
  pool_ = std::move(bigger);
  num_blocks_ = num_blocks;
}

}  // namespace hyserve
