#include "kv/cache_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/error.h"

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

TokenRow layout_token_row(const ModelConfig& c, int64_t latent_per_token, int64_t index_per_token,
                          int64_t block_size) {
  TokenRow row;
  auto place = [&row](int64_t width) {
    const int64_t offset = row.bytes;
    const int64_t end = align_up(offset + width, kCachePageAlignBytes);
    row.padding_bytes += end - (offset + width);
    row.bytes = end;
    return offset;
  };
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (c.is_kda(layer)) continue;
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

std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

enum class Storage { kBf16, kFp8Block, kMxfp4 };

// Bytes of a [rows, cols] matrix (cols = input dim, along which MXFP4 groups run).
int64_t matrix_bytes(int64_t rows, int64_t cols, Storage s) {
  switch (s) {
    case Storage::kBf16:
      return 2 * rows * cols;
    case Storage::kFp8Block:
      return rows * cols + 4 * ceil_div(rows, 128) * ceil_div(cols, 128);
    case Storage::kMxfp4:
      return rows * cols / 2 + rows * ceil_div(cols, 32);
  }
  return 0;
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

CachePlan plan_cache(const ModelConfig& c, const CachePlanOptions& options) {
  CHECK(options.tp >= 1 && options.dcp >= 1, "tp and dcp must be >= 1, got ", options.tp, ", ",
        options.dcp);
  CHECK(options.tp % options.dcp == 0, "dcp (", options.dcp, ") must divide tp (", options.tp,
        "): DCP shards the latent that TP replicates");
  CHECK(is_power_of_two(options.min_block_size), "min_block_size must be a power of two, got ",
        options.min_block_size);
  CHECK(c.num_hidden_layers == static_cast<int64_t>(c.layer_kinds.size()),
        "layer_kinds must have num_hidden_layers entries");
  CachePlan plan;
  plan.options = options;

  if (c.num_kda_layers() > 0) {
    CHECK(c.linear_num_heads % options.tp == 0, "tp (", options.tp,
          ") must divide linear_num_heads (", c.linear_num_heads, ")");
    plan.kda_heads_per_gpu = c.linear_num_heads / options.tp;
    const int64_t width = plan.kda_heads_per_gpu * c.linear_head_dim;
    int64_t offset = 0;
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      if (!c.is_kda(layer)) continue;
      KdaStatePage p;
      p.layer = layer;
      p.conv_offset = offset;
      p.conv_bytes = 3 * width * (c.linear_conv_kernel - 1) * 4;
      p.recurrent_offset = align_up(p.conv_offset + p.conv_bytes, kCachePageAlignBytes);
      p.recurrent_bytes = width * c.linear_head_dim * 4;
      offset = align_up(p.recurrent_offset + p.recurrent_bytes, kCachePageAlignBytes);
      plan.kda_pages.push_back(p);
    }
    plan.kda_state_bytes = offset;
    plan.kda_state_rows = 1;
  }

  const int64_t latent = c.num_mla_layers() > 0 ? latent_bytes_per_token(c, options.latent) : 0;
  const int64_t index = c.num_mla_layers() > 0 ? index_key_bytes_per_token(c, options.index) : 0;
  plan.token_bytes_per_slot = c.num_mla_layers() * (latent + index);
  int64_t block_size = options.min_block_size;
  TokenRow row = layout_token_row(c, latent, index, block_size);
  while (c.num_mla_layers() > 0 && row.bytes < plan.kda_state_bytes) {
    block_size *= 2;
    CHECK(block_size <= kMaxBlockSize, "no block size up to ", kMaxBlockSize,
          " holds the KDA state (", plan.kda_state_bytes, " B)");
    row = layout_token_row(c, latent, index, block_size);
  }
  plan.block_size = block_size;
  plan.row_bytes = std::max(row.bytes, plan.kda_state_bytes);
  plan.padding_bytes = row.padding_bytes;
  plan.pages = std::move(row.pages);
  for (CachePage& p : plan.pages) {
    p.index_scale_bytes = index_key_scale_bytes_per_token(c, options.index);
    p.index_code_bytes = index_key_bytes_per_token(c, options.index) - p.index_scale_bytes;
  }

  plan.layer_page.assign(c.num_hidden_layers, -1);
  for (size_t i = 0; i < plan.pages.size(); ++i) {
    plan.layer_page[plan.pages[i].layer] = static_cast<int32_t>(i);
  }
  for (size_t i = 0; i < plan.kda_pages.size(); ++i) {
    plan.layer_page[plan.kda_pages[i].layer] = static_cast<int32_t>(i);
  }
  return plan;
}

WeightBytes estimate_weight_bytes_per_gpu(const ModelConfig& c, int64_t tp) {
  CHECK(tp >= 1, "tp must be >= 1, got ", tp);
  const int64_t d = c.hidden_size;
  const Storage linear = c.fp8_block_weights ? Storage::kFp8Block : Storage::kBf16;
  const Storage bf16 = Storage::kBf16;
  const Storage experts = c.expert_format == ExpertFormat::kMxfp4      ? Storage::kMxfp4
                          : c.expert_format == ExpertFormat::kFp8Block ? Storage::kFp8Block
                                                                       : Storage::kBf16;
  auto split = [tp](int64_t n, const char* what) {
    CHECK(n % tp == 0, "tp (", tp, ") must divide ", what, " (", n, ")");
    return n / tp;
  };
  WeightBytes w;
  const int64_t vocab_shard = ceil_div(c.vocab_size, tp);
  w.sharded += matrix_bytes(vocab_shard, d, bf16) * (c.tie_word_embeddings ? 1 : 2);
  w.replicated += 2 * d;                                                            // model.norm
  if (c.has_attn_res()) w.replicated += 2 * 2 * d * (2 * c.num_hidden_layers + 1);  // AttnRes

  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    w.replicated += 2 * 2 * d;  // input_layernorm, post_attention_layernorm
    if (c.is_kda(layer)) {
      const int64_t k = c.linear_head_dim;
      const int64_t heads = split(c.linear_num_heads, "linear_num_heads");
      const int64_t width = heads * k;
      w.sharded += 3 * matrix_bytes(width, d, linear)      // q, k, v proj
                   + 4 * 3 * width * c.linear_conv_kernel  // q, k, v conv1d (fp32)
                   + matrix_bytes(width, k, linear)        // f_b
                   + matrix_bytes(heads, d, linear)        // b_proj
                   + 4 * (heads + width)                   // A_log, dt_bias (fp32)
                   + matrix_bytes(d, width, linear);       // o_proj
      w.replicated += matrix_bytes(k, d, linear) + 4 * k;  // f_a, o_norm (fp32)
      if (c.kda_full_rank_gate) {
        w.sharded += matrix_bytes(width, d, linear);  // g_proj
      } else {
        w.sharded += matrix_bytes(width, k, linear);  // g_b
        w.replicated += matrix_bytes(k, d, linear);   // g_a
      }
    } else {
      const int64_t heads = split(c.num_attention_heads, "num_attention_heads");
      const int64_t q_out = heads * c.qk_head_dim();
      if (c.q_lora_rank > 0) {
        w.replicated += matrix_bytes(c.q_lora_rank, d, linear) + 2 * c.q_lora_rank;
        w.sharded += matrix_bytes(q_out, c.q_lora_rank, linear);
      } else {
        w.sharded += matrix_bytes(q_out, d, linear);
      }
      w.replicated += matrix_bytes(c.kv_lora_rank + c.qk_rope_head_dim, d, linear) +
                      2 * c.kv_lora_rank;  // kv_a_proj_with_mqa, kv_a_layernorm
      w.sharded += matrix_bytes(heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
                                linear)                              // kv_b_proj
                   + matrix_bytes(d, heads * c.v_head_dim, linear);  // o_proj
      if (c.mla_output_gate) w.sharded += matrix_bytes(heads * c.v_head_dim, d, linear);
      if (c.has_indexer()) {
        const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : d;
        w.replicated += matrix_bytes(c.index_n_heads * c.index_head_dim, q_in, linear)  // wq_b
                        + matrix_bytes(c.index_head_dim, d, linear)                     // wk
                        + 2 * 2 * c.index_head_dim                                      // k_norm
                        + matrix_bytes(c.index_n_heads, d, bf16);  // weights_proj
      }
    }
    if (c.is_moe(layer)) {
      const int64_t inter = split(c.moe_intermediate_size, "moe_intermediate_size");
      const int64_t de = c.expert_hidden_size();
      const int64_t expert_linear =
          2 * matrix_bytes(inter, d, linear) + matrix_bytes(d, inter, linear);
      const int64_t expert_routed =
          2 * matrix_bytes(inter, de, experts) + matrix_bytes(de, inter, experts);
      w.replicated += matrix_bytes(c.num_experts, d, bf16) + 4 * c.num_experts;  // router, bias
      w.sharded += c.num_shared_experts * expert_linear;
      if (c.moe_latent_size > 0)  // routed_expert_{down,up}_proj, routed_expert_norm
        w.replicated += 2 * matrix_bytes(de, d, bf16) + (c.moe_latent_norm ? 2 * de : 0);
      w.routed_experts += c.num_experts * expert_routed;
    } else {
      const int64_t inter = split(c.intermediate_size, "intermediate_size");
      w.sharded += 2 * matrix_bytes(inter, d, linear) + matrix_bytes(d, inter, linear);
    }
  }
  return w;
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

MemoryPlan plan_memory(const CachePlan& plan, const MemoryBudget& budget) {
  CHECK(budget.gpu_memory_bytes > 0, "gpu_memory_bytes must be > 0");
  CHECK(budget.gpu_memory_utilization > 0 && budget.gpu_memory_utilization <= 1,
        "gpu_memory_utilization must be in (0, 1], got ", budget.gpu_memory_utilization);
  CHECK(budget.weight_bytes >= 0 && budget.reserve_bytes >= 0 && budget.context_tokens >= 1,
        "weight_bytes, reserve_bytes must be >= 0 and context_tokens >= 1");
  CHECK(budget.snapshots.every_blocks >= 0, "snapshot interval must be >= 0");
  CHECK(plan.row_bytes > 0, "empty cache plan");
  MemoryPlan m;
  m.budget = budget;
  m.usable_bytes =
      std::llround(static_cast<double>(budget.gpu_memory_bytes) * budget.gpu_memory_utilization);
  const int64_t left = m.usable_bytes - budget.weight_bytes - budget.reserve_bytes;
  m.fits = left >= 0;
  m.cache_bytes = std::max<int64_t>(left, 0);
  m.num_blocks = m.cache_bytes / plan.row_bytes;
  m.tokens_per_gpu = m.num_blocks * plan.block_size;
  m.tokens_per_dcp_group = m.num_blocks * plan.tokens_per_block();
  m.context_token_blocks = plan.blocks_for_tokens(budget.context_tokens);
  const bool has_kda = plan.kda_state_rows > 0;
  m.context_snapshot_blocks =
      has_kda ? budget.snapshots.num_snapshots(budget.context_tokens / plan.tokens_per_block()) : 0;
  m.blocks_per_context =
      m.context_token_blocks + (has_kda ? plan.kda_state_rows : 0) + m.context_snapshot_blocks;
  m.num_full_contexts = m.num_blocks / m.blocks_per_context;
  return m;
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

std::string format_cache_plan(const CachePlan& plan, const MemoryPlan& m) {
  const auto& b = m.budget;
  std::string s = format_cache_plan(plan);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", b.gpu_memory_utilization);
  s += "memory per GPU: " + gb(b.gpu_memory_bytes) + " x " + buf + " = " + gb(m.usable_bytes) +
       " usable; weights " + gb(b.weight_bytes) + ", reserve " + gb(b.reserve_bytes) +
       " -> cache " + gb(m.cache_bytes) + "\n";
  if (!m.fits) {
    s += "  does not fit: weights + reserve exceed usable memory by " +
         gb(b.weight_bytes + b.reserve_bytes - m.usable_bytes) + "\n";
  }
  s += "  " + with_commas(m.num_blocks) + " blocks -> " + with_commas(m.tokens_per_gpu) +
       " token slots per GPU, " + with_commas(m.tokens_per_dcp_group) +
       " positions per DCP group\n";
  s += "  one " + with_commas(b.context_tokens) +
       "-token context: " + with_commas(m.context_token_blocks) + " token blocks + " +
       std::to_string(plan.kda_state_rows) + " KDA state + " +
       with_commas(m.context_snapshot_blocks) +
       " snapshots = " + with_commas(m.blocks_per_context) + " blocks -> " +
       with_commas(m.num_full_contexts) + " full contexts fit\n";
  return s;
}

}  // namespace hyserve
