// hyserve_sampler_bench: cuda::sample_tokens over K3's 163,840-entry vocabulary (issue 51
// item 1: <= 50 us at batch 1, <= 150 us at batch 64 on an H100 or H200).
//
// Rows of random logits: "peaked" (normal, sigma 6: a few hundred ids carry weight) and
// "flat" (sigma 1: every id a candidate, the sampler's worst case short of equal logits);
// options: greedy, temperature 0.8, + top-p 0.95, + top-k 50 and top-p 0.95. One JSON line per
// point: median microseconds (CUDA events, --iters runs after warm-up, L2 not flushed: the
// logits were just written by the lm_head), the logits' bytes and their rate against the
// device-to-device copy bandwidth of the same run. tools/bench_sampler_torch.py times
// PyTorch's sort-based top-k / top-p sampling on the same shapes.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "kernels/sampling/cuda.h"
#include "peaks.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

int run(int argc, char** argv) {
  CLI::App app{"the CUDA sampler over a large vocabulary"};
  std::vector<int64_t> batches = {1, 2, 4, 8, 64, 256};
  int64_t vocab = 163840;
  app.add_option("--batches", batches, "rows")->delimiter(',');
  app.add_option("--vocab", vocab, "vocabulary")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  CHECK(cuda::device_count() > 0, "no GPU");
  const double copy_bw = measure_copy_bandwidth();
  std::printf("%s\n", nlohmann::json({{"bench", "copy"}, {"gbps", copy_bw / 1e9}}).dump().c_str());
  struct Options {
    const char* name;
    SamplingOptions o;
  };
  const std::vector<Options> options = {
      {"greedy", {}},
      {"t0.8", {.temperature = 0.8f}},
      {"t0.8_p0.95", {.temperature = 0.8f, .top_p = 0.95f}},
      {"t0.8_k50_p0.95", {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f}},
  };
  for (const char* shape : {"peaked", "flat"}) {
    for (int64_t rows : batches) {
      std::mt19937 rng(static_cast<uint32_t>(rows));
      std::normal_distribution<float> d(0.0f, std::string(shape) == "peaked" ? 6.0f : 1.0f);
      std::vector<float> logits(static_cast<size_t>(rows * vocab));
      for (float& v : logits) v = d(rng);
      const cuda::DeviceBuffer dl = cuda::to_device(logits);
      cuda::DeviceBuffer tokens(static_cast<size_t>(rows) * 4);
      cuda::DeviceBuffer ws(static_cast<size_t>(sampling::sample_workspace_bytes(rows, vocab)));
      for (const Options& opt : options) {
        std::vector<SamplingOptions> per_row(static_cast<size_t>(rows), opt.o);
        for (int64_t r = 0; r < rows; ++r) per_row[r].seed = static_cast<uint64_t>(r);
        const cuda::DeviceBuffer dopt = cuda::to_device(per_row);
        const SampleParams p{.logits = dl.as<float>(),
                             .options = dopt.as<SamplingOptions>(),
                             .tokens = tokens.as<int32_t>(),
                             .num_rows = rows,
                             .vocab = vocab,
                             .workspace = ws.data(),
                             .workspace_bytes = ws.size()};
        const float ms = median_event_ms([&] { cuda::sample_tokens(p, nullptr); });
        const double bytes = static_cast<double>(rows * vocab * 4);
        const double us = ms * 1e3;
        nlohmann::json j = {{"bench", "sampler"},
                            {"impl", "hyserve"},
                            {"logits", shape},
                            {"options", opt.name},
                            {"batch", rows},
                            {"vocab", vocab},
                            {"us", us},
                            {"logit_bytes", bytes},
                            {"gbps", bytes / (us * 1e-6) / 1e9},
                            {"ratio_to_copy", bytes / (us * 1e-6) / copy_bw}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_sampler_bench", hyserve::bench::run, argc, argv);
}
