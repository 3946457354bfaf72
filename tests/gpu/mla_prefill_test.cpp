// The MLA prefill kernels on tensor cores against the CPU absorbed op: the expanded flash
// prefill (mma.sync and warpgroup kernels), sparse MLA over the bf16 latent on warpgroup MMAs,
// and the per-call workspace sizes.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/mla_test_util.h"
#include "kernels/attention/mla/cuda.h"

namespace hyserve {
namespace {

using namespace mla_test;

// A dense prefill the flash path takes needs only the flash plan (no q_abs, no partials), far
// less than the any-call bound at many tokens; a decode batch (own tables) the absorbed plan.
TEST(GpuMla, CallWorkspaceIsTheCallsOwn) {
  REQUIRE_GPU();
  // Sizes only: no call runs.
  Weight kv_b;
  kv_b.rows = 32 * (128 + 128);
  kv_b.cols = 512;
  kv_b.dtype = DType::kBF16;
  MlaAttentionParams p{.kv_b = &kv_b,
                       .num_tokens = 4096,
                       .num_keys = 4096,
                       .num_heads = 32,
                       .dn = 128,
                       .dr = 64,
                       .dv = 128,
                       .kv_lora = 512,
                       .softmax_scale = 0.07f};
  ASSERT_TRUE(cuda::mla_flash_prefill_supports(p));
  const size_t call = cuda::mla_attention_call_workspace_bytes(p, true, false);
  EXPECT_EQ(call, cuda::mla_flash_prefill_workspace_bytes(p));
  EXPECT_LT(2 * call, cuda::mla_attention_workspace_bytes(p, true));
  // Batch-invariant and without the cuBLAS handle: the absorbed kernels' plan.
  EXPECT_EQ(cuda::mla_attention_call_workspace_bytes(p, false, false),
            cuda::mla_attention_workspace_bytes(p, false));
  EXPECT_EQ(cuda::mla_attention_call_workspace_bytes(p, true, true),
            cuda::mla_attention_workspace_bytes(p, false));
  p.num_tokens = 64;
  p.table_stride = 1;
  EXPECT_EQ(cuda::mla_attention_call_workspace_bytes(p, true, false),
            cuda::mla_attention_workspace_bytes(p, false));
}

// ---- Sparse MLA over the bf16 latent on warpgroup MMAs (cuda.h MlaSparseKernel) ----

struct SparseCase {
  int64_t num_tokens, num_keys, num_heads, topk_width, first_pos;
  int64_t block_size = 0;         // > 0: the latent in pages of this many rows
  bool per_query_tables = false;  // each query its own block table (batched decode's form)
  bool lora = false;              // kv_b's LoRA adapters (absorb and combine apply them)
};

// Against the CPU absorbed op over the same pool (the latent rounded to bf16, read through the
// same tables), at expect_bf16_attention_close's bounds (bf16 q_abs, latent, probabilities).
void check_sparse_wgmma(const SparseCase& c, uint32_t seed) {
  const Sizes z{c.num_tokens, c.num_keys, c.num_heads, 128, 64, 128, 512};
  const std::string what = name_of(z, c.first_pos, "sparse wgmma") + " width " +
                           std::to_string(c.topk_width) + " block " + std::to_string(c.block_size) +
                           (c.per_query_tables ? " own tables" : "") + (c.lora ? " lora" : "");
  Problem pr(z, c.first_pos, seed);
  for (float& x : pr.latent) x = bf16_to_f32(f32_to_bf16(x));
  pr.make_topk(c.topk_width, seed + 1);
  const int64_t width = z.kv_lora + z.dr;
  const int64_t bs = c.block_size;
  const int64_t num_blocks = bs > 0 ? (z.num_keys + bs - 1) / bs : 0;
  // Tables: the blocks in reverse order; with per-query tables, query t's rotated by t (so
  // each query reads other physical rows: its own sequence).
  const int64_t num_tables = c.per_query_tables ? z.num_tokens : 1;
  std::vector<int32_t> tables;
  for (int64_t q = 0; q < num_tables; ++q) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      tables.push_back(static_cast<int32_t>((num_blocks - 1 - b + q) % num_blocks));
    }
  }
  const int64_t pool_rows = bs > 0 ? num_blocks * bs : z.num_keys;
  std::vector<float> pool(static_cast<size_t>(std::max<int64_t>(pool_rows, 1) * width));
  std::vector<uint16_t> bits(pool.size());
  for (int64_t r = 0; r < pool_rows; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      pool[r * width + i] = pr.latent[(r % z.num_keys) * width + i];
      bits[r * width + i] = f32_to_bf16(pool[r * width + i]);
    }
  }
  const StoredWeight w(pr.kv_b, z.num_heads * (z.dn + z.dv), z.kv_lora, Format::kBF16);
  const std::optional<KvBLora> lora =
      c.lora ? std::optional<KvBLora>(std::in_place, z, seed + 2) : std::nullopt;
  const int64_t num_rows = z.num_tokens * z.num_heads;
  std::vector<float> want_out(num_rows * z.dv), want_lse(num_rows);
  MlaAttentionParams p = pr.params(&w.host, true);
  p.latent = pool.data();
  if (bs > 0) {
    p.latent_pages = {tables.data(), bs, bs * width * 4};
    p.table_stride = c.per_query_tables ? num_blocks : 0;
  }
  p.out = want_out.data();
  p.lse = want_lse.data();
  if (lora) lora->bind_host(p);
  cpu::mla_attention_absorbed(p);

  const DeviceInputs in(pr);
  in.bind(p, &w.device, true);
  const DeviceBuffer d_bits = to_device(bits), d_tables = to_device(tables);
  p.latent = nullptr;
  p.latent_bf16 = d_bits.as<uint16_t>();
  if (bs > 0) p.latent_pages = {d_tables.as<int32_t>(), bs, bs * width * 2};
  if (lora) lora->bind_device(p);
  DeviceBuffer d_out(sizeof(float) * want_out.size()), d_lse(sizeof(float) * want_lse.size());
  p.out = d_out.as<float>();
  p.lse = d_lse.as<float>();
  ASSERT_TRUE(cuda::mla_sparse_wgmma_supports(p)) << what;
  const size_t ws_bytes = cuda::mla_attention_workspace_bytes(p);
  DeviceBuffer ws(ws_bytes);
  cuda::mla_attention_absorbed(p, ws.data(), ws_bytes, nullptr, false, nullptr,
                               cuda::MlaSparseKernel::kWgmma);
  CUDA_CHECK(cudaDeviceSynchronize());
  expect_bf16_attention_close(to_host<float>(d_out, want_out.size()), want_out,
                              to_host<float>(d_lse, want_lse.size()), want_lse, z.dv, what);
}

// One query and a partial head group; lists wider than the context (most slots -1, whole
// tiles of them skipped); 96 heads (a full group and a partial one) with a width that is not a
// multiple of the 64-key tile over a paged latent; the first queries seeing no key; batched
// decode's per-query tables; kv_b's LoRA adapters.
TEST(GpuMla, SparseWgmmaBf16MatchesCpu) {
  REQUIRE_GPU();
  uint32_t seed = 7000;
  check_sparse_wgmma({1, 300, 3, 64, 299}, seed += 10);
  check_sparse_wgmma({65, 321, 64, 2048, 256}, seed += 10);
  check_sparse_wgmma({130, 3000, 96, 100, 2870, 64}, seed += 10);
  check_sparse_wgmma({40, 30, 16, 64, -10}, seed += 10);
  check_sparse_wgmma({6, 500, 8, 128, 494, 32, /*per_query_tables=*/true}, seed += 10);
  check_sparse_wgmma({7, 200, 16, 64, 193, 0, false, /*lora=*/true}, seed += 10);
}

// ---- The expanded flash prefill (cuda.h mla_flash_prefill), called directly ----

constexpr cuda::MlaFlashKernel kWgmma = cuda::MlaFlashKernel::kWgmma;

struct FlashCase {
  bool bf16_latent = false;
  int64_t block_size = 0;      // > 0: the latent in pages of this many rows, in reverse order
  bool hint = false;           // pass q_pos_first
  int64_t max_chunk_keys = 0;  // > 0: several chunks of keys
  int block_rows = 0;          // 0: the default (128 at 192/128 heads); 64: the 4-warp blocks
  cuda::MlaFlashKernel kernel = cuda::MlaFlashKernel::kMmaSync;
};

// Against the CPU absorbed op over the same (rounded, for a bf16 latent) values, at
// expect_bf16_attention_close's bounds (bf16 q, latent, kv_b, K, V, P).
void check_flash(const Problem& pr, Format format, const FlashCase& fc, const std::string& what) {
  const Sizes& z = pr.z;
  const StoredWeight w(pr.kv_b, z.num_heads * (z.dn + z.dv), z.kv_lora, format);
  const int64_t width = z.kv_lora + z.dr;
  std::vector<uint16_t> bits(pr.latent.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(pr.latent[i]);
  const int64_t num_rows = z.num_tokens * z.num_heads;
  std::vector<float> want_out(num_rows * z.dv), want_lse(num_rows);
  MlaAttentionParams p = pr.params(&w.host, false);
  if (fc.bf16_latent) {
    p.latent = nullptr;
    p.latent_bf16 = bits.data();
  }
  p.out = want_out.data();
  p.lse = want_lse.data();
  cpu::mla_attention_absorbed(p);

  // The latent on the device: contiguous, or pages (block b of the sequence at physical
  // page num_blocks - 1 - b).
  const size_t elem = fc.bf16_latent ? 2 : 4;
  const int64_t rows_alloc = fc.block_size > 0
                                 ? (z.num_keys + fc.block_size - 1) / fc.block_size * fc.block_size
                                 : z.num_keys;
  std::vector<uint8_t> pool(static_cast<size_t>(std::max<int64_t>(rows_alloc, 1) * width) * elem);
  std::vector<int32_t> table;
  const int64_t num_blocks = fc.block_size > 0 ? rows_alloc / fc.block_size : 0;
  for (int64_t b = 0; b < num_blocks; ++b)
    table.push_back(static_cast<int32_t>(num_blocks - 1 - b));
  for (int64_t s = 0; s < z.num_keys; ++s) {
    const int64_t phys =
        fc.block_size > 0 ? table[s / fc.block_size] * fc.block_size + s % fc.block_size : s;
    const void* src = fc.bf16_latent ? static_cast<const void*>(&bits[s * width])
                                     : static_cast<const void*>(&pr.latent[s * width]);
    std::memcpy(&pool[phys * width * elem], src, width * elem);
  }
  const DeviceBuffer d_pool = to_device(pool), d_table = to_device(table);
  const DeviceBuffer d_q = to_device(pr.q), d_pos = to_device(pr.q_pos);
  DeviceBuffer d_out(sizeof(float) * want_out.size()), d_lse(sizeof(float) * want_lse.size());
  p = pr.params(&w.device, false);
  p.q = d_q.as<float>();
  p.q_pos = d_pos.as<int64_t>();
  p.latent = fc.bf16_latent ? nullptr : d_pool.as<float>();
  p.latent_bf16 = fc.bf16_latent ? d_pool.as<uint16_t>() : nullptr;
  if (fc.block_size > 0) {
    p.latent_pages = {d_table.as<int32_t>(), fc.block_size,
                      static_cast<int64_t>(fc.block_size * width * elem)};
  }
  if (fc.hint) p.q_pos_first = pr.q_pos.at(0);
  p.out = d_out.as<float>();
  p.lse = d_lse.as<float>();
  ASSERT_TRUE(cuda::mla_flash_prefill_supports(p)) << what;
  test::Stream stream;
  cuda::Blas blas(stream.s);
  const cuda::MlaFlashOptions options{
      .max_chunk_keys = fc.max_chunk_keys, .block_rows = fc.block_rows, .kernel = fc.kernel};
  const size_t ws_bytes = cuda::mla_flash_prefill_workspace_bytes(p, options);
  DeviceBuffer ws(ws_bytes);
  cuda::mla_flash_prefill(p, ws.data(), ws_bytes, blas, stream.s, options);
  CUDA_CHECK(cudaStreamSynchronize(stream.s));
  expect_bf16_attention_close(to_host<float>(d_out, want_out.size()), want_out,
                              to_host<float>(d_lse, want_lse.size()), want_lse, z.dv, what);
}

// Awkward query counts (1, 63, 65, 200: partial 64-row blocks) over contexts shorter and
// longer than the queries (the first queries of T > S see nothing), one and three heads,
// K3's head sizes (the 192/128 variant) and small ones (the 64/64 variant, K3's tiny
// test checkpoints' 24/16 too), kv_b stored as bf16 (read in place) and f32 (decoded); the
// mma.sync kernel in both block sizes and the warpgroup kernel (128-query blocks, so a
// warpgroup of padding rows at T = 1, 63 and the second block's skipped tiles at 200).
TEST(GpuMlaFlash, AwkwardShapesMatchCpu) {
  REQUIRE_GPU();
  uint32_t seed = 5000;
  for (const int64_t T : {1, 63, 65, 200}) {
    for (const int64_t S : {1, 64, 321}) {
      for (const int64_t H : {1, 3}) {
        const Sizes z{T, S, H, 128, 64, 128, 512};
        Problem pr(z, S - T, ++seed);
        check_flash(pr, Format::kBF16, {}, name_of(z, S - T, "flash bf16 kv_b"));
        check_flash(pr, Format::kBF16, {.block_rows = 64}, name_of(z, S - T, "flash 64 rows"));
        check_flash(pr, Format::kBF16, {.kernel = kWgmma}, name_of(z, S - T, "flash wgmma"));
        if (T == 65) check_flash(pr, Format::kF32, {}, name_of(z, S - T, "flash f32 kv_b"));
      }
    }
  }
  for (const Sizes z : {Sizes{65, 321, 3, 32, 16, 32, 64}, Sizes{100, 150, 4, 16, 8, 16, 32}}) {
    Problem pr(z, z.num_keys - z.num_tokens, ++seed);
    check_flash(pr, Format::kBF16, {}, name_of(z, pr.q_pos[0], "flash small heads"));
  }
  // Heads padded to the 192/128 kernels (q width 128 of 192, dv 80 of 128), both kernels.
  const Sizes padded{130, 300, 2, 96, 32, 80, 128};
  Problem pr(padded, padded.num_keys - padded.num_tokens, ++seed);
  check_flash(pr, Format::kBF16, {}, name_of(padded, pr.q_pos[0], "flash padded heads"));
  check_flash(pr, Format::kBF16, {.kernel = kWgmma},
              name_of(padded, pr.q_pos[0], "flash wgmma padded heads"));
}

// kv_b in FP8 blocks and MXFP4 (decoded to bf16 once per call); the bf16 latent in pages of
// 16 rows in reverse physical order with the positions hint; several chunks of keys (the
// running max, sum and O carried between chunks in `out` and the workspace) with a prefix
// before the queries, over contiguous and paged latents.
TEST(GpuMlaFlash, FormatsPagesAndChunksMatchCpu) {
  REQUIRE_GPU();
  uint32_t seed = 6000;
  const Sizes z{65, 200, 3, 128, 64, 128, 512};
  Problem pr(z, 135, ++seed);
  check_flash(pr, Format::kFp8, {}, "flash fp8 kv_b");
  check_flash(pr, Format::kMxfp4, {}, "flash mxfp4 kv_b");
  const Sizes long_z{100, 700, 2, 128, 64, 128, 512};
  Problem prefix(long_z, 600, ++seed);
  check_flash(prefix, Format::kBF16, {.bf16_latent = true, .block_size = 16, .hint = true},
              "flash bf16 latent paged hint");
  check_flash(prefix, Format::kBF16,
              {.bf16_latent = true, .block_size = 16, .hint = true, .kernel = kWgmma},
              "flash wgmma bf16 latent paged hint");
  check_flash(pr, Format::kFp8, {.kernel = kWgmma}, "flash wgmma fp8 kv_b");
  for (const int64_t chunk : {64, 128, 320}) {
    const std::string c = " chunk " + std::to_string(chunk);
    check_flash(prefix, Format::kBF16, {.max_chunk_keys = chunk}, "flash chunks" + c);
    check_flash(prefix, Format::kBF16, {.max_chunk_keys = chunk, .block_rows = 64},
                "flash chunks 64 rows" + c);
    check_flash(prefix, Format::kBF16,
                {.bf16_latent = true, .block_size = 64, .hint = true, .max_chunk_keys = chunk},
                "flash chunks paged hint" + c);
    check_flash(prefix, Format::kBF16, {.max_chunk_keys = chunk, .kernel = kWgmma},
                "flash wgmma chunks" + c);
  }
  // Queries in the middle of the keys (keys past the last query unseen), several chunks.
  Problem middle(long_z, 250, ++seed);
  check_flash(middle, Format::kBF16, {.max_chunk_keys = 128}, "flash middle chunks");
  check_flash(middle, Format::kBF16, {.max_chunk_keys = 128, .kernel = kWgmma},
              "flash wgmma middle chunks");
}

}  // namespace
}  // namespace hyserve
