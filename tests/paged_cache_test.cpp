// The packed block cache as the model uses it: scatter_rows writes each row where
// kv/block_table.h's independent address arithmetic says, gather_rows reads rows back from
// there, KvCache's pages and state rows are those addresses for real configs, its row
// operations touch exactly one row, and the CPU MLA attention and indexer scores read paged
// rows in shuffled blocks to the same bits as contiguous ones.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "kernels/attention/indexer/cpu.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/cache/cpu.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "paged_test_util.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using test::PagedPool;
using test::random_normal;
using test::same_bits;
using test::same_bytes;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// One full-attention layer (layer 1; layer 0 has no page) whose latent and index pages are
// both row_bytes per token, after 256 bytes of another layer, with a tail in every row.
CachePlan one_layer_plan(int64_t bs, int64_t row_bytes) {
  CachePlan plan;
  plan.block_size = bs;
  CachePage page;
  page.layer = 1;
  page.latent_offset = 256;
  page.latent_bytes = bs * row_bytes;
  page.index_offset = page.latent_offset + page.latent_bytes;
  page.index_bytes = bs * row_bytes;
  page.index_code_bytes = row_bytes;  // keys without scales, like fp32 ones
  plan.pages = {page};
  plan.layer_page = {-1, 0};
  plan.row_bytes = (page.index_offset + page.index_bytes + 256 + 255) / 256 * 256;
  return plan;
}

// A sequence at positions [first, first + n) of a shuffled block table scatters its rows
// (every 7th a padding row, slot -1) into the latent and the index page of a pool filled
// with a sentinel. Every row lands at latent_slot_address / index_slot_address of its
// position; every other byte keeps the sentinel.
TEST(PagedCache, ScatterRowsWritesWhereTheBlockTableSays) {
  uint32_t seed = 1;
  for (const int64_t row_bytes : {4, 132, 160, 2304}) {
    for (const int64_t bs : {64, 128}) {
      const CachePlan plan = one_layer_plan(bs, row_bytes);
      const int64_t num_blocks = 6, first = bs - 3, n = 2 * bs + 9;
      std::vector<int32_t> ids = {4, 1, 5, 0, 3, 2};
      BlockTable table(bs);
      table.append(std::span(ids).first(4));
      std::vector<int64_t> slots(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) slots[i] = i % 7 == 3 ? -1 : table.slot_index(first + i);
      const auto latents = random_bytes(static_cast<size_t>(n * row_bytes), ++seed);
      const auto keys = random_bytes(static_cast<size_t>(n * row_bytes), ++seed);

      std::vector<uint8_t> pool(static_cast<size_t>(num_blocks * plan.row_bytes), 0xa5);
      std::vector<uint8_t> want = pool;
      const auto base = reinterpret_cast<uint64_t>(pool.data());
      for (const bool index : {false, true}) {
        const CachePage& page = plan.page(1);
        cpu::scatter_rows({.src = (index ? keys : latents).data(),
                           .slots = slots.data(),
                           .dst = pool.data() + (index ? page.index_offset : page.latent_offset),
                           .num_rows = n,
                           .row_bytes = row_bytes,
                           .block_size = bs,
                           .block_stride_bytes = plan.row_bytes});
        for (int64_t i = 0; i < n; ++i) {
          if (slots[i] < 0) continue;
          const Slot s = table.slot(first + i);
          const uint64_t at =
              index ? index_slot_address(base, plan, s, 1) : latent_slot_address(base, plan, s, 1);
          std::memcpy(&want[at - base], (index ? keys : latents).data() + i * row_bytes,
                      static_cast<size_t>(row_bytes));
        }
      }
      EXPECT_TRUE(same_bytes(pool, want)) << "row_bytes " << row_bytes << ", block_size " << bs
                                          << " (row " << plan.row_bytes << " B)";
    }
  }
}

TEST(PagedCache, ScatterRowsRefusesBadArguments) {
  std::vector<uint8_t> src(64), dst(4096);
  const std::vector<int64_t> slots = {0, 1};
  const ScatterRowsParams ok{.src = src.data(),
                             .slots = slots.data(),
                             .dst = dst.data(),
                             .num_rows = 2,
                             .row_bytes = 32,
                             .block_size = 4,
                             .block_stride_bytes = 128};
  EXPECT_NO_THROW(cpu::scatter_rows(ok));
  auto with = [&](auto change) {
    ScatterRowsParams p = ok;
    change(p);
    return p;
  };
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.block_stride_bytes = 127; })),
               InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.src = nullptr; })), InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.slots = nullptr; })), InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.dst = nullptr; })), InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.row_bytes = 0; })), InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.block_size = 0; })), InvalidArgument);
  EXPECT_THROW(cpu::scatter_rows(with([](auto& p) { p.num_rows = -1; })), InvalidArgument);
  // No rows: nothing is read, null pointers are fine.
  EXPECT_NO_THROW(
      cpu::scatter_rows({.num_rows = 0, .row_bytes = 4, .block_size = 1, .block_stride_bytes = 4}));
}

// gather_rows reads back what scatter_rows wrote: rows [0, n) of a sequence in shuffled
// blocks (PagedPool, written by hand) come out in order, packed or strided (the other bytes
// of the strided buffer untouched), and from contiguous rows as well.
TEST(PagedCache, GatherRowsReadsWhereTheBlockTableSays) {
  uint32_t seed = 40;
  for (const int64_t row_bytes : {4, 33, 132, 2304}) {
    for (const int64_t bs : {1, 64}) {
      for (const int64_t n : {int64_t{1}, bs + 5, 2 * bs + 9}) {
        SCOPED_TRACE(testing::Message()
                     << row_bytes << " B rows, block_size " << bs << ", " << n << " rows");
        PagedPool pool(n, bs, bs * row_bytes, ++seed);
        const auto rows = random_bytes(static_cast<size_t>(n * row_bytes), ++seed);
        pool.write(rows.data(), n, row_bytes);
        for (const int64_t stride : {row_bytes, 3 * row_bytes + 1}) {
          std::vector<uint8_t> out(static_cast<size_t>(n * stride), 0x5a);
          std::vector<uint8_t> want = out;
          for (int64_t i = 0; i < n; ++i) {
            std::memcpy(&want[i * stride], &rows[i * row_bytes], static_cast<size_t>(row_bytes));
          }
          cpu::gather_rows({.src = pool.page<uint8_t>(pool.bytes.data()),
                            .src_pages = pool.pages(pool.block_table.data()),
                            .dst = out.data(),
                            .num_rows = n,
                            .row_bytes = row_bytes,
                            .dst_stride_bytes = stride});
          EXPECT_TRUE(same_bytes(out, want)) << "paged, dst stride " << stride;
          std::vector<uint8_t> flat(want.size(), 0x5a);
          cpu::gather_rows({.src = rows.data(),
                            .dst = flat.data(),
                            .num_rows = n,
                            .row_bytes = row_bytes,
                            .dst_stride_bytes = stride});
          EXPECT_TRUE(same_bytes(flat, want)) << "contiguous, dst stride " << stride;
        }
      }
    }
  }
}

TEST(PagedCache, GatherRowsRefusesBadArguments) {
  std::vector<uint8_t> src(4096), dst(64);
  const std::vector<int32_t> table = {0, 1};
  const GatherRowsParams ok{.src = src.data(),
                            .src_pages = {table.data(), 4, 128},
                            .dst = dst.data(),
                            .num_rows = 2,
                            .row_bytes = 32,
                            .dst_stride_bytes = 32};
  EXPECT_NO_THROW(cpu::gather_rows(ok));
  auto with = [&](auto change) {
    GatherRowsParams p = ok;
    change(p);
    return p;
  };
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.src_pages.block_stride_bytes = 127; })),
               InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.src_pages.block_size = 0; })),
               InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.dst_stride_bytes = 31; })), InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.src = nullptr; })), InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.dst = nullptr; })), InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.row_bytes = 0; })), InvalidArgument);
  EXPECT_THROW(cpu::gather_rows(with([](auto& p) { p.num_rows = -1; })), InvalidArgument);
  EXPECT_NO_THROW(cpu::gather_rows({.num_rows = 0, .row_bytes = 4, .dst_stride_bytes = 4}));
}

struct NamedConfig {
  const char* dir;
  IndexCacheDtype index;
};

// KvCache's page bases and state tensors are the addresses of kv/block_table.h for the
// bundled model (KDA + MLA + indexer) and deepseek_v32 (MLA + indexer), index keys in fp32
// and FP8; a sequence's row s through pages() is latent_slot_address of its slot.
TEST(PagedCache, KvCacheAddressesEqualBlockTableArithmetic) {
  for (const NamedConfig& nc :
       {NamedConfig{"models/tiny-kimi-k3", IndexCacheDtype::kFp32},
        NamedConfig{"models/tiny-kimi-k3", IndexCacheDtype::kFp8},
        NamedConfig{"tests/fixtures/deepseek_v32_tiny", IndexCacheDtype::kFp8},
        NamedConfig{"tests/fixtures/deepseek_v32_tiny", IndexCacheDtype::kFp32}}) {
    const ModelConfig c = ModelConfig::load(fs::path(HYSERVE_SOURCE_DIR) / nc.dir);
    const CachePlan plan =
        plan_cache(c.cache_spec(), {.latent = LatentCacheDtype::kFp32, .index = nc.index});
    const std::string what = str_cat(nc.dir, nc.index == IndexCacheDtype::kFp8 ? " fp8" : " fp32");
    ASSERT_EQ(static_cast<int64_t>(plan.pages.size()), c.num_mla_layers()) << what;
    auto backend = make_cpu_backend();
    KvCache cache(*backend, plan, 7);
    const auto base = reinterpret_cast<uint64_t>(cache.base());
    const int64_t bs = plan.block_size, di = c.index_head_dim;
    const std::vector<int32_t> ids = {5, 2, 6};
    BlockTable table(bs);
    table.append(ids);
    const PagedRows pages = cache.pages(ids.data());
    EXPECT_EQ(pages.block_size, bs);
    EXPECT_EQ(pages.block_stride_bytes, plan.row_bytes);
    for (const CachePage& page : plan.pages) {
      const int64_t layer = page.layer;
      const int64_t latent_row = page.latent_bytes / bs;
      ASSERT_EQ(latent_row, (c.kv_lora_rank + c.qk_rope_head_dim) * 4) << what;
      EXPECT_EQ(reinterpret_cast<uint64_t>(cache.latent_page(layer)),
                latent_page_address(base, plan, 0, layer))
          << what << " layer " << layer;
      EXPECT_EQ(reinterpret_cast<uint64_t>(cache.index_page(layer)),
                index_page_address(base, plan, 0, layer))
          << what << " layer " << layer;
      for (const int64_t pos : {int64_t{0}, bs - 1, bs, 2 * bs + 7, 3 * bs - 1}) {
        const Slot s = table.slot(pos);
        const auto latent = reinterpret_cast<uint64_t>(cache.latent_page(layer)) +
                            static_cast<uint64_t>(pages.byte_offset(pos, latent_row));
        EXPECT_EQ(latent, latent_slot_address(base, plan, s, layer)) << what << " pos " << pos;
        if (nc.index == IndexCacheDtype::kFp8) {
          const uint64_t page_at = index_page_address(base, plan, s.block, layer);
          EXPECT_EQ(
              reinterpret_cast<uint64_t>(cache.index_page(layer)) + pages.byte_offset(pos, di),
              page_at + s.offset * di)
              << what << " codes of pos " << pos;
          EXPECT_EQ(
              reinterpret_cast<uint64_t>(cache.index_scale_page(layer)) + pages.byte_offset(pos, 4),
              page_at + bs * di + s.offset * 4)
              << what << " scale of pos " << pos;
          EXPECT_EQ(index_slot_address(base, plan, s, layer), page_at + s.offset * di)
              << what << " pos " << pos;
          EXPECT_EQ(index_scale_slot_address(base, plan, s, layer),
                    page_at + bs * di + s.offset * 4)
              << what << " pos " << pos;
        } else {
          EXPECT_EQ(
              reinterpret_cast<uint64_t>(cache.index_page(layer)) + pages.byte_offset(pos, di * 4),
              index_slot_address(base, plan, s, layer))
              << what << " pos " << pos;
        }
      }
      if (nc.index == IndexCacheDtype::kFp8) {
        // [bs x di codes | bs fp32 scales]: the scales end the page exactly.
        ASSERT_EQ(page.index_bytes, bs * (di + 4)) << what;
        EXPECT_EQ(reinterpret_cast<uint64_t>(cache.index_scale_page(layer)),
                  index_page_address(base, plan, 0, layer) + bs * di)
            << what << " layer " << layer;
      } else {
        ASSERT_EQ(page.index_bytes, bs * di * 4) << what;
        EXPECT_THROW(cache.index_scale_page(layer), InvalidArgument) << what;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(plan.kda_pages.size()), c.num_kda_layers()) << what;
    for (const KdaStatePage& kp : plan.kda_pages) {
      for (const int32_t b : {0, 3, 6}) {
        const KdaStateAddress a = kda_state_address(base, plan, b, kp.layer);
        for (int which = 0; which < 3; ++which) {
          EXPECT_EQ(reinterpret_cast<uint64_t>(cache.kda_conv_state(b, kp.layer, which)),
                    a.conv + which * (kp.conv_bytes / 3))
              << what << " layer " << kp.layer << " block " << b << " conv " << which;
        }
        EXPECT_EQ(reinterpret_cast<uint64_t>(cache.kda_recurrent_state(b, kp.layer)), a.recurrent)
            << what << " layer " << kp.layer << " block " << b;
      }
      EXPECT_THROW(cache.kda_conv_state(8, kp.layer, 0), InvalidArgument);  // 7 blocks + scratch
      EXPECT_THROW(cache.kda_conv_state(0, kp.layer, 3), InvalidArgument);
      EXPECT_THROW(cache.kda_recurrent_state(-1, kp.layer), InvalidArgument);
    }
  }
}

// zero_block and copy_block change exactly one row; grow keeps every row and adds zeros.
// The pool has one scratch row after its blocks (padding rows of captured decode graphs).
TEST(PagedCache, KvCacheRowOperationsTouchExactlyTheirRow) {
  const ModelConfig c = ModelConfig::load(fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3");
  const CachePlan plan = plan_cache(
      c.cache_spec(), {.latent = LatentCacheDtype::kFp32, .index = IndexCacheDtype::kFp8});
  auto backend = make_cpu_backend();
  KvCache cache(*backend, plan, 5);
  const auto row = static_cast<size_t>(plan.row_bytes);
  ASSERT_EQ(cache.num_bytes(), 6 * row);
  ASSERT_EQ(cache.scratch_block(), 5);
  std::vector<uint8_t> want = random_bytes(cache.num_bytes(), 77);
  std::memcpy(cache.base(), want.data(), want.size());
  auto pool = [&] { return std::vector<uint8_t>(cache.base(), cache.base() + cache.num_bytes()); };

  cache.zero_block(2);
  std::fill_n(want.begin() + 2 * row, row, uint8_t{0});
  EXPECT_TRUE(same_bytes(pool(), want)) << "zero_block(2)";
  cache.copy_block(4, 1);
  std::copy_n(want.begin() + row, row, want.begin() + 4 * row);
  EXPECT_TRUE(same_bytes(pool(), want)) << "copy_block(4, 1)";
  cache.copy_block(3, 3);
  EXPECT_TRUE(same_bytes(pool(), want)) << "copy_block(3, 3)";
  cache.copy_block(0, 2);  // a zeroed row copied over
  std::fill_n(want.begin(), row, uint8_t{0});
  EXPECT_TRUE(same_bytes(pool(), want)) << "copy_block(0, 2)";
  EXPECT_THROW(cache.zero_block(6), InvalidArgument);
  EXPECT_THROW(cache.copy_block(6, 0), InvalidArgument);
  EXPECT_THROW(cache.copy_block(0, -1), InvalidArgument);

  cache.grow(3);  // never shrinks
  EXPECT_EQ(cache.num_blocks(), 5);
  EXPECT_TRUE(same_bytes(pool(), want)) << "grow(3)";
  cache.grow(9);
  EXPECT_EQ(cache.num_blocks(), 9);
  EXPECT_EQ(cache.scratch_block(), 9);
  want.resize(10 * row, 0);
  std::fill(want.begin() + 5 * row, want.end(), uint8_t{0});  // the old scratch row is not kept
  EXPECT_TRUE(same_bytes(pool(), want)) << "grow(9)";
  // The pages moved with the pool.
  EXPECT_EQ(reinterpret_cast<uint8_t*>(cache.latent_page(3)),
            cache.base() + plan.page(3).latent_offset);
  cache.zero_block(8);
  EXPECT_TRUE(same_bytes(pool(), want)) << "zero_block(8) after grow";
}

// MLA over latents in shuffled blocks of a NaN-filled pool equals MLA over the same latents
// contiguous, bitwise, for both forms, dense and top-k, prefill and decode.
TEST(PagedCache, CpuMlaPagedEqualsContiguousBitwise) {
  const int64_t H = 3, dn = 16, dr = 8, dv = 16, kv_lora = 32, width = kv_lora + dr;
  uint32_t seed = 100;
  for (const int64_t S : {1, 3, 63, 65, 321}) {
    for (const int64_t bs : {16, 64}) {
      for (const int64_t T : {std::min<int64_t>(S, 5), int64_t{1}}) {
        const std::vector<float> q = random_normal(T * H * (dn + dr), ++seed);
        const std::vector<float> latent = random_normal(S * width, ++seed);
        std::vector<float> w = random_normal(H * (dn + dv) * kv_lora, ++seed);
        for (float& x : w) x /= std::sqrt(static_cast<float>(kv_lora));
        const Weight kv_b{.rows = H * (dn + dv), .cols = kv_lora, .data = w.data()};
        std::vector<int64_t> q_pos(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) q_pos[t] = S - T + t;
        // Top-k: a random half of each query's visible keys, in random slots, -1 elsewhere.
        const int64_t width_k = 8;
        std::vector<int32_t> topk(static_cast<size_t>(T * width_k), -1);
        std::mt19937 rng(++seed);
        for (int64_t t = 0; t < T; ++t) {
          std::vector<int32_t> keys(static_cast<size_t>(q_pos[t] + 1));
          std::iota(keys.begin(), keys.end(), 0);
          std::shuffle(keys.begin(), keys.end(), rng);
          keys.resize(std::min<size_t>(keys.size(), width_k / 2 + t % 3));
          keys.resize(width_k, -1);
          std::shuffle(keys.begin(), keys.end(), rng);
          std::copy(keys.begin(), keys.end(), topk.begin() + t * width_k);
        }
        PagedPool pool(S, bs, bs * width * 4, ++seed);
        pool.write(latent.data(), S, width * 4);

        for (const bool absorbed : {false, true}) {
          for (const bool use_topk : {false, true}) {
            std::vector<float> out[2], lse[2];
            for (const bool paged : {false, true}) {
              out[paged].assign(T * H * dv, 0.0f);
              lse[paged].assign(T * H, 0.0f);
              MlaAttentionParams p{
                  .q = q.data(),
                  .latent = paged ? pool.page<float>(pool.bytes.data()) : latent.data(),
                  .latent_pages = paged ? pool.pages(pool.block_table.data()) : PagedRows{},
                  .kv_b = &kv_b,
                  .q_pos = q_pos.data(),
                  .topk = use_topk ? topk.data() : nullptr,
                  .topk_width = use_topk ? width_k : 0,
                  .out = out[paged].data(),
                  .lse = lse[paged].data(),
                  .num_tokens = T,
                  .num_keys = S,
                  .num_heads = H,
                  .dn = dn,
                  .dr = dr,
                  .dv = dv,
                  .kv_lora = kv_lora,
                  .softmax_scale = 1.0f / std::sqrt(static_cast<float>(dn + dr))};
              absorbed ? cpu::mla_attention_absorbed(p) : cpu::mla_attention_expanded(p);
            }
            const std::string what =
                str_cat(absorbed ? "absorbed" : "expanded", use_topk ? " top-k" : " dense", " S ",
                        S, " T ", T, " bs ", bs);
            EXPECT_TRUE(same_bits(out[1], out[0])) << what << " out";
            EXPECT_TRUE(same_bits(lse[1], lse[0])) << what << " lse";
          }
        }
      }
    }
  }
}

// Indexer scores over paged keys (fp32, and fp32 quantized by the scorer) and over a paged
// FP8 cache page [bs x d codes | bs fp32 scales] equal the contiguous results bitwise.
TEST(PagedCache, CpuIndexerScoresPagedEqualContiguousBitwise) {
  const int64_t H = 4;
  uint32_t seed = 200;
  for (const int64_t S : {1, 3, 63, 65, 321}) {
    for (const int64_t d : {32, 128}) {
      const int64_t bs = 64, T = std::min<int64_t>(S, 5);
      const std::vector<float> q = random_normal(T * H * d, ++seed);
      const std::vector<float> k = random_normal(S * d, ++seed);
      const std::vector<float> hw = random_normal(T * H, ++seed);
      std::vector<int64_t> q_pos(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) q_pos[t] = S - T + t;
      q_pos[0] = -1;  // sees nothing
      const std::string what = str_cat("S ", S, " d ", d);

      PagedPool kpool(S, bs, bs * d * 4, ++seed);
      kpool.write(k.data(), S, d * 4);
      for (const bool fp8 : {false, true}) {
        std::vector<float> scores[2];
        for (const bool paged : {false, true}) {
          scores[paged].assign(T * S, 0.0f);
          cpu::indexer_scores(
              {.q = q.data(),
               .k = paged ? kpool.page<float>(kpool.bytes.data()) : k.data(),
               .k_pages = paged ? kpool.pages(kpool.block_table.data()) : PagedRows{},
               .head_weights = hw.data(),
               .q_pos = q_pos.data(),
               .scores = scores[paged].data(),
               .num_tokens = T,
               .num_keys = S,
               .num_heads = H,
               .head_dim = d,
               .fp8 = fp8});
        }
        EXPECT_TRUE(same_bits(scores[1], scores[0])) << what << (fp8 ? " fp8" : " fp32");
      }

      std::vector<uint8_t> codes(static_cast<size_t>(S * d));
      std::vector<float> scales(static_cast<size_t>(S));
      cpu::quantize_fp8_ue8m0(k.data(), S, d, codes.data(), scales.data());
      PagedPool cpool(S, bs, bs * (d + 4), ++seed);
      cpool.write(codes.data(), S, d);
      cpool.write(scales.data(), S, 4, bs * d);
      std::vector<float> scores[2];
      for (const bool paged : {false, true}) {
        scores[paged].assign(T * S, 0.0f);
        cpu::indexer_scores_fp8_cache(
            {.q = q.data(),
             .k_fp8 = paged ? cpool.page<uint8_t>(cpool.bytes.data()) : codes.data(),
             .k_scales = paged ? cpool.page<float>(cpool.bytes.data(), bs * d) : scales.data(),
             .k_pages = paged ? cpool.pages(cpool.block_table.data()) : PagedRows{},
             .head_weights = hw.data(),
             .q_pos = q_pos.data(),
             .scores = scores[paged].data(),
             .num_tokens = T,
             .num_keys = S,
             .num_heads = H,
             .head_dim = d});
      }
      EXPECT_TRUE(same_bits(scores[1], scores[0])) << what << " fp8 cache";
    }
  }
}

}  // namespace
}  // namespace hyserve
