// BlockTable slots under DCP and the page-address arithmetic, against naive formulas and a
// byte-ownership map of whole rows (every byte of a page belongs to one layer and slot).
#include "kv/block_table.h"

#include <map>

#include <gtest/gtest.h>

#include "model/config.h"
#include "util/error.h"

namespace hyserve {
namespace {

// Layers K K M K M; fp8 latent 38 B, fp8 index keys 36 B per token; KDA 2 heads x 4.
ModelConfig small_config() {
  ModelConfig c;
  c.num_hidden_layers = 5;
  c.layer_kinds = {LayerKind::kKda, LayerKind::kKda, LayerKind::kMla, LayerKind::kKda,
                   LayerKind::kMla};
  c.mlp_kinds.assign(5, MlpKind::kDense);
  c.kv_lora_rank = 30;
  c.qk_rope_head_dim = 8;
  c.index_n_heads = 1;
  c.index_head_dim = 32;
  c.linear_num_heads = 2;
  c.linear_head_dim = 4;
  c.linear_conv_kernel = 4;
  return c;
}

TEST(BlockTableTest, SlotsFollowTheDcpInterleave) {
  for (int64_t dcp : {1, 3}) {
    for (int64_t bs : {1, 4, 16}) {
      BlockTable table(bs, dcp);
      const std::vector<int32_t> blocks = {7, 2, 9, 0, 5};
      table.append(std::span(blocks).first(2));
      table.append(std::span(blocks).subspan(2));
      ASSERT_EQ(table.capacity_tokens(), 5 * bs * dcp);
      std::map<std::tuple<int32_t, int32_t, int32_t>, int64_t> owner;
      for (int64_t p = 0; p < table.capacity_tokens(); ++p) {
        const Slot s = table.slot(p);
        const int64_t local = p / dcp;
        EXPECT_EQ(s.rank, p % dcp) << p;
        EXPECT_EQ(s.block, blocks[local / bs]) << p;
        EXPECT_EQ(s.offset, local % bs) << p;
        EXPECT_EQ(table.slot_index(p), int64_t{s.block} * bs + s.offset) << p;
        EXPECT_TRUE(owner.emplace(std::tuple{s.rank, s.block, s.offset}, p).second)
            << "positions " << owner[{s.rank, s.block, s.offset}] << " and " << p
            << " share a slot";
      }
      EXPECT_THROW(table.slot(table.capacity_tokens()), InvalidArgument);
      EXPECT_THROW(table.slot(-1), InvalidArgument);
    }
  }
  BlockTable empty(16);
  EXPECT_EQ(empty.capacity_tokens(), 0);
  EXPECT_THROW(empty.slot(0), InvalidArgument);
  EXPECT_FALSE(empty.state_block().has_value());
  empty.set_state_block(3);
  EXPECT_EQ(empty.state_block(), 3);
  const std::vector<int32_t> bad = {-1};
  EXPECT_THROW(empty.append(bad), InvalidArgument);
}

TEST(BlockTableTest, PageAddressesByHand) {
  // bs 8: row 2048; layer 2 pages at 0 / 512, layer 4 at 1024 / 1536 (cache_plan_test).
  const CachePlan plan = plan_cache(small_config().cache_spec(), {.tp = 2, .min_block_size = 1});
  ASSERT_EQ(plan.row_bytes, 2048);
  const uint64_t base = 0x10000;
  EXPECT_EQ(row_address(base, plan, 3), base + 3 * 2048);
  EXPECT_EQ(latent_page_address(base, plan, 3, 4), base + 3 * 2048 + 1024);
  EXPECT_EQ(index_page_address(base, plan, 3, 4), base + 3 * 2048 + 1536);
  EXPECT_EQ(latent_slot_address(base, plan, {.block = 3, .offset = 5}, 2), base + 6144 + 5 * 38);
  // FP8 index keys: 8 x 32 code bytes, then 8 x 4 scale bytes.
  EXPECT_EQ(index_slot_address(base, plan, {.block = 3, .offset = 5}, 2),
            base + 6144 + 512 + 5 * 32);
  EXPECT_EQ(index_scale_slot_address(base, plan, {.block = 3, .offset = 5}, 2),
            base + 6144 + 512 + 8 * 32 + 5 * 4);
  const KdaStateAddress s = kda_state_address(base, plan, 6, 3);
  EXPECT_EQ(s.conv, base + 6 * 2048 + 1024);
  EXPECT_EQ(s.recurrent, base + 6 * 2048 + 1280);
  EXPECT_THROW(latent_page_address(base, plan, 0, 1), InvalidArgument);  // a KDA layer
  EXPECT_THROW(kda_state_address(base, plan, 0, 2), InvalidArgument);    // an MLA layer
  EXPECT_THROW(row_address(base, plan, -1), InvalidArgument);
  EXPECT_THROW(latent_slot_address(base, plan, {.block = 0, .offset = 8}, 2), InvalidArgument);
}

// Every token slot of every layer, and every KDA tensor, owns a disjoint byte range inside
// its row; pages are 256-B aligned.
TEST(BlockTableTest, PagesAndStatesTileTheRowWithoutOverlap) {
  const ModelConfig c = small_config();
  for (int64_t min_bs : {1, 64}) {
    const CachePlan plan = plan_cache(c.cache_spec(), {.tp = 2, .min_block_size = min_bs});
    const uint64_t base = 1 << 20;
    for (int32_t block : {0, 1, 5}) {
      const uint64_t row = row_address(base, plan, block);
      std::vector<int> owner(plan.row_bytes, -1);
      int id = 0;
      auto claim = [&](uint64_t begin, int64_t size, const char* what) {
        ASSERT_GE(begin, row) << what;
        ASSERT_LE(begin + size, row + plan.row_bytes) << what;
        for (int64_t i = 0; i < size; ++i) {
          int& o = owner[begin - row + i];
          ASSERT_EQ(o, -1) << what << " overlaps at row byte " << begin - row + i;
          o = id;
        }
        ++id;
      };
      for (const CachePage& page : plan.pages) {
        EXPECT_EQ(latent_page_address(base, plan, block, page.layer) % kCachePageAlignBytes, 0u);
        EXPECT_EQ(index_page_address(base, plan, block, page.layer) % kCachePageAlignBytes, 0u);
        for (int32_t off = 0; off < plan.block_size; ++off) {
          const Slot s{.block = block, .offset = off};
          claim(latent_slot_address(base, plan, s, page.layer), 38, "latent");
          claim(index_slot_address(base, plan, s, page.layer), 32, "index codes");
          claim(index_scale_slot_address(base, plan, s, page.layer), 4, "index scale");
        }
      }
      int64_t claimed = 0;
      for (int o : owner) claimed += o >= 0;
      EXPECT_EQ(claimed + plan.padding_bytes, plan.row_bytes);

      std::fill(owner.begin(), owner.end(), -1);
      for (const KdaStatePage& kp : plan.kda_pages) {
        const KdaStateAddress s = kda_state_address(base, plan, block, kp.layer);
        EXPECT_EQ(s.conv % kCachePageAlignBytes, 0u);
        EXPECT_EQ(s.recurrent % kCachePageAlignBytes, 0u);
        claim(s.conv, kp.conv_bytes, "conv");
        claim(s.recurrent, kp.recurrent_bytes, "recurrent");
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
