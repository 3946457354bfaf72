// Routed experts' LoRA adapters in the CUDA MoE (kernels/moe/cuda/moe_lora.cuh) against the
// CPU op with the same adapters (tolerances at the test).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "gpu/moe_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/moe/cuda.h"

namespace hyserve {
namespace {

using test::Experts;
using test::Format;
using test::make_experts;
using test::mixed_routing;
using test::random_routing;
using test::Routing;
using test::Shape;
using test::Stream;

// Adapters on E experts in S slots, host and device: slot 0 rank 8 on every expert's gate,
// up and down; slot 1 none; slot 2 rank 64 on the even experts' gate and down only; slot 3
// rank 1 on expert 1's up only. Scales small (alpha / r as adapters have them).
struct ExpertAdapters {
  static constexpr int64_t kSlots = 4;
  std::vector<std::vector<float>> host_data;
  std::vector<cuda::DeviceBuffer> device_data;
  std::vector<LoraMatrices> host_table, device_table;  // [E][3][kSlots]
  std::vector<MlpLora> host_modules;                   // [E], token_slots set per call
  cuda::DeviceBuffer device_table_buf;
};

ExpertAdapters make_adapters(int64_t experts, int64_t hidden, int64_t inter, uint64_t seed) {
  ExpertAdapters a;
  const auto rank_of = [](int64_t e, int proj, int64_t slot) -> int64_t {
    if (slot == 0) return 8;
    if (slot == 2) return e % 2 == 0 && proj != 1 ? 64 : 0;
    if (slot == 3) return e == 1 && proj == 1 ? 1 : 0;
    return 0;
  };
  a.host_table.resize(static_cast<size_t>(experts * 3 * ExpertAdapters::kSlots));
  a.device_table = a.host_table;
  a.host_data.reserve(a.host_table.size() * 2);
  for (int64_t e = 0; e < experts; ++e) {
    for (int proj = 0; proj < 3; ++proj) {
      const int64_t in = proj == 2 ? inter : hidden, out = proj == 2 ? hidden : inter;
      for (int64_t slot = 0; slot < ExpertAdapters::kSlots; ++slot) {
        const int64_t r = rank_of(e, proj, slot);
        if (r == 0) continue;
        const size_t i = static_cast<size_t>((e * 3 + proj) * ExpertAdapters::kSlots + slot);
        const float scale = 0.05f * static_cast<float>(slot + 1);
        a.host_data.push_back(test::random_floats(static_cast<size_t>(r * in), seed++));
        const std::vector<float>& ha = a.host_data.back();
        a.host_data.push_back(test::random_floats(static_cast<size_t>(out * r), seed++));
        const std::vector<float>& hb = a.host_data.back();
        a.host_table[i] = {ha.data(), hb.data(), r, scale};
        a.device_data.push_back(cuda::to_device(ha));
        const float* da = a.device_data.back().as<float>();
        a.device_data.push_back(cuda::to_device(hb));
        a.device_table[i] = {da, a.device_data.back().as<float>(), r, scale};
      }
    }
  }
  for (int64_t e = 0; e < experts; ++e) {
    const LoraMatrices* base = a.host_table.data() + e * 3 * ExpertAdapters::kSlots;
    a.host_modules.push_back({nullptr,
                              {base, ExpertAdapters::kSlots},
                              {base + ExpertAdapters::kSlots, ExpertAdapters::kSlots},
                              {base + 2 * ExpertAdapters::kSlots, ExpertAdapters::kSlots}});
  }
  a.device_table_buf = cuda::to_device(a.device_table);
  return a;
}

std::vector<float> run_cpu_lora(const Experts& e, const ExpertAdapters& a,
                                const std::vector<int32_t>& token_slots,
                                const std::vector<float>& x, const Routing& r, int64_t tokens,
                                int64_t top_k) {
  const int64_t hidden = e.host_w[0].down.rows;
  std::vector<float> y(static_cast<size_t>(tokens * hidden));
  std::vector<MlpLora> modules = a.host_modules;
  for (MlpLora& m : modules) m.token_slots = token_slots.data();
  cpu::moe({.x = x.data(),
            .num_tokens = tokens,
            .hidden = hidden,
            .experts = e.host_w.data(),
            .num_experts = static_cast<int64_t>(e.host_w.size()),
            .expert_ids = r.ids.data(),
            .expert_weights = r.weights.data(),
            .top_k = top_k,
            .shared = &e.shared.w,
            .y = y.data(),
            .act = {},
            .expert_lora = modules.data()});
  return y;
}

// lora null: the call without adapters.
std::vector<float> run_gpu_lora(const Experts& e, const ExpertAdapters* a,
                                const std::vector<int32_t>& token_slots,
                                const std::vector<float>& x, const Routing& r, int64_t tokens,
                                int64_t top_k, bool batch_invariant) {
  test::RoutedLora lora;
  if (a != nullptr) {
    lora = {.table = a->device_table_buf.as<LoraMatrices>(),
            .num_slots = ExpertAdapters::kSlots,
            .token_slots = &token_slots};
  }
  return test::run_gpu(e, x, r, tokens, top_k, true, false, batch_invariant, {},
                       cuda::MoeDecodeInput::kFp32, lora);
}

// Against the CPU op with the same adapters: few tokens per expert (the GEMV kernel: abs
// 1e-4 * max(1, max|y|), rel 1e-4: fp32 both sides, summation orders differ) and the mixed
// routing (tiles past 16 tokens: x and act(gate, up) rounded to bf16 for the MMAs, abs
// 1e-2 * max|y|, rel 1e-2). Tokens of slot -1 or of a slot without matrices on their experts
// get, in batch-invariant mode, the bits of the call without adapters; each token alone the
// bits it gets in the batch; the adapters move the adapted tokens far beyond the tolerance.
TEST(GpuMoe, RoutedExpertLoraMatchesCpuAndLeavesOtherTokens) {
  REQUIRE_GPU();
  uint64_t seed = 90000;
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4}) {
    for (Shape sh : std::vector<Shape>{{64, 96}, {320, 192}}) {
      const int64_t num_experts = 8, top_k = 3;
      const Experts e = make_experts(num_experts, sh.hidden, sh.inter, f, seed);
      const ExpertAdapters a = make_adapters(num_experts, sh.hidden, sh.inter, seed + 50);
      seed += 1000;
      for (const int64_t tokens : {1, 5, 65}) {
        for (const bool bi : {false, true}) {
          SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(sh.hidden) +
                       " T=" + std::to_string(tokens) + (bi ? " batch-invariant" : ""));
          const std::vector<float> x =
              test::random_floats(static_cast<size_t>(tokens * sh.hidden), seed++);
          const Routing r = tokens > 16 ? mixed_routing(tokens, top_k, seed++)
                                        : random_routing(tokens, top_k, num_experts, seed++);
          std::vector<int32_t> slots(static_cast<size_t>(tokens));
          for (int64_t t = 0; t < tokens; ++t) slots[t] = static_cast<int32_t>(t % 5) - 1;
          if (tokens == 1) slots[0] = 0;
          const std::vector<float> want = run_cpu_lora(e, a, slots, x, r, tokens, top_k);
          const std::vector<float> got = run_gpu_lora(e, &a, slots, x, r, tokens, top_k, bi);
          const bool tiles = bi || tokens > 16;
          const float peak = test::max_abs(want);
          EXPECT_TRUE(tiles ? test::all_close(got, want, 1e-2f * peak, 1e-2f)
                            : test::all_close(got, want, 1e-4f * std::max(1.0f, peak), 1e-4f));
          const std::vector<float> plain = run_gpu_lora(e, nullptr, slots, x, r, tokens, top_k, bi);
          const int64_t d = sh.hidden;
          for (int64_t t = 0; t < tokens; ++t) {
            const bool none = slots[t] < 0 || slots[t] == 1 ||
                              (slots[t] == 3 &&
                               std::find(r.ids.begin() + t * top_k, r.ids.begin() + (t + 1) * top_k,
                                         1) == r.ids.begin() + (t + 1) * top_k);
            const std::vector<float> row_got(got.begin() + t * d, got.begin() + (t + 1) * d);
            const std::vector<float> row_plain(plain.begin() + t * d, plain.begin() + (t + 1) * d);
            if (none && bi) {
              EXPECT_EQ(0, std::memcmp(row_got.data(), row_plain.data(), d * 4)) << "token " << t;
            }
            if (slots[t] == 0) {
              EXPECT_FALSE(test::all_close(row_got, row_plain, 1e-2f * peak, 1e-2f))
                  << "token " << t << ": the adapter changed nothing";
            }
          }
          if (bi && tokens > 1) {
            for (const int64_t t : {int64_t{1}, tokens - 1}) {
              const std::vector<float> xt(x.begin() + t * d, x.begin() + (t + 1) * d);
              Routing rt;
              rt.ids.assign(r.ids.begin() + t * top_k, r.ids.begin() + (t + 1) * top_k);
              rt.weights.assign(r.weights.begin() + t * top_k, r.weights.begin() + (t + 1) * top_k);
              const std::vector<float> one =
                  run_gpu_lora(e, &a, {slots[t]}, xt, rt, 1, top_k, true);
              EXPECT_EQ(0, std::memcmp(one.data(), got.data() + t * d, d * 4)) << "token " << t;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
