// Shared by the MLA GPU tests (mla_test.cpp: the absorbed kernels; mla_prefill_test.cpp: the
// prefill kernels on tensor cores): random problems, kv_b stored in every Weight format, kv_b's
// LoRA adapters, inputs on the device and the absorbed op's check against the CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/linear/cuda.h"

namespace hyserve::mla_test {

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
inline void check(const Problem& pr, Format format, bool use_topk, bool with_lse,
                  const std::string& what, bool batch_invariant = false,
                  std::vector<float>* got_out_copy = nullptr,
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
  // Exactly this call's workspace, as the CUDA backend sizes it.
  const size_t ws_bytes =
      cuda::mla_attention_call_workspace_bytes(p, blas != nullptr, batch_invariant);
  ASSERT_LE(ws_bytes, cuda::mla_attention_workspace_bytes(p, blas != nullptr)) << what;
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

inline std::string name_of(const Sizes& z, int64_t first_pos, const char* form) {
  return std::string(form) + " T=" + std::to_string(z.num_tokens) +
         " S=" + std::to_string(z.num_keys) + " H=" + std::to_string(z.num_heads) +
         " kv_lora=" + std::to_string(z.kv_lora) + " first_pos=" + std::to_string(first_pos);
}

// The bounds of the kernels with bf16 MMA inputs (q, the latent or K / V, P: 2^-9 relative
// each, summed with random signs): out within 1e-2 of its largest value + 2e-2 relative, lse
// (O(1..10)) within 5e-2 + 1e-2 relative; a query that sees no key: out exactly 0, lse exactly
// -inf.
inline void expect_bf16_attention_close(const std::vector<float>& got_out,
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

}  // namespace hyserve::mla_test
