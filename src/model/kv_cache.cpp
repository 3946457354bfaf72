#include "model/kv_cache.h"

#include "util/error.h"

namespace hyserve {

KvCache::KvCache(Backend& backend, CachePlan plan, int64_t num_blocks)
    : backend_(&backend), plan_(std::move(plan)), num_blocks_(num_blocks) {
  CHECK(num_blocks >= 1, "KV cache: num_blocks must be >= 1, got ", num_blocks);
  CHECK(plan_.row_bytes > 0 && plan_.block_size > 0, "KV cache: empty plan");
  pool_ = BackendBuffer(backend_, static_cast<size_t>((num_blocks + 1) * plan_.row_bytes));
}

uint8_t* KvCache::row(int32_t block) const {
  CHECK(block >= 0 && block <= num_blocks_, "KV cache: block ", block, " outside the pool of ",
        num_blocks_, " (+1 scratch)");
  return base() + static_cast<int64_t>(block) * plan_.row_bytes;
}

float* KvCache::latent_page(int64_t layer) const {
  return reinterpret_cast<float*>(base() + plan_.page(layer).latent_offset);
}

uint8_t* KvCache::index_page(int64_t layer) const {
  const CachePage& p = plan_.page(layer);
  CHECK(p.index_bytes > 0, "KV cache: layer ", layer, " has no index keys");
  return base() + p.index_offset;
}

float* KvCache::index_scale_page(int64_t layer) const {
  CHECK(plan_.options.index == IndexCacheDtype::kFp8, "KV cache: index keys are not FP8");
  return reinterpret_cast<float*>(index_page(layer) +
                                  plan_.block_size * plan_.page(layer).index_code_bytes);
}

PagedRows KvCache::pages(const int32_t* block_table) const {
  return {block_table, plan_.block_size, plan_.row_bytes};
}

float* KvCache::kda_conv_state(int32_t block, int64_t layer, int which) const {
  const KdaStatePage& p = plan_.kda_page(layer);
  CHECK(which >= 0 && which < 3, "KV cache: conv state ", which);
  return reinterpret_cast<float*>(row(block) + p.conv_offset + which * (p.conv_bytes / 3));
}

float* KvCache::kda_recurrent_state(int32_t block, int64_t layer) const {
  return reinterpret_cast<float*>(row(block) + plan_.kda_page(layer).recurrent_offset);
}

void KvCache::zero_block(int32_t block) {
  backend_->fill_zero(row(block), static_cast<size_t>(plan_.row_bytes));
}

void KvCache::copy_block(int32_t dst, int32_t src) {
  if (dst == src) return;
  backend_->copy(row(dst), row(src), static_cast<size_t>(plan_.row_bytes));
}

void KvCache::grow(int64_t num_blocks) {
  if (num_blocks <= num_blocks_) return;
  BackendBuffer bigger(backend_, static_cast<size_t>((num_blocks + 1) * plan_.row_bytes));
  backend_->copy(bigger.data(), pool_.data(), static_cast<size_t>(num_blocks_ * plan_.row_bytes));
  pool_ = std::move(bigger);
  num_blocks_ = num_blocks;
}

}  // namespace hyserve
