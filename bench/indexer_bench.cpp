// hyserve_indexer_bench: the DSA indexer's prefill logits on one GPU (issue 47 items 2 and 6):
// a chunk of --queries queries at the end of a --context-key context (the model scores its
// prefill in chunks of 256 queries against every cached key), FP8 index keys with a ue8m0 scale
// per key (the cache's format), --heads index heads of 128 dims, each tensor-core scorer
// (cuda.h IndexerScorer: mma.sync, FP8 warpgroup MMAs).
//
// FLOPs: 2 Hi 128 per visible (query, key) pair, the causal ones only (what the scorers compute;
// the ReLU, head weights and sum are not counted). One JSON line per point and scorer: median
// microseconds (CUDA events, L2 flushed, --iters runs after warm-up), TFLOP/s and the ratios to
// the dense FP8 (cuBLASLt e4m3) and bf16 (cuBLAS) GEMM rates measured at the start of the run.
// tools/bench_indexer_torch.py times PyTorch's FP8 GEMM (torch._scaled_mm) on the same math.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "kernels/attention/indexer/cpu.h"
#include "kernels/attention/indexer/cuda.h"
#include "peaks.h"

namespace hyserve::bench {
namespace {

constexpr int64_t kDim = 128;

struct Rates {
  double fp8, bf16;
};

void run_point(int64_t heads, int64_t queries, int64_t context, int iters, const Rates& rates) {
  // Keys quantized as the cache holds them (per key, ue8m0), on the host once.
  std::vector<float> k = random_normal_f32(context * kDim, 2);
  std::vector<uint8_t> k8(static_cast<size_t>(context * kDim));
  std::vector<float> k_scales(static_cast<size_t>(context));
  cpu::quantize_fp8_ue8m0(k.data(), context, kDim, k8.data(), k_scales.data());
  k.clear();
  k.shrink_to_fit();
  std::vector<int64_t> pos(static_cast<size_t>(queries));
  for (int64_t i = 0; i < queries; ++i) pos[i] = context - queries + i;
  cuda::DeviceBuffer q = cuda::to_device(random_normal_f32(queries * heads * kDim, 1));
  cuda::DeviceBuffer w = cuda::to_device(random_normal_f32(queries * heads, 3));
  cuda::DeviceBuffer d_k8 = cuda::to_device(k8), d_scales = cuda::to_device(k_scales);
  cuda::DeviceBuffer d_pos = cuda::to_device(pos);
  cuda::DeviceBuffer scores(sizeof(float) * queries * context);
  const IndexerFp8CacheScoreParams p{.q = q.as<float>(),
                                     .k_fp8 = d_k8.as<uint8_t>(),
                                     .k_scales = d_scales.as<float>(),
                                     .head_weights = w.as<float>(),
                                     .q_pos = d_pos.as<int64_t>(),
                                     .scores = scores.as<float>(),
                                     .num_tokens = queries,
                                     .num_keys = context,
                                     .num_heads = heads,
                                     .head_dim = kDim};
  const double pairs =
      static_cast<double>(queries) * (context - queries) + queries * (queries + 1) / 2.0;
  const double flop = 2.0 * heads * kDim * pairs;
  FlushedTimer timer(iters);
  const struct {
    const char* impl;
    cuda::IndexerScorer scorer;
  } scorers[] = {{"hyserve_mma_sync", cuda::IndexerScorer::kMmaSync},
                 {"hyserve_wgmma", cuda::IndexerScorer::kWgmma}};
  for (const auto& s : scorers) {
    const float us = timer.time_us([&] { cuda::indexer_scores_fp8_cache(p, nullptr, s.scorer); });
    const double rate = flop / (us * 1e-6);
    const nlohmann::json j = {{"bench", "indexer_logits"},
                              {"impl", s.impl},
                              {"heads", heads},
                              {"queries", queries},
                              {"context", context},
                              {"us", us},
                              {"tflops", rate / 1e12},
                              {"ratio_fp8_peak", rate / rates.fp8},
                              {"ratio_bf16_peak", rate / rates.bf16}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

int run(int argc, char** argv) {
  CLI::App app{"hyserve_indexer_bench: the DSA indexer's prefill logits, both tensor-core scorers"};
  std::vector<int64_t> heads = {32, 64}, queries = {256}, contexts = {131072, 1048576};
  int iters = 5;
  app.add_option("--heads", heads, "index head counts (16, 32 or 64)")->delimiter(',');
  app.add_option("--queries", queries, "queries per call (the model's chunk is 256)")
      ->delimiter(',');
  app.add_option("--context", contexts, "keys in the context (the queries are its last ones)")
      ->delimiter(',');
  app.add_option("--iters", iters, "timed runs per point");
  CLI11_PARSE(app, argc, argv);
  const Rates rates{measure_fp8_gemm_rate(), measure_bf16_gemm_rate()};
  std::printf("%s\n", nlohmann::json({{"bench", "peaks"},
                                      {"fp8_gemm_tflops", rates.fp8 / 1e12},
                                      {"bf16_gemm_tflops", rates.bf16 / 1e12}})
                          .dump()
                          .c_str());
  for (const int64_t context : contexts) {
    for (const int64_t h : heads) {
      for (const int64_t t : queries) {
        if (t <= context) run_point(h, t, context, iters, rates);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_indexer_bench", hyserve::bench::run, argc, argv);
}
