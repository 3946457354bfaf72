// hyserve_mla_prefill_bench: dense MLA prefill attention on one GPU (issue 47 items 1 and 6),
// the expanded flash path (cuda.h mla_flash_prefill) beside the absorbed split-KV kernels
// (the default before it), on random inputs at the models' head sizes (dn 128, dr 64, dv 128,
// kv_lora 512): --heads (Kimi Linear 32, K2 64, DeepSeek-V3 128 at TP1; 16 at TP8),
// --tokens queries after --prefix cached keys, a bf16 latent (the serving default).
//
// FLOPs are the expanded form's, whichever form runs: 2 (dn + dr + dv) per visible
// (query, key, head) plus expanding the keys, 2 S H (dn + dv) kv_lora (the absorbed form
// computes 3.4x more for the same result). One JSON line per point: median microseconds
// (CUDA events, L2 flushed, --iters runs after warm-up), TFLOP/s and the ratio to the dense
// bf16 GEMM rate measured at the start of the run. The absorbed kernels run only where
// they take under --absorbed-max-tflop of work (they run at a few TFLOP/s).
// tools/bench_mla_torch.py times PyTorch's scaled_dot_product_attention on the same math.
// With --sparse-context: sparse (top-k) prefill over the bf16 latent instead (issue 47 item 4),
// the fp32 kernel beside the warpgroup one (run_sparse_point).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "core/dtype.h"
#include "core/weight.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/linear/cuda.h"
#include "peaks.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

constexpr int64_t kDn = 128, kDr = 64, kDv = 128, kKvLora = 512;

// kv_b_proj of h heads in bf16, ~N(0, 1/kv_lora) (its device data and the Weight over it).
struct KvB {
  cuda::DeviceBuffer data;
  Weight w;
  explicit KvB(int64_t h)
      : data(cuda::to_device(random_normal_bf16(h * (kDn + kDv) * kKvLora, 3, 0.044f))) {
    w.rows = h * (kDn + kDv);
    w.cols = kKvLora;
    w.dtype = DType::kBF16;
    w.data = data.data();
  }
};

// The call's parameters at the models' head sizes over a bf16 latent; the caller adds its
// positions hint or top-k lists.
MlaAttentionParams bench_params(const cuda::DeviceBuffer& q, const cuda::DeviceBuffer& latent,
                                const KvB& kv_b, const cuda::DeviceBuffer& pos,
                                cuda::DeviceBuffer& out, cuda::DeviceBuffer& lse, int64_t tokens,
                                int64_t keys, int64_t heads) {
  return {.q = q.as<float>(),
          .latent_bf16 = latent.as<uint16_t>(),
          .kv_b = &kv_b.w,
          .q_pos = pos.as<int64_t>(),
          .out = out.as<float>(),
          .lse = lse.as<float>(),
          .num_tokens = tokens,
          .num_keys = keys,
          .num_heads = heads,
          .dn = kDn,
          .dr = kDr,
          .dv = kDv,
          .kv_lora = kKvLora,
          .softmax_scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr))};
}

struct Point {
  int64_t heads, tokens, prefix;
};

void run_point(const Point& pt, int iters, double bf16_rate, double absorbed_max_tflop) {
  const int64_t t = pt.tokens, s = pt.prefix + pt.tokens, h = pt.heads;
  cuda::DeviceBuffer q = cuda::to_device(random_normal_f32(t * h * (kDn + kDr), 1));
  cuda::DeviceBuffer latent = cuda::to_device(random_normal_bf16(s * (kKvLora + kDr), 2));
  const KvB kv_b(h);
  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos[i] = pt.prefix + i;
  cuda::DeviceBuffer d_pos = cuda::to_device(pos);
  cuda::DeviceBuffer out(sizeof(float) * t * h * kDv), lse(sizeof(float) * t * h);
  MlaAttentionParams p = bench_params(q, latent, kv_b, d_pos, out, lse, t, s, h);
  p.q_pos_first = pt.prefix;
  const double pairs = static_cast<double>(t) * pt.prefix + t * (t + 1) / 2.0;
  const double flop = 2.0 * h * (kDn + kDr + kDv) * pairs + 2.0 * s * h * (kDn + kDv) * kKvLora;
  cuda::Blas blas(nullptr);
  FlushedTimer timer(iters);
  const auto report = [&](const char* impl, float us) {
    const double tflops = flop / (us * 1e-6) / 1e12;
    const nlohmann::json j = {{"bench", "mla_prefill"},
                              {"impl", impl},
                              {"heads", h},
                              {"tokens", t},
                              {"prefix", pt.prefix},
                              {"latent", "bf16"},
                              {"us", us},
                              {"tflops", tflops},
                              {"ratio_bf16_peak", tflops * 1e12 / bf16_rate}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  // The mma.sync kernel in both block sizes, then the warpgroup one.
  const struct {
    const char* impl;
    cuda::MlaFlashOptions options;
  } flashes[] = {
      {"hyserve_flash_64rows", {.block_rows = 64, .kernel = cuda::MlaFlashKernel::kMmaSync}},
      {"hyserve_flash", {.block_rows = 128, .kernel = cuda::MlaFlashKernel::kMmaSync}},
      {"hyserve_flash_wgmma", {.kernel = cuda::MlaFlashKernel::kWgmma}},
  };
  for (const auto& flash : flashes) {
    const size_t bytes = cuda::mla_flash_prefill_workspace_bytes(p, flash.options);
    cuda::DeviceBuffer ws(bytes);
    report(flash.impl, timer.time_us([&] {
      cuda::mla_flash_prefill(p, ws.data(), bytes, blas, nullptr, flash.options);
    }));
  }
  // The absorbed form computes (2 (kv_lora + dr) + 2 kv_lora) / (2 (dn + dr + dv)) = 3.4x
  // the pairs' FLOPs.
  const double absorbed_flop = 2.0 * h * (2 * kKvLora + kDr) * pairs;
  if (absorbed_flop / 1e12 <= absorbed_max_tflop) {
    const size_t bytes = cuda::mla_attention_workspace_bytes(p);
    cuda::DeviceBuffer ws(bytes);
    report("hyserve_absorbed",
           timer.time_us([&] { cuda::mla_attention_absorbed(p, ws.data(), bytes, nullptr); }));
  }
}

// Sparse MLA prefill (the DSA top-k, absorbed form) over a bf16 latent: `tokens` queries at the
// end of a `context`-key context, each attending to `topk` distinct visible keys (all of them
// when it sees fewer), the fp32 split-KV kernel beside the warpgroup one (cuda.h
// MlaSparseKernel), absorb and combine included in both. FLOPs: 2 (kv_lora + dr + kv_lora) per
// (query, listed key, head), the absorbed form's.
void run_sparse_point(int64_t h, int64_t t, int64_t context, int64_t topk, int iters,
                      double bf16_rate) {
  const int64_t width = kKvLora + kDr;
  cuda::DeviceBuffer q = cuda::to_device(random_normal_f32(t * h * (kDn + kDr), 1));
  cuda::DeviceBuffer latent = cuda::to_device(random_normal_bf16(context * width, 2));
  const KvB kv_b(h);
  std::vector<int64_t> pos(static_cast<size_t>(t));
  std::vector<int32_t> lists(static_cast<size_t>(t * topk), -1);
  std::mt19937 rng(4);
  double listed = 0.0;
  for (int64_t i = 0; i < t; ++i) {
    pos[i] = context - t + i;
    const int64_t visible = pos[i] + 1;
    const int64_t n = std::min(visible, topk);
    // n distinct positions of [0, visible): a random stride walk (sorted, as the top-k emits).
    const int64_t step = visible / n;
    std::uniform_int_distribution<int64_t> jitter(0, step - 1);
    for (int64_t j = 0; j < n; ++j)
      lists[i * topk + j] = static_cast<int32_t>(j * step + jitter(rng));
    listed += static_cast<double>(n);
  }
  cuda::DeviceBuffer d_pos = cuda::to_device(pos), d_lists = cuda::to_device(lists);
  cuda::DeviceBuffer out(sizeof(float) * t * h * kDv), lse(sizeof(float) * t * h);
  MlaAttentionParams p = bench_params(q, latent, kv_b, d_pos, out, lse, t, context, h);
  p.topk = d_lists.as<int32_t>();
  p.topk_width = topk;
  const double flop = 2.0 * h * (2 * kKvLora + kDr) * listed;
  const size_t bytes = cuda::mla_attention_workspace_bytes(p);
  cuda::DeviceBuffer ws(bytes);
  FlushedTimer timer(iters);
  const struct {
    const char* impl;
    cuda::MlaSparseKernel kernel;
  } kernels[] = {{"hyserve_sparse_fp32", cuda::MlaSparseKernel::kFp32},
                 {"hyserve_sparse_wgmma", cuda::MlaSparseKernel::kWgmma}};
  for (const auto& k : kernels) {
    const float us = timer.time_us([&] {
      cuda::mla_attention_absorbed(p, ws.data(), bytes, nullptr, false, nullptr, k.kernel);
    });
    const double tflops = flop / (us * 1e-6) / 1e12;
    const nlohmann::json j = {{"bench", "mla_sparse_prefill"},
                              {"impl", k.impl},
                              {"heads", h},
                              {"tokens", t},
                              {"context", context},
                              {"topk", topk},
                              {"latent", "bf16"},
                              {"us", us},
                              {"tflops", tflops},
                              {"ratio_bf16_peak", tflops * 1e12 / bf16_rate}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

int run(int argc, char** argv) {
  CLI::App app{"hyserve_mla_prefill_bench: dense MLA prefill, flash and absorbed"};
  std::vector<int64_t> heads = {32, 128}, tokens = {4096, 16384}, prefixes = {0};
  int iters = 5;
  double absorbed_max_tflop = 1.0;
  app.add_option("--heads", heads, "head counts")->delimiter(',');
  app.add_option("--tokens", tokens, "query counts")->delimiter(',');
  app.add_option("--prefix", prefixes, "cached keys before the queries")->delimiter(',');
  app.add_option("--iters", iters, "timed runs per point");
  app.add_option("--absorbed-max-tflop", absorbed_max_tflop,
                 "run the absorbed kernels only below this much work (TFLOP)");
  std::vector<int64_t> sparse_contexts;
  int64_t topk = 2048;
  app.add_option("--sparse-context", sparse_contexts,
                 "instead: sparse (top-k) prefill of --tokens queries at the end of contexts of "
                 "these many keys")
      ->delimiter(',');
  app.add_option("--topk", topk, "listed keys per query of the sparse points");
  CLI11_PARSE(app, argc, argv);
  const double bf16_rate = measure_bf16_gemm_rate();
  std::printf(
      "%s\n",
      nlohmann::json({{"bench", "peaks"}, {"bf16_gemm_tflops", bf16_rate / 1e12}}).dump().c_str());
  if (!sparse_contexts.empty()) {
    for (const int64_t context : sparse_contexts) {
      for (const int64_t h : heads) {
        for (const int64_t t : tokens) {
          if (t <= context) run_sparse_point(h, t, context, topk, iters, bf16_rate);
        }
      }
    }
    return 0;
  }
  for (const int64_t prefix : prefixes) {
    for (const int64_t h : heads) {
      for (const int64_t t : tokens) {
        run_point({h, t, prefix}, iters, bf16_rate, absorbed_max_tflop);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_mla_prefill_bench", hyserve::bench::run, argc, argv);
}
