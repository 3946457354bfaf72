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
#include "gpu/test_weights.h"
#include "kernels/attention/latent/cpu.h"
#include "kernels/attention/latent/cuda.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/linear/cuda.h"

namespace hyserve {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct Sizes {
  int64_t num_tokens, num_keys, num_heads, dn, dr, dv, kv_lora;
};

enum class Format { kF32, kBF16, kFp8, kMxfp4 };

// kv_b stored in `format`, on the host (for the CPU op) and on the device.
struct StoredWeight {
  std::vector<uint8_t> data, scales;
  Weight host;
  DeviceBuffer d_data, d_scales;
  Weight device;

  StoredWeight(const std::vector<float>& w, int64_t rows, int64_t cols, Format format) {
    host.rows = rows;
    host.cols = cols;
    switch (format) {
      case Format::kF32:
        data.resize(w.size() * 4);
        std::memcpy(data.data(), w.data(), data.size());
        break;
      case Format::kBF16: {
        host.dtype = DType::kBF16;
        data.resize(w.size() * 2);
        for (size_t i = 0; i < w.size(); ++i) {
          const uint16_t b = f32_to_bf16(w[i]);
          std::memcpy(&data[2 * i], &b, 2);
        }
        break;
      }
      case Format::kFp8: {
        host.format = WeightFormat::kFp8Block;
        host.dtype = DType::kE4M3;
        host.scales_dtype = DType::kF32;
        const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
        std::vector<float> s(rb * cb, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            float& amax = s[(r / 128) * cb + c / 128];
            amax = std::max(amax, std::fabs(w[r * cols + c]));
          }
        }
        for (float& v : s) v = std::max(v, 1e-12f) / 448.0f;
        data.resize(rows * cols);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            data[r * cols + c] = f32_to_e4m3(w[r * cols + c] / s[(r / 128) * cb + c / 128]);
          }
        }
        scales.resize(s.size() * 4);
        std::memcpy(scales.data(), s.data(), scales.size());
        break;
      }
      case Format::kMxfp4: {
        host.format = WeightFormat::kMxfp4;
        host.dtype = DType::kU8;
        host.scales_dtype = DType::kE8M0;
        data.assign(rows * cols / 2, 0);
        scales.resize(rows * cols / 32);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t b = 0; b < cols / 32; ++b) {
            float amax = 1e-20f;
            for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
              amax = std::max(amax, std::fabs(w[r * cols + c]));
            }
            const int e = static_cast<int>(std::ceil(std::log2(amax / 6.0f)));
            scales[r * (cols / 32) + b] = static_cast<uint8_t>(127 + e);
            for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
              const uint8_t code = f32_to_e2m1(std::ldexp(w[r * cols + c], -e));
              data[r * cols / 2 + c / 2] |= (c % 2) ? code << 4 : code;
            }
          }
        }
        break;
      }
    }
    host.data = data.data();
    host.scales = scales.empty() ? nullptr : scales.data();
    d_data = to_device(data);
    if (!scales.empty()) d_scales = to_device(scales);
    device = host;
    device.data = d_data.data();
    device.scales = scales.empty() ? nullptr : d_scales.data();
  }
};

// Random inputs of one call; q_pos[t] = first_pos + t; optional top-k lists holding a
// random subset of each query's visible keys in random slots (-1 elsewhere).
struct Problem {
  Sizes z;
  std::vector<float> q, latent, kv_b;
  std::vector<int64_t> q_pos;
  std::vector<int32_t> topk;
  int64_t topk_width = 0;

  Problem(Sizes sizes, int64_t first_pos, uint32_t seed) : z(sizes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    q.resize(z.num_tokens * z.num_heads * (z.dn + z.dr));
    latent.resize(z.num_keys * (z.kv_lora + z.dr));
    kv_b.resize(z.num_heads * (z.dn + z.dv) * z.kv_lora);
    for (float& v : q) v = dist(rng);
    for (float& v : latent) v = dist(rng);
    const float w_std = 1.0f / std::sqrt(static_cast<float>(z.kv_lora));
    for (float& v : kv_b) v = dist(rng) * w_std;
    for (int64_t t = 0; t < z.num_tokens; ++t) q_pos.push_back(first_pos + t);
  }

  void make_topk(int64_t width, uint32_t seed) {
    std::mt19937 rng(seed);
    topk_width = width;
    topk.assign(z.num_tokens * width, -1);
    for (int64_t t = 0; t < z.num_tokens; ++t) {
      std::vector<int32_t> visible;
      for (int64_t s = 0; s < z.num_keys && s <= q_pos[t]; ++s) visible.push_back(s);
      std::shuffle(visible.begin(), visible.end(), rng);
      // Every third query keeps fewer keys than slots; some keep none.
      int64_t take = std::min<int64_t>(width, visible.size());
      if (t % 3 == 1) take /= 2;
      std::vector<int32_t> slots(width, -1);
      std::copy_n(visible.begin(), take, slots.begin());
      std::shuffle(slots.begin(), slots.end(), rng);
      std::copy(slots.begin(), slots.end(), topk.begin() + t * width);
    }
  }

  MlaAttentionParams params(const Weight* w, bool use_topk) const {
    return {.q = q.data(),
            .latent = latent.data(),
            .latent_pages = {},
            .kv_b = w,
            .q_pos = q_pos.data(),
            .topk = use_topk ? topk.data() : nullptr,
            .topk_width = use_topk ? topk_width : 0,
            .out = nullptr,
            .lse = nullptr,
            .num_tokens = z.num_tokens,
            .num_keys = z.num_keys,
            .num_heads = z.num_heads,
            .dn = z.dn,
            .dr = z.dr,
            .dv = z.dv,
            .kv_lora = z.kv_lora,
            .softmax_scale = 1.0f / std::sqrt(static_cast<float>(z.dn + z.dr))};
  }
};

// kv_b's LoRA adapters (params.h kv_b_lora) for a Problem: slots 0 (rank 8), 1 (no
// matrices), 2 (rank 64); query t takes kSlotCycle[t % 5]. Host and device copies.
struct KvBLora {
  static constexpr int32_t kSlotCycle[5] = {0, -1, 2, 1, 0};
  std::vector<std::vector<float>> a, b;
  std::vector<DeviceBuffer> d_a, d_b;
  std::vector<LoraMatrices> host, device;
  std::vector<int32_t> slots;
  DeviceBuffer d_table, d_slots;
  int64_t row0 = 0;  // the call's heads start at B's row row0 (params.h kv_b_lora_row0)

  KvBLora(const Sizes& z, uint32_t seed, int64_t b_row0 = 0)
      : a(3), b(3), host(3), device(3), row0(b_row0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t ranks[3] = {8, 0, 64};
    const float scales[3] = {2.0f, 0.0f, 0.125f};
    for (int k = 0; k < 3; ++k) {
      if (ranks[k] == 0) {
        d_a.emplace_back();
        d_b.emplace_back();
        continue;
      }
      a[k].resize(static_cast<size_t>(ranks[k] * z.kv_lora));
      b[k].resize(static_cast<size_t>((row0 + z.num_heads * (z.dn + z.dv)) * ranks[k]));
      for (float& v : a[k]) v = dist(rng) / std::sqrt(static_cast<float>(z.kv_lora));
      for (float& v : b[k]) v = 0.2f * dist(rng);
      d_a.push_back(to_device(a[k]));
      d_b.push_back(to_device(b[k]));
      host[k] = {a[k].data(), b[k].data(), ranks[k], scales[k]};
      device[k] = {d_a.back().as<float>(), d_b.back().as<float>(), ranks[k], scales[k]};
    }
    for (int64_t t = 0; t < z.num_tokens; ++t) slots.push_back(kSlotCycle[t % 5]);
    d_table = DeviceBuffer(sizeof(LoraMatrices) * 3);
    CUDA_CHECK(cudaMemcpy(d_table.data(), device.data(), sizeof(LoraMatrices) * 3,
                          cudaMemcpyHostToDevice));
    d_slots = to_device(slots);
  }
  void bind_host(MlaAttentionParams& p) const {
    p.lora_slots = slots.data();
    p.kv_b_lora = {host.data(), 3};
    p.kv_b_lora_row0 = row0;
  }
  void bind_device(MlaAttentionParams& p) const {
    p.lora_slots = d_slots.as<int32_t>();
    p.kv_b_lora = {d_table.as<LoraMatrices>(), 3};
    p.kv_b_lora_row0 = row0;
  }
};

// A Problem's inputs on the device.
struct DeviceInputs {
  DeviceBuffer q, latent, pos, topk;
  explicit DeviceInputs(const Problem& pr)
      : q(to_device(pr.q)),
        latent(to_device(pr.latent)),
        pos(to_device(pr.q_pos)),
        topk(to_device(pr.topk)) {}
  // Points p (from Problem::params) at these buffers and the device weight.
  void bind(MlaAttentionParams& p, const Weight* kv_b, bool use_topk) const {
    p.q = q.as<float>();
    p.latent = latent.as<float>();
    p.kv_b = kv_b;
    p.q_pos = pos.as<int64_t>();
    p.topk = use_topk ? topk.as<int32_t>() : nullptr;
  }
};

// Logits are O(1) (q_lat.c over kv_lora + dr terms, scaled by (dn+dr)^-0.5); the GPU sums
// the dots as warp trees with FMA and merges softmax partials (online max rescaling,
// split-KV combine) where the CPU sums sequentially: ~1e-6 relative differences in the
// logits and sums. out (O(0.1..1)): 2e-5 absolute + 1e-4 relative; lse (O(1..10)):
// 2e-5 absolute + 2e-6 relative. Empty queries: out exactly 0 and lse exactly -inf.
// batch_invariant: the kernel's batch-invariant plan. got_out_copy / got_lse_copy, when
// given, receive the GPU's results.
// blas: the dense-prefill GEMM path (bf16 inputs), checked at its own tolerance (gemm_check).
// lora: kv_b's adapters on both sides (the CPU op's low-rank form is the reference).
void check(const Problem& pr, Format format, bool use_topk, bool with_lse, const std::string& what,
           bool batch_invariant = false, std::vector<float>* got_out_copy = nullptr,
           std::vector<float>* got_lse_copy = nullptr, const cuda::Blas* blas = nullptr,
           const KvBLora* lora = nullptr) {
  const StoredWeight w(pr.kv_b, pr.z.num_heads * (pr.z.dn + pr.z.dv), pr.z.kv_lora, format);
  const int64_t num_rows = pr.z.num_tokens * pr.z.num_heads;
  std::vector<float> want_out(num_rows * pr.z.dv), want_lse(num_rows);
  MlaAttentionParams p = pr.params(&w.host, use_topk);
  p.out = want_out.data();
  p.lse = want_lse.data();
  if (lora != nullptr) lora->bind_host(p);
  cpu::mla_attention_absorbed(p);

  const DeviceInputs in(pr);
  in.bind(p, &w.device, use_topk);
  if (lora != nullptr) lora->bind_device(p);
  DeviceBuffer d_out(sizeof(float) * want_out.size()), d_lse(sizeof(float) * want_lse.size());
  p.out = d_out.as<float>();
  p.lse = with_lse ? d_lse.as<float>() : nullptr;
  // The GEMM path with bf16 kv_b also takes the positions hint (its queries are consecutive).
  if (blas != nullptr && format == Format::kBF16) p.q_pos_first = pr.q_pos.at(0);
  const size_t ws_bytes = cuda::mla_attention_workspace_bytes(p, blas != nullptr);
  DeviceBuffer ws(ws_bytes);
  cuda::mla_attention_absorbed(p, ws.data(), ws_bytes, blas != nullptr ? blas->stream() : nullptr,
                               batch_invariant, blas);
  CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> got_out = to_host<float>(d_out, want_out.size());
  if (got_out_copy != nullptr) *got_out_copy = got_out;
  if (blas != nullptr) {
    // bf16 GEMM inputs (q_abs, the latent, the probabilities: 2^-9 relative each, summed
    // over kv_lora + dr and the keys with random signs): out within 1e-2 of its largest
    // value + 2e-2 relative, lse (O(1..10)) within 5e-2 + 1e-2 relative.
    EXPECT_TRUE(test::all_close(got_out, want_out, 1e-2f * test::max_abs(want_out), 2e-2f))
        << what << " out (GEMM prefill)";
    if (with_lse) {
      EXPECT_TRUE(test::all_close(to_host<float>(d_lse, want_lse.size()), want_lse, 5e-2f, 1e-2f))
          << what << " lse (GEMM prefill)";
    }
    return;
  }
  EXPECT_TRUE(test::all_close(got_out, want_out, 2e-5f, 1e-4f)) << what << " out";
  for (int64_t r = 0; r < num_rows; ++r) {
    if (std::isinf(want_lse[r])) {
      for (int64_t d = 0; d < pr.z.dv; ++d) {
        ASSERT_EQ(got_out[r * pr.z.dv + d], 0.0f) << what << " empty row " << r;
      }
    }
  }
  if (!with_lse) return;
  const std::vector<float> got_lse = to_host<float>(d_lse, want_lse.size());
  if (got_lse_copy != nullptr) *got_lse_copy = got_lse;
  for (int64_t r = 0; r < num_rows; ++r) {
    if (std::isinf(want_lse[r]) || std::isinf(got_lse[r])) {
      ASSERT_EQ(got_lse[r], want_lse[r]) << what << " lse row " << r;
    }
  }
  EXPECT_TRUE(test::all_close(got_lse, want_lse, 2e-5f, 2e-6f)) << what << " lse";
}

std::string name_of(const Sizes& z, int64_t first_pos, const char* form) {
  return std::string(form) + " T=" + std::to_string(z.num_tokens) +
         " S=" + std::to_string(z.num_keys) + " H=" + std::to_string(z.num_heads) +
         " kv_lora=" + std::to_string(z.kv_lora) + " first_pos=" + std::to_string(first_pos);
}

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

// The bounds of the kernels with bf16 MMA inputs (q, the latent or K / V, P: 2^-9 relative
// each, summed with random signs): out within 1e-2 of its largest value + 2e-2 relative, lse
// (O(1..10)) within 5e-2 + 1e-2 relative; a query that sees no key: out exactly 0, lse exactly
// -inf.
void expect_bf16_attention_close(const std::vector<float>& got_out,
                                 const std::vector<float>& want_out,
                                 const std::vector<float>& got_lse,
                                 const std::vector<float>& want_lse, int64_t dv,
                                 const std::string& what) {
  for (size_t r = 0; r < want_lse.size(); ++r) {
    if (std::isinf(want_lse[r]) || std::isinf(got_lse[r])) {
      ASSERT_EQ(got_lse[r], want_lse[r]) << what << " lse row " << r;
      for (int64_t d = 0; d < dv; ++d) {
        ASSERT_EQ(got_out[r * dv + d], 0.0f) << what << " empty row " << r;
      }
    }
  }
  EXPECT_TRUE(test::all_close(got_out, want_out, 1e-2f * test::max_abs(want_out), 2e-2f))
      << what << " out";
  EXPECT_TRUE(test::all_close(got_lse, want_lse, 5e-2f, 1e-2f)) << what << " lse";
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
