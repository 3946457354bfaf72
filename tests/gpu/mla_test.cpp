// CUDA MLA attention (absorbed, split-KV) against the CPU absorbed op: dense causal and
// top-k, prefill and decode, long contexts (many splits), queries that see no key, and
// kv_b in every Weight format (F32, BF16, FP8 block, MXFP4).
#include "kernels/attention/mla/cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "gpu/gpu_test_util.h"
#include "gpu/mla_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/attention/latent/cpu.h"
#include "kernels/attention/latent/cuda.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/linear/cuda.h"

namespace hyserve {
namespace {

using namespace mla_test;

TEST(GpuMla, DenseAndTopkMatchCpuOnAwkwardShapes) {
  REQUIRE_GPU();
  uint32_t seed = 1;
  for (const bool big : {false, true}) {
    for (const int64_t T : {0, 1, 3, 65}) {
      for (const int64_t S : {0, 1, 3, 63, 321}) {
        for (const int64_t H : {1, 3}) {
          const Sizes z = big ? Sizes{T, S, H, 128, 64, 128, 512} : Sizes{T, S, H, 32, 16, 32, 64};
          // Prefill at the end of the cache (first queries may see nothing when T > S).
          const int64_t first_pos = S - T;
          Problem pr(z, first_pos, ++seed);
          check(pr, Format::kF32, false, true, name_of(z, first_pos, "dense"));
          pr.make_topk(big ? 64 : 7, ++seed);
          check(pr, Format::kF32, true, true, name_of(z, first_pos, "topk"));
        }
      }
    }
  }
}

// kv_b's LoRA adapters in low-rank form (params.h): queries of slots with a rank-8 and a
// rank-64 adapter, one without matrices and none, over dense and top-k keys, fp32 and bf16
// kv_b, the split-KV kernels and the dense-prefill GEMM path: the CPU op's outputs within
// the tolerances above; the adapters move the outputs far beyond them.
TEST(GpuMla, KvBLoraMatchesCpu) {
  REQUIRE_GPU();
  test::Stream stream;
  cuda::Blas blas(stream.s);
  uint32_t seed = 1300;
  for (const Sizes z : {Sizes{7, 40, 3, 32, 16, 32, 64}, Sizes{65, 321, 2, 128, 64, 128, 512}}) {
    Problem pr(z, z.num_keys - z.num_tokens, ++seed);
    const KvBLora lora(z, ++seed);
    for (const Format f : {Format::kF32, Format::kBF16}) {
      const std::string what =
          name_of(z, pr.q_pos[0], "lora") + (f == Format::kF32 ? " f32" : " bf16");
      std::vector<float> with, without;
      check(pr, f, false, true, what + " dense", false, &with, nullptr, nullptr, &lora);
      check(pr, f, false, true, what + " dense plain", false, &without);
      EXPECT_FALSE(test::all_close(with, without, 1e-2f, 1e-2f)) << what << ": no effect";
      check(pr, f, false, true, what + " batch-invariant", true, nullptr, nullptr, nullptr, &lora);
      if (z.num_tokens >= 64) {
        check(pr, f, false, true, what + " GEMM prefill", false, nullptr, nullptr, &blas, &lora);
      }
    }
    pr.make_topk(16, ++seed);
    check(pr, Format::kF32, true, true, name_of(z, pr.q_pos[0], "lora topk"), false, nullptr,
          nullptr, nullptr, &lora);
    // The call's heads a view of the second half of B's rows.
    const KvBLora upper(z, ++seed, z.num_heads * (z.dn + z.dv));
    check(pr, Format::kF32, false, true, name_of(z, pr.q_pos[0], "lora row0"), false, nullptr,
          nullptr, nullptr, &upper);
  }
}

// The dense-prefill GEMM path (cuBLAS, bf16 inputs): prefills of 64 (the threshold), 65 and
// 300 queries, over no prefix, a short one, and one past a key chunk (4,096 keys); 300 x 16
// (t, h) rows cross a row chunk (4,096 rows). The bf16-kv_b runs also pass the positions hint
// (q_pos_first), which skips the keys a row chunk cannot see: the same results.
TEST(GpuMla, DensePrefillGemmMatchesCpu) {
  REQUIRE_GPU();
  test::Stream stream;
  cuda::Blas blas(stream.s);
  uint32_t seed = 900;
  struct Case {
    int64_t T, first_pos, H;
  };
  for (const Case c : {Case{64, 0, 1}, Case{65, 37, 3}, Case{300, 0, 16}, Case{65, 4100, 3}}) {
    const Sizes z{c.T, c.first_pos + c.T, c.H, 128, 64, 128, 512};
    Problem pr(z, c.first_pos, ++seed);
    check(pr, Format::kF32, false, true, name_of(z, c.first_pos, "dense GEMM"), false, nullptr,
          nullptr, &blas);
    check(pr, Format::kBF16, false, true, name_of(z, c.first_pos, "dense GEMM, bf16 kv_b"), false,
          nullptr, nullptr, &blas);
  }
}

TEST(GpuMla, LongContextDecodeSplitsKeys) {
  REQUIRE_GPU();
  for (const int64_t S : {5000, 20000}) {
    const Sizes z{1, S, 3, 128, 64, 128, 512};
    Problem pr(z, S - 1, 50 + S);
    check(pr, Format::kF32, false, true, name_of(z, S - 1, "dense decode"));
    pr.make_topk(2048, 51);
    check(pr, Format::kF32, true, true, name_of(z, S - 1, "topk decode"));
    // Decode beyond the cache end (q_pos >= S): every key visible.
    Problem late(z, S + 10, 52);
    check(late, Format::kF32, false, false, name_of(z, S + 10, "dense late"));
  }
}

TEST(GpuMla, AllMaskedQueriesGiveZeroAndMinusInf) {
  REQUIRE_GPU();
  const Sizes z{4, 10, 3, 32, 16, 32, 64};
  Problem pr(z, -4, 60);  // q_pos -4..-1: no key visible
  check(pr, Format::kF32, false, true, "dense all masked");
  pr.make_topk(5, 61);  // every slot -1
  check(pr, Format::kF32, true, true, "topk all masked");
}

TEST(GpuMla, EveryWeightFormatMatchesCpu) {
  REQUIRE_GPU();
  for (const Format f : {Format::kF32, Format::kBF16, Format::kFp8, Format::kMxfp4}) {
    const Sizes z{3, 200, 3, 128, 64, 128, 512};
    Problem pr(z, 197, 70);
    const std::string name = "format " + std::to_string(static_cast<int>(f));
    check(pr, f, false, true, name + " dense");
    pr.make_topk(64, 71);
    check(pr, f, true, true, name + " topk");
  }
}

// The bf16 latent: the GPU reads bf16 rows and widens them exactly, so it gives bitwise
// what its fp32 path gives over the rounded values (dense and top-k, prefill and decode);
// the CPU's bf16 path agrees within check()'s tolerance. round_bf16 equals the CPU's bits
// (NaN and halfway cases included).
TEST(GpuMla, Bf16LatentEqualsFp32OfTheRoundedValues) {
  REQUIRE_GPU();
  for (const int64_t T : {1, 5}) {
    const Sizes z{T, 300, 3, 128, 64, 128, 512};
    Problem pr(z, 300 - T, 90 + static_cast<uint32_t>(T));
    std::vector<float> x = pr.latent;
    x.insert(x.end(), {std::nanf(""), 1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, -0.0f,
                       std::numeric_limits<float>::infinity(), 3.4e38f});
    const DeviceBuffer d_x = to_device(x);
    DeviceBuffer d_bits(x.size() * 2);
    cuda::round_bf16({d_x.as<float>(), static_cast<int64_t>(x.size()), d_bits.as<uint16_t>()},
                     nullptr);
    std::vector<uint16_t> want_bits(x.size());
    cpu::round_bf16({x.data(), static_cast<int64_t>(x.size()), want_bits.data()});
    CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(to_host<uint16_t>(d_bits, x.size()), want_bits);
    for (size_t i = 0; i < pr.latent.size(); ++i) pr.latent[i] = bf16_to_f32(want_bits[i]);
    pr.make_topk(64, 91);
    const StoredWeight w(pr.kv_b, z.num_heads * (z.dn + z.dv), z.kv_lora, Format::kF32);
    for (const bool use_topk : {false, true}) {
      std::vector<float> fp32_out;
      check(pr, Format::kF32, use_topk, true, use_topk ? "topk" : "dense", false, &fp32_out);
      MlaAttentionParams p = pr.params(&w.host, use_topk);
      const DeviceInputs in(pr);
      in.bind(p, &w.device, use_topk);
      p.latent = nullptr;
      p.latent_bf16 = d_bits.as<uint16_t>();
      DeviceBuffer d_out(sizeof(float) * fp32_out.size());
      p.out = d_out.as<float>();
      const size_t ws_bytes = cuda::mla_attention_workspace_bytes(p);
      DeviceBuffer ws(ws_bytes);
      cuda::mla_attention_absorbed(p, ws.data(), ws_bytes, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<float>(d_out, fp32_out.size()), fp32_out) << "T=" << T << " " << use_topk;
    }
  }
}

TEST(GpuMla, RefusesSmallWorkspace) {
  REQUIRE_GPU();
  const Sizes z{2, 10, 1, 32, 16, 32, 64};
  Problem pr(z, 8, 80);
  const StoredWeight w(pr.kv_b, 64, 64, Format::kF32);
  DeviceBuffer d_q = to_device(pr.q), d_latent = to_device(pr.latent), d_pos = to_device(pr.q_pos),
               d_out(sizeof(float) * 2 * 32);
  MlaAttentionParams p = pr.params(&w.device, false);
  p.q = d_q.as<float>();
  p.latent = d_latent.as<float>();
  p.q_pos = d_pos.as<int64_t>();
  p.out = d_out.as<float>();
  const size_t need = cuda::mla_attention_workspace_bytes(p);
  DeviceBuffer ws(need);
  EXPECT_THROW(cuda::mla_attention_absorbed(p, ws.data(), need - 1, nullptr), InvalidArgument);
}

// Batch-invariant mode (one split per query): a query computed alone, with only its own
// visible keys in the call (S = q_pos + 1), gives the same bits as inside a 65-query call
// over 3,000 keys, where the default plan would split the keys differently. The batched
// call also matches the CPU as check() requires.
TEST(GpuMla, BatchInvariantQueryAloneEqualsInBatch) {
  REQUIRE_GPU();
  for (const bool use_topk : {false, true}) {
    const Sizes z{65, 3000, 3, 128, 64, 128, 512};
    Problem pr(z, z.num_keys - z.num_tokens, 60);
    if (use_topk) pr.make_topk(2048, 61);
    std::vector<float> all_out, all_lse;
    check(pr, Format::kF32, use_topk, /*with_lse=*/true, name_of(z, pr.q_pos[0], "invariant"),
          /*batch_invariant=*/true, &all_out, &all_lse);
    ASSERT_EQ(all_lse.size(), static_cast<size_t>(z.num_tokens * z.num_heads));
    const StoredWeight w(pr.kv_b, z.num_heads * (z.dn + z.dv), z.kv_lora, Format::kF32);
    const DeviceInputs in(pr);
    MlaAttentionParams p = pr.params(&w.device, use_topk);
    in.bind(p, &w.device, use_topk);
    const int64_t q_width = z.num_heads * (z.dn + z.dr);
    for (const int64_t t : {0, 1, 31, 64}) {
      MlaAttentionParams one = p;
      one.q = in.q.as<float>() + t * q_width;
      one.q_pos = in.pos.as<int64_t>() + t;
      if (use_topk) one.topk = in.topk.as<int32_t>() + t * pr.topk_width;
      one.num_tokens = 1;
      one.num_keys = pr.q_pos[t] + 1;
      DeviceBuffer o1(sizeof(float) * z.num_heads * z.dv), l1(sizeof(float) * z.num_heads);
      one.out = o1.as<float>();
      one.lse = l1.as<float>();
      DeviceBuffer ws1(cuda::mla_attention_workspace_bytes(one));
      cuda::mla_attention_absorbed(one, ws1.data(), ws1.size(), nullptr, /*batch_invariant=*/true);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got_out = to_host<float>(o1, z.num_heads * z.dv);
      const std::vector<float> got_lse = to_host<float>(l1, z.num_heads);
      ASSERT_EQ(0, std::memcmp(got_out.data(), all_out.data() + t * z.num_heads * z.dv,
                               got_out.size() * sizeof(float)))
          << "out of query " << t << ", top-k " << use_topk;
      ASSERT_EQ(0, std::memcmp(got_lse.data(), all_lse.data() + t * z.num_heads,
                               got_lse.size() * sizeof(float)))
          << "lse of query " << t << ", top-k " << use_topk;
    }
  }
}

// The workspace is sized once at warm-up for the step's tokens; a longer context must
// never need more (the memory budget counts no context term for it).
TEST(GpuMla, WorkspaceDoesNotGrowWithContext) {
  MlaAttentionParams p;
  p.num_heads = 96;
  p.dn = 128;
  p.dr = 64;
  p.dv = 128;
  p.kv_lora = 512;
  for (const int64_t tokens : {1, 8, 64, 4096}) {
    p.num_tokens = tokens;
    p.topk = nullptr;
    p.num_keys = 1;
    const size_t short_context = cuda::mla_attention_workspace_bytes(p);
    const size_t short_gemm = cuda::mla_attention_workspace_bytes(p, /*gemm_prefill=*/true);
    p.num_keys = int64_t{1} << 20;
    EXPECT_EQ(cuda::mla_attention_workspace_bytes(p), short_context) << tokens << " tokens";
    EXPECT_EQ(cuda::mla_attention_workspace_bytes(p, true), short_gemm) << tokens << " tokens";
    EXPECT_EQ(short_gemm > short_context, tokens >= cuda::kMlaGemmMinTokens) << tokens;
    static const int32_t kDummy = 0;
    p.topk = &kDummy;
    p.topk_width = 2048;
    EXPECT_EQ(cuda::mla_attention_workspace_bytes(p), short_context) << tokens << " tokens, top-k";
  }
}

}  // namespace
}  // namespace hyserve
