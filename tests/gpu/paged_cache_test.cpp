// The CUDA kernels on the packed block cache: scatter_rows writes and gather_rows reads the
// same bytes as the CPU ops (every word-size path: 16-, 4- and 1-byte aligned rows, padding
// slots), and MLA attention and the indexer scores read latents and keys in shuffled blocks
// (block table in device memory) to the same bits as from a contiguous array.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/attention/indexer/cpu.h"
#include "kernels/attention/indexer/cuda.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/cache/cpu.h"
#include "kernels/cache/cuda.h"
#include "paged_test_util.h"
#include "util/error.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::PagedPool;
using test::same_bits;
using test::same_bytes;

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Rows of a sequence at positions [bs - 3, 3 bs + 6) in shuffled blocks, every 7th a
// padding row (slot -1), into a pool of random bytes; the page starts 16-aligned (256) or
// only 4-aligned (132) in its row. row_bytes 2304 and 160 take the 16-byte path (when the
// page is), 132 and 4 the 4-byte path, 33 the byte path.
TEST(GpuPagedCache, ScatterRowsEqualsCpuBytewise) {
  REQUIRE_GPU();
  uint32_t seed = 1;
  for (const int64_t row_bytes : {4, 33, 132, 160, 2304}) {
    for (const int64_t bs : {64, 128}) {
      for (const int64_t page_offset : {256, 132}) {
        const int64_t stride = (page_offset + bs * row_bytes + 64 + 255) / 256 * 256;
        const int64_t num_blocks = 6, first = bs - 3, n = 2 * bs + 9;
        const std::vector<int32_t> ids = {4, 1, 5, 0};
        std::vector<int64_t> slots(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          const int64_t pos = first + i;
          slots[i] = i % 7 == 3 ? -1 : ids[pos / bs] * bs + pos % bs;
        }
        const std::vector<uint8_t> rows = random_bytes(static_cast<size_t>(n * row_bytes), ++seed);
        std::vector<uint8_t> want = random_bytes(static_cast<size_t>(num_blocks * stride), ++seed);
        DeviceBuffer d_pool = to_device(want), d_rows = to_device(rows), d_slots = to_device(slots);
        ScatterRowsParams p{.src = rows.data(),
                            .slots = slots.data(),
                            .dst = want.data() + page_offset,
                            .num_rows = n,
                            .row_bytes = row_bytes,
                            .block_size = bs,
                            .block_stride_bytes = stride};
        cpu::scatter_rows(p);
        p.src = d_rows.data();
        p.slots = d_slots.as<int64_t>();
        p.dst = d_pool.as<uint8_t>() + page_offset;
        cuda::scatter_rows(p, nullptr);
        p.num_rows = 0;  // no rows: a no-op
        cuda::scatter_rows(p, nullptr);
        sync();
        EXPECT_TRUE(same_bytes(to_host<uint8_t>(d_pool, want.size()), want))
            << "row_bytes " << row_bytes << ", block_size " << bs << ", page offset "
            << page_offset;
      }
    }
  }
}

TEST(GpuPagedCache, ScatterRowsRefusesBadArguments) {
  REQUIRE_GPU();
  DeviceBuffer src(64), slots(16), dst(4096);
  ScatterRowsParams p{.src = src.data(),
                      .slots = slots.as<int64_t>(),
                      .dst = dst.data(),
                      .num_rows = 2,
                      .row_bytes = 32,
                      .block_size = 4,
                      .block_stride_bytes = 127};
  EXPECT_THROW(cuda::scatter_rows(p, nullptr), InvalidArgument);  // stride < a page
  p.block_stride_bytes = 128;
  p.dst = nullptr;
  EXPECT_THROW(cuda::scatter_rows(p, nullptr), InvalidArgument);
}

// gather_rows (the cache read of DCP's gathered context) equals the CPU op bytewise on every
// word-size path: rows of 2304 and 160 bytes from a 16-aligned page into packed or 16-byte
// strided buffers take the 16-byte path, 132 and 4 (or a 4-aligned page) the 4-byte path,
// 33 the byte path; from shuffled blocks (block table in device memory) and from contiguous
// rows, the bytes between strided rows untouched.
TEST(GpuPagedCache, GatherRowsEqualsCpuBytewise) {
  REQUIRE_GPU();
  uint32_t seed = 70;
  for (const int64_t row_bytes : {4, 33, 132, 160, 2304}) {
    for (const int64_t bs : {1, 64}) {
      for (const int64_t page_offset : {256, 132}) {
        const int64_t n = 2 * bs + 9;
        const int64_t stride = (page_offset + bs * row_bytes + 64 + 255) / 256 * 256;
        const std::vector<int32_t> table = [&] {
          std::vector<int32_t> ids(static_cast<size_t>((n + bs - 1) / bs + 2));
          std::iota(ids.begin(), ids.end(), 0);
          std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
          return ids;
        }();
        const std::vector<uint8_t> pool =
            random_bytes(static_cast<size_t>(std::ssize(table) * stride), ++seed);
        const std::vector<uint8_t> flat_rows =
            random_bytes(static_cast<size_t>(n * row_bytes), ++seed);
        const DeviceBuffer d_pool = to_device(pool), d_table = to_device(table),
                           d_flat = to_device(flat_rows);
        for (const int64_t dst_stride : {row_bytes, row_bytes + 16}) {
          for (const bool paged : {true, false}) {
            SCOPED_TRACE(testing::Message() << row_bytes << " B rows, block_size " << bs
                                            << ", page offset " << page_offset << ", dst stride "
                                            << dst_stride << (paged ? ", paged" : ", contiguous"));
            std::vector<uint8_t> want = random_bytes(static_cast<size_t>(n * dst_stride), ++seed);
            DeviceBuffer d_out = to_device(want);
            GatherRowsParams p{
                .src = paged ? pool.data() + page_offset : flat_rows.data(),
                .src_pages = paged ? PagedRows{table.data(), bs, stride} : PagedRows{},
                .dst = want.data(),
                .num_rows = n,
                .row_bytes = row_bytes,
                .dst_stride_bytes = dst_stride};
            cpu::gather_rows(p);
            p.src = paged ? d_pool.as<uint8_t>() + page_offset : d_flat.as<uint8_t>();
            if (paged) p.src_pages.block_table = d_table.as<int32_t>();
            p.dst = d_out.data();
            cuda::gather_rows(p, nullptr);
            p.num_rows = 0;  // no rows: a no-op
            cuda::gather_rows(p, nullptr);
            sync();
            EXPECT_TRUE(same_bytes(to_host<uint8_t>(d_out, want.size()), want));
          }
        }
      }
    }
  }
}

TEST(GpuPagedCache, GatherRowsRefusesBadArguments) {
  REQUIRE_GPU();
  DeviceBuffer src(4096), table(8), dst(64);
  GatherRowsParams p{.src = src.data(),
                     .src_pages = {table.as<int32_t>(), 4, 127},
                     .dst = dst.data(),
                     .num_rows = 2,
                     .row_bytes = 32,
                     .dst_stride_bytes = 32};
  EXPECT_THROW(cuda::gather_rows(p, nullptr), InvalidArgument);  // stride < a page
  p.src_pages.block_stride_bytes = 128;
  p.dst_stride_bytes = 16;
  EXPECT_THROW(cuda::gather_rows(p, nullptr), InvalidArgument);  // rows overlap
}

struct MlaSizes {
  int64_t num_tokens, num_keys, num_heads, dn, dr, dv, kv_lora;
};

// One MLA problem with its latents both contiguous and paged, on the host and the device.
struct PagedMla {
  MlaSizes z;
  std::vector<float> q, latent, kv_b;
  std::vector<int64_t> q_pos;
  std::vector<int32_t> topk;
  int64_t topk_width = 0;
  PagedPool pool;
  Weight w_host, w_dev;
  DeviceBuffer d_q, d_latent, d_pool, d_table, d_pos, d_topk, d_kv_b;

  PagedMla(MlaSizes sizes, int64_t bs, uint32_t seed)
      : z(sizes), pool(sizes.num_keys, bs, bs * (sizes.kv_lora + sizes.dr) * 4, seed) {
    const int64_t width = z.kv_lora + z.dr;
    // As tests/gpu/mla_test.cpp: N(0, 1) inputs, kv_b ~ N(0, 1/kv_lora).
    q = test::random_normal(z.num_tokens * z.num_heads * (z.dn + z.dr), seed + 1);
    latent = test::random_normal(z.num_keys * width, seed + 2);
    kv_b = test::random_normal(z.num_heads * (z.dn + z.dv) * z.kv_lora, seed + 3,
                               1.0f / std::sqrt(static_cast<float>(z.kv_lora)));
    for (int64_t t = 0; t < z.num_tokens; ++t) q_pos.push_back(z.num_keys - z.num_tokens + t);
    // Top-k: up to 64 of each query's visible keys (at least one), in random slots.
    topk_width = 64;
    topk.assign(z.num_tokens * topk_width, -1);
    std::mt19937 rng(seed + 4);
    for (int64_t t = 0; t < z.num_tokens; ++t) {
      std::vector<int32_t> keys(static_cast<size_t>(q_pos[t] + 1));
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      keys.resize(std::min<size_t>(keys.size(), static_cast<size_t>(1 + t * 17 % topk_width)));
      keys.resize(static_cast<size_t>(topk_width), -1);
      std::shuffle(keys.begin(), keys.end(), rng);
      std::copy(keys.begin(), keys.end(), topk.begin() + t * topk_width);
    }
    pool.write(latent.data(), z.num_keys, width * 4);
    w_host = Weight{.rows = z.num_heads * (z.dn + z.dv), .cols = z.kv_lora, .data = kv_b.data()};
    d_q = to_device(q);
    d_latent = to_device(latent);
    d_pool = to_device(pool.bytes);
    d_table = to_device(pool.block_table);
    d_pos = to_device(q_pos);
    d_topk = to_device(topk);
    d_kv_b = to_device(kv_b);
    w_dev = w_host;
    w_dev.data = d_kv_b.data();
  }

  MlaAttentionParams params(bool device, bool paged, bool use_topk, float* out, float* lse) const {
    const float* page = pool.page<float>(device ? d_pool.as<uint8_t>() : pool.bytes.data());
    const int32_t* table = device ? d_table.as<int32_t>() : pool.block_table.data();
    return {.q = device ? d_q.as<float>() : q.data(),
            .latent = paged ? page : (device ? d_latent.as<float>() : latent.data()),
            .latent_pages = paged ? pool.pages(table) : PagedRows{},
            .kv_b = device ? &w_dev : &w_host,
            .q_pos = device ? d_pos.as<int64_t>() : q_pos.data(),
            .topk = use_topk ? (device ? d_topk.as<int32_t>() : topk.data()) : nullptr,
            .topk_width = use_topk ? topk_width : 0,
            .out = out,
            .lse = lse,
            .num_tokens = z.num_tokens,
            .num_keys = z.num_keys,
            .num_heads = z.num_heads,
            .dn = z.dn,
            .dr = z.dr,
            .dv = z.dv,
            .kv_lora = z.kv_lora,
            .softmax_scale = 1.0f / std::sqrt(static_cast<float>(z.dn + z.dr))};
  }

  // CUDA absorbed attention: out [T, H, dv], lse [T, H].
  void run_cuda(bool paged, bool use_topk, std::vector<float>& out, std::vector<float>& lse) const {
    const int64_t rows = z.num_tokens * z.num_heads;
    DeviceBuffer d_out(sizeof(float) * rows * z.dv), d_lse(sizeof(float) * rows);
    const MlaAttentionParams p =
        params(true, paged, use_topk, d_out.as<float>(), d_lse.as<float>());
    const size_t ws_bytes = cuda::mla_attention_workspace_bytes(p);
    DeviceBuffer ws(ws_bytes);
    cuda::mla_attention_absorbed(p, ws.data(), ws_bytes, nullptr);
    sync();
    out = to_host<float>(d_out, rows * z.dv);
    lse = to_host<float>(d_lse, rows);
  }
};

// CUDA paged == CUDA contiguous bitwise (same kernel, same split plan, same values read);
// CUDA paged against the CPU paged op within tests/gpu/mla_test.cpp's tolerance (out: 2e-5
// absolute + 1e-4 relative; lse: 2e-5 + 2e-6), decode and prefill, up to a 5000-key split
// decode.
TEST(GpuPagedCache, MlaAbsorbedPagedEqualsContiguous) {
  REQUIRE_GPU();
  uint32_t seed = 10;
  for (const bool big : {false, true}) {
    for (const int64_t S : {1, 3, 63, 65, 321, 5000}) {
      for (const int64_t T : {int64_t{1}, std::min<int64_t>(S, 5)}) {
        for (const int64_t bs : {64, 128}) {
          const MlaSizes z =
              big ? MlaSizes{T, S, 3, 128, 64, 128, 512} : MlaSizes{T, S, 3, 32, 16, 32, 64};
          const PagedMla pr(z, bs, seed += 10);
          for (const bool use_topk : {false, true}) {
            const std::string what = str_cat(use_topk ? "top-k" : "dense", big ? " big" : " small",
                                             " S ", S, " T ", T, " bs ", bs);
            std::vector<float> out[2], lse[2];
            pr.run_cuda(false, use_topk, out[0], lse[0]);
            pr.run_cuda(true, use_topk, out[1], lse[1]);
            EXPECT_TRUE(same_bits(out[1], out[0])) << what << " out";
            EXPECT_TRUE(same_bits(lse[1], lse[0])) << what << " lse";

            std::vector<float> want_out(out[0].size()), want_lse(lse[0].size());
            cpu::mla_attention_absorbed(
                pr.params(false, true, use_topk, want_out.data(), want_lse.data()));
            EXPECT_TRUE(test::all_close(out[1], want_out, 2e-5f, 1e-4f)) << what << " out vs CPU";
            EXPECT_TRUE(test::all_close(lse[1], want_lse, 2e-5f, 2e-6f)) << what << " lse vs CPU";
          }
        }
      }
    }
  }
}

// Indexer scores with paged keys == contiguous keys, bitwise: fp32 keys, fp32 keys
// quantized by the scorer (fp8 = true), and an FP8 cache page [bs x d codes | bs scales].
TEST(GpuPagedCache, IndexerScoresPagedEqualContiguous) {
  REQUIRE_GPU();
  uint32_t seed = 500;
  for (const int64_t S : {1, 3, 63, 65, 321, 2000}) {
    for (const int64_t d : {32, 128}) {
      const int64_t H = 4, bs = 64, T = std::min<int64_t>(S, 5);
      const std::vector<float> q = test::random_floats(T * H * d, ++seed);
      const std::vector<float> k = test::random_floats(S * d, ++seed);
      const std::vector<float> hw = test::random_floats(T * H, ++seed);
      std::vector<int64_t> q_pos(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) q_pos[t] = S - T + t;
      q_pos[0] = -1;  // sees nothing
      const std::string what = str_cat("S ", S, " d ", d);
      DeviceBuffer d_q = to_device(q), d_k = to_device(k), d_hw = to_device(hw),
                   d_pos = to_device(q_pos), d_scores(sizeof(float) * T * S);

      PagedPool kpool(S, bs, bs * d * 4, ++seed);
      kpool.write(k.data(), S, d * 4);
      DeviceBuffer d_kpool = to_device(kpool.bytes), d_ktable = to_device(kpool.block_table);
      for (const bool fp8 : {false, true}) {
        std::vector<float> scores[2];
        for (const bool paged : {false, true}) {
          cuda::indexer_scores(
              {.q = d_q.as<float>(),
               .k = paged ? kpool.page<float>(d_kpool.as<uint8_t>()) : d_k.as<float>(),
               .k_pages = paged ? kpool.pages(d_ktable.as<int32_t>()) : PagedRows{},
               .head_weights = d_hw.as<float>(),
               .q_pos = d_pos.as<int64_t>(),
               .scores = d_scores.as<float>(),
               .num_tokens = T,
               .num_keys = S,
               .num_heads = H,
               .head_dim = d,
               .fp8 = fp8},
              nullptr);
          sync();
          scores[paged] = to_host<float>(d_scores, T * S);
        }
        EXPECT_TRUE(same_bits(scores[1], scores[0])) << what << (fp8 ? " fp8" : " fp32");
      }

      std::vector<uint8_t> codes(static_cast<size_t>(S * d));
      std::vector<float> scales(static_cast<size_t>(S));
      cpu::quantize_fp8_ue8m0(k.data(), S, d, codes.data(), scales.data());
      PagedPool cpool(S, bs, bs * (d + 4), ++seed);
      cpool.write(codes.data(), S, d);
      cpool.write(scales.data(), S, 4, bs * d);
      DeviceBuffer d_codes = to_device(codes), d_scales = to_device(scales),
                   d_cpool = to_device(cpool.bytes), d_ctable = to_device(cpool.block_table);
      std::vector<float> scores[2];
      for (const bool paged : {false, true}) {
        cuda::indexer_scores_fp8_cache(
            {.q = d_q.as<float>(),
             .k_fp8 = paged ? cpool.page<uint8_t>(d_cpool.as<uint8_t>()) : d_codes.as<uint8_t>(),
             .k_scales =
                 paged ? cpool.page<float>(d_cpool.as<uint8_t>(), bs * d) : d_scales.as<float>(),
             .k_pages = paged ? cpool.pages(d_ctable.as<int32_t>()) : PagedRows{},
             .head_weights = d_hw.as<float>(),
             .q_pos = d_pos.as<int64_t>(),
             .scores = d_scores.as<float>(),
             .num_tokens = T,
             .num_keys = S,
             .num_heads = H,
             .head_dim = d},
            nullptr);
        sync();
        scores[paged] = to_host<float>(d_scores, T * S);
      }
      EXPECT_TRUE(same_bits(scores[1], scores[0])) << what << " fp8 cache";
    }
  }
}

}  // namespace
}  // namespace hyserve
