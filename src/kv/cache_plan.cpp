#include "kv/cache_plan.h"

#include <algorithm>
#include <cstdio>

#include "parallel/parallel_layout.h"
#include "util/error.h"
#include "util/format.h"

namespace hyserve {
namespace {

constexpr int64_t kMaxBlockSize = int64_t{1} << 24;

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
bool is_power_of_two(int64_t x) {
  return x > 0 && (x & (x - 1)) == 0;
}

struct TokenRow {
  int64_t bytes = 0;
  int64_t padding_bytes = 0;
  std::vector<CachePage> pages;
};

TokenRow layout_token_row(const CacheSpec& spec, int64_t latent_per_token, int64_t index_per_token,
                          int64_t block_size) {
  TokenRow row;
  auto place = [&row](int64_t width) {
    const int64_t offset = row.bytes;
    const int64_t end = align_up(offset + width, kCachePageAlignBytes);
    row.padding_bytes += end - (offset + width);
    row.bytes = end;
    return offset;
  };
  for (int64_t layer = 0; layer < spec.num_layers(); ++layer) {
    if (spec.is_kda(layer)) continue;
    CachePage p;
    p.layer = layer;
    p.latent_bytes = block_size * latent_per_token;
    p.latent_offset = place(p.latent_bytes);
    p.index_bytes = block_size * index_per_token;
    p.index_offset = place(p.index_bytes);
    row.pages.push_back(p);
  }
  return row;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

int64_t CachePlan::blocks_for_tokens(int64_t num_tokens) const {
  CHECK(num_tokens >= 0, "num_tokens must be >= 0, got ", num_tokens);
  return ceil_div(num_tokens, tokens_per_block());
}

const CachePage& CachePlan::page(int64_t layer) const {
  CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_page.size()), "layer ", layer,
        " out of range");
  const int32_t i = layer_page[layer];
  CHECK(i >= 0 && i < static_cast<int32_t>(pages.size()) && pages[i].layer == layer, "layer ",
        layer, " is not a full-attention layer");
  return pages[i];
}

const KdaStatePage& CachePlan::kda_page(int64_t layer) const {
  CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_page.size()), "layer ", layer,
        " out of range");
  const int32_t i = layer_page[layer];
  CHECK(i >= 0 && i < static_cast<int32_t>(kda_pages.size()) && kda_pages[i].layer == layer,
        "layer ", layer, " is not a KDA layer");
  return kda_pages[i];
}

CachePlan plan_cache(const CacheSpec& spec, const CachePlanOptions& options) {
  parallel::ParallelLayout::check_sizes(options.tp, options.dcp);
  CHECK(is_power_of_two(options.min_block_size), "min_block_size must be a power of two, got ",
        options.min_block_size);
  CachePlan plan;
  plan.options = options;

  if (spec.num_kda_layers() > 0) {
    CHECK(spec.kda_num_heads % options.tp == 0, "tp (", options.tp,
          ") must divide linear_num_heads (", spec.kda_num_heads, ")");
    plan.kda_heads_per_gpu = spec.kda_num_heads / options.tp;
    const int64_t width = plan.kda_heads_per_gpu * spec.kda_head_dim;
    int64_t offset = 0;
    for (int64_t layer = 0; layer < spec.num_layers(); ++layer) {
      if (!spec.is_kda(layer)) continue;
      KdaStatePage p;
      p.layer = layer;
      p.conv_offset = offset;
      p.conv_bytes = 3 * width * (spec.kda_conv_kernel - 1) * 4;
      p.recurrent_offset = align_up(p.conv_offset + p.conv_bytes, kCachePageAlignBytes);
      p.recurrent_bytes = width * spec.kda_head_dim * 4;
      offset = align_up(p.recurrent_offset + p.recurrent_bytes, kCachePageAlignBytes);
      plan.kda_pages.push_back(p);
    }
    plan.kda_state_bytes = offset;
    plan.kda_state_rows = 1;
  }

  const int64_t num_full = spec.num_full_attention_layers();
  const int64_t latent = num_full > 0 ? latent_bytes_per_token(spec, options.latent) : 0;
  const int64_t index = num_full > 0 ? index_key_bytes_per_token(spec, options.index) : 0;
  plan.token_bytes_per_slot = num_full * (latent + index);
  int64_t block_size = options.min_block_size;
  TokenRow row = layout_token_row(spec, latent, index, block_size);
  while (num_full > 0 && row.bytes < plan.kda_state_bytes) {
    block_size *= 2;
    CHECK(block_size <= kMaxBlockSize, "no block size up to ", kMaxBlockSize,
          " holds the KDA state (", plan.kda_state_bytes, " B)");
    row = layout_token_row(spec, latent, index, block_size);
  }
  plan.block_size = block_size;
  plan.row_bytes = std::max(row.bytes, plan.kda_state_bytes);
  plan.padding_bytes = row.padding_bytes;
  plan.pages = std::move(row.pages);
  for (CachePage& p : plan.pages) {
    p.index_scale_bytes = index_key_scale_bytes_per_token(spec, options.index);
    p.index_code_bytes = index_key_bytes_per_token(spec, options.index) - p.index_scale_bytes;
  }

  plan.layer_page.assign(spec.num_layers(), -1);
  for (size_t i = 0; i < plan.pages.size(); ++i) {
    plan.layer_page[plan.pages[i].layer] = static_cast<int32_t>(i);
  }
  for (size_t i = 0; i < plan.kda_pages.size(); ++i) {
    plan.layer_page[plan.kda_pages[i].layer] = static_cast<int32_t>(i);
  }
  return plan;
}

bool SnapshotPolicy::should_snapshot(int64_t boundary, int64_t prompt_full_blocks) const {
  if (boundary < 1) return false;
  return (every_blocks > 0 && boundary % every_blocks == 0) ||
         (at_prompt_end && boundary == prompt_full_blocks);
}

int64_t SnapshotPolicy::num_snapshots(int64_t num_full_blocks) const {
  if (num_full_blocks < 1) return 0;
  const int64_t periodic = every_blocks > 0 ? num_full_blocks / every_blocks : 0;
  const bool end_is_periodic = every_blocks > 0 && num_full_blocks % every_blocks == 0;
  return periodic + (at_prompt_end && !end_is_periodic ? 1 : 0);
}

std::string format_cache_plan(const CachePlan& plan) {
  const auto& o = plan.options;
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "cache plan: latent %s, index keys %s, TP %lld, DCP %lld, pages aligned to %lld "
                "B\n",
                std::string(latent_cache_dtype_name(o.latent)).c_str(),
                std::string(index_cache_dtype_name(o.index)).c_str(), static_cast<long long>(o.tp),
                static_cast<long long>(o.dcp), static_cast<long long>(kCachePageAlignBytes));
  s += buf;
  s += "  block: " + with_commas(plan.block_size) + " token slots per GPU (" +
       with_commas(plan.tokens_per_block()) + " positions per block id over DCP " +
       std::to_string(o.dcp) + ")\n";
  s += "  row: " + with_commas(plan.row_bytes) + " B (" + mib(plan.row_bytes) + "), " +
       with_commas(plan.token_bytes_per_slot) + " B per token slot, alignment padding " +
       with_commas(plan.padding_bytes) + " B\n";
  if (!plan.pages.empty()) {
    std::snprintf(buf, sizeof buf, "  %6s %15s %13s %15s %13s\n", "layer", "latent_offset",
                  "latent_bytes", "index_offset", "index_bytes");
    s += buf;
    for (const auto& p : plan.pages) {
      std::snprintf(buf, sizeof buf, "  %6lld %15s %13s %15s %13s\n",
                    static_cast<long long>(p.layer), with_commas(p.latent_offset).c_str(),
                    with_commas(p.latent_bytes).c_str(), with_commas(p.index_offset).c_str(),
                    with_commas(p.index_bytes).c_str());
      s += buf;
    }
  }
  if (plan.kda_state_rows > 0) {
    s += "  KDA state per request: " + with_commas(plan.kda_state_bytes) + " B (" +
         mib(plan.kda_state_bytes) + ") in " + std::to_string(plan.kda_state_rows) + " row, " +
         std::to_string(plan.kda_heads_per_gpu) + " heads per GPU, " +
         with_commas(plan.row_bytes - plan.kda_state_bytes) + " B of the row unused\n";
    std::snprintf(buf, sizeof buf, "  %6s %15s %13s %17s %15s\n", "layer", "conv_offset",
                  "conv_bytes", "recurrent_offset", "recurrent_bytes");
    s += buf;
    for (const auto& p : plan.kda_pages) {
      std::snprintf(buf, sizeof buf, "  %6lld %15s %13s %17s %15s\n",
                    static_cast<long long>(p.layer), with_commas(p.conv_offset).c_str(),
                    with_commas(p.conv_bytes).c_str(), with_commas(p.recurrent_offset).c_str(),
                    with_commas(p.recurrent_bytes).c_str());
      s += buf;
    }
  }
  return s;
}

}  // namespace hyserve
