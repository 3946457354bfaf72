// hyserve_moe_bench: the routed experts of one MoE layer (cuda::moe, no shared expert) at
// the true shapes of the three model types, on one GPU:
//   k3           Kimi K3 / K3.1 Pro latent experts: 896 experts, top-16, 3584 -> 3072 -> 3584,
//                MXFP4 (K3.md §3.5)
//   deepseek-v32 DeepSeek-V3.2: 256 experts, top-8, 7168 -> 2048 -> 7168, FP8 128x128 blocks
//   kimi-linear  Kimi Linear: 256 experts, top-8, 2304 -> 1024 -> 2304, bf16
// Weights are random (valid codes and scales of a trained model's magnitude), filled on the
// device; each expert has its own memory. Routing: top-k distinct uniformly random experts
// per token, a new draw for each timed run (8 draws cycled), so that a run's experts are not
// the previous run's; L2 is flushed before each run as well.
//
// One JSON line per (shape, batch, decode input): median microseconds of the call replayed
// as a CUDA graph (as the model's decode step runs it; eager_us: launched from the host),
// the unique experts' weight bytes (what a decode step must read), GB/s and the ratio to the
// device-to-device copy bandwidth measured at the start of the run (copy bytes read +
// written per second); and the experts' FLOPs (2 x 3 x hidden x inter per routed slot),
// TFLOP/s and the ratios to dense 8192^3 GEMM rates of the same run (bf16 cuBLAS; e4m3
// cuBLASLt), what a prefill batch is bound by. Batches past 256 tokens (prefill) are
// timed --prefill-iters times.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "kernels/linear/cuda.h"
#include "kernels/moe/cuda.h"
#include "peaks.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

struct Shape {
  std::string name;
  int64_t experts, top_k, hidden, inter;
  WeightFormat format;
};

const Shape kShapes[] = {
    {"k3", 896, 16, 3584, 3072, WeightFormat::kMxfp4},
    {"deepseek-v32", 256, 8, 7168, 2048, WeightFormat::kFp8Block},
    {"kimi-linear", 256, 8, 2304, 1024, WeightFormat::kDense},
};

__device__ __forceinline__ uint32_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// kind 0: random bytes (e2m1 codes); 1: e4m3 codes without NaN; 2: bf16 ~ U(-amp, amp);
// 3: e8m0 scales 2^-8 .. 2^-5; 4: fp32 block scales ~ 2^-8.
__global__ void fill_kernel(uint8_t* data, int64_t bytes, int kind, float amp, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i * 4 < bytes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t r = mix(seed ^ (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dULL));
    uint32_t v = r;
    if (kind == 1) {
      for (int b = 0; b < 4; ++b) {
        if (((v >> (8 * b + 0)) & 0x7fu) == 0x7fu) v ^= 1u << (8 * b);
      }
    } else if (kind == 2) {
      const float lo = (static_cast<float>(r & 0xffffu) / 65535.0f * 2.0f - 1.0f) * amp;
      const float hi = (static_cast<float>(r >> 16) / 65535.0f * 2.0f - 1.0f) * amp;
      v = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
    } else if (kind == 3) {
      v = 0;
      for (int b = 0; b < 4; ++b) v |= (119u + ((r >> (8 * b)) & 3u)) << (8 * b);
    } else if (kind == 4) {
      v = __float_as_uint(0x1p-8f * (1.0f + static_cast<float>(r & 0xffu) / 256.0f));
    }
    const int64_t n = bytes - i * 4 < 4 ? bytes - i * 4 : 4;
    for (int b = 0; b < n; ++b) data[i * 4 + b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

void fill(void* p, int64_t bytes, int kind, float amp, uint64_t seed) {
  fill_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, kind, amp, seed);
  CUDA_CHECK_LAUNCH();
}

// One matrix format's layout and its random fill.
Weight make_weight(const Shape& s, int64_t rows, int64_t cols) {
  Weight w;
  w.format = s.format;
  w.rows = rows;
  w.cols = cols;
  switch (s.format) {
    case WeightFormat::kMxfp4:
      w.dtype = DType::kU8;
      w.scales_dtype = DType::kE8M0;
      break;
    case WeightFormat::kFp8Block:
      w.dtype = DType::kE4M3;
      w.scales_dtype = DType::kF32;
      break;
    default:
      w.dtype = DType::kBF16;
      break;
  }
  return w;
}

struct ExpertMemory {
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<MlpWeights> experts;
  int64_t expert_bytes = 0;
};

ExpertMemory make_experts(const Shape& s) {
  ExpertMemory m;
  uint64_t seed = 1;
  for (int64_t e = 0; e < s.experts; ++e) {
    MlpWeights mlp{make_weight(s, s.inter, s.hidden), make_weight(s, s.inter, s.hidden),
                   make_weight(s, s.hidden, s.inter)};
    int64_t bytes = 0;
    for (Weight* w : {&mlp.gate, &mlp.up, &mlp.down}) {
      cuda::DeviceBuffer& data = m.buffers.emplace_back(static_cast<size_t>(w->data_bytes()));
      const int kind = s.format == WeightFormat::kMxfp4      ? 0
                       : s.format == WeightFormat::kFp8Block ? 1
                                                             : 2;
      fill(data.data(), w->data_bytes(), kind, 1.7f / std::sqrt(static_cast<float>(w->cols)),
           seed++);
      w->data = data.data();
      if (w->scale_bytes() > 0) {
        cuda::DeviceBuffer& scales = m.buffers.emplace_back(static_cast<size_t>(w->scale_bytes()));
        fill(scales.data(), w->scale_bytes(), s.format == WeightFormat::kMxfp4 ? 3 : 4, 0.0f,
             seed++);
        w->scales = scales.data();
      }
      bytes += w->storage_bytes();
    }
    m.expert_bytes = bytes;
    m.experts.push_back(mlp);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t unique = 0;
};

Routing random_routing(int64_t tokens, const Shape& s, std::mt19937_64& rng) {
  std::vector<int32_t> perm(static_cast<size_t>(s.experts));
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_real_distribution<float> w(0.05f, 0.3f);
  Routing r;
  std::set<int32_t> seen;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < s.top_k; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, s.experts - 1);
      std::swap(perm[i], perm[pick(rng)]);
      r.ids.push_back(perm[i]);
      r.weights.push_back(w(rng));
      seen.insert(perm[i]);
    }
  }
  r.unique = static_cast<int64_t>(seen.size());
  return r;
}

// The router's logits and selection (cuda::route_experts) at one shape and batch: the GEMV
// path against the tensor-core path (three bf16 terms of x on cuBLAS), with a bf16 gate.
void time_router(const Shape& s, int64_t batch, cudaStream_t stream, const cuda::Blas& blas,
                 FlushedTimer& timer) {
  Weight gate;
  gate.format = WeightFormat::kDense;
  gate.dtype = DType::kBF16;
  gate.rows = s.experts;
  gate.cols = s.hidden;
  cuda::DeviceBuffer gate_data(static_cast<size_t>(s.experts * s.hidden) * 2);
  fill(gate_data.data(), s.experts * s.hidden * 2, 2,
       1.0f / std::sqrt(static_cast<float>(s.hidden)), 17);
  gate.data = gate_data.data();
  cuda::DeviceBuffer x(static_cast<size_t>(batch * s.hidden) * 4);
  fill(x.data(), batch * s.hidden * 4, 4, 0.0f, 18);
  cuda::DeviceBuffer ids(static_cast<size_t>(batch * s.top_k) * 4);
  cuda::DeviceBuffer weights(static_cast<size_t>(batch * s.top_k) * 4);
  cuda::DeviceBuffer ws(cuda::router_workspace_bytes(batch, s.experts, s.hidden));
  const RouterParams p{.x = x.as<float>(),
                       .gate = &gate,
                       .num_tokens = batch,
                       .num_experts = s.experts,
                       .top_k = s.top_k,
                       .expert_ids = ids.as<int32_t>(),
                       .expert_weights = weights.as<float>()};
  float us[2];
  std::vector<int32_t> chosen[2];
  for (int i = 0; i < 2; ++i) {
    const cuda::Blas* b = i == 0 ? nullptr : &blas;
    us[i] = timer.time_us([&] { cuda::route_experts(p, ws.data(), ws.size(), stream, b); });
    CUDA_CHECK(cudaStreamSynchronize(stream));
    chosen[i] = cuda::to_host<int32_t>(ids, static_cast<size_t>(batch * s.top_k));
  }
  int64_t differ = 0;
  for (size_t i = 0; i < chosen[0].size(); ++i) differ += chosen[0][i] != chosen[1][i] ? 1 : 0;
  const double flops = 2.0 * static_cast<double>(batch * s.experts * s.hidden);
  std::printf("%s\n", nlohmann::json{{"bench", "moe_router"},
                                     {"shape", s.name},
                                     {"batch", batch},
                                     {"gemv_us", us[0]},
                                     {"tensor_core_us", us[1]},
                                     {"speedup", us[0] / us[1]},
                                     {"gemv_tflops", flops / (us[0] * 1e-6) / 1e12},
                                     {"tensor_core_tflops", 3 * flops / (us[1] * 1e-6) / 1e12},
                                     {"ids_differing", differ}}
                          .dump()
                          .c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"MoE routed experts at the model shapes"};
  std::vector<std::string> shapes = {"k3", "deepseek-v32", "kimi-linear"};
  std::vector<int64_t> batches = {1, 8, 64, 256, 4096, 16384};
  std::vector<std::string> inputs = {"fp32", "bf16"};
  int iters = 20;
  int prefill_iters = 5;
  std::vector<std::string> prefill_kernels = {"auto"};
  bool router = false;
  app.add_option("--shapes", shapes, "k3, deepseek-v32, kimi-linear")->delimiter(',');
  app.add_option("--batches", batches, "tokens per call")->delimiter(',');
  app.add_option("--inputs", inputs, "decode kernels' activations: fp32 (3 bf16 terms), bf16")
      ->delimiter(',');
  app.add_option("--iters", iters, "timed runs per point");
  app.add_option("--prefill-iters", prefill_iters, "timed runs per point past 256 tokens");
  app.add_option("--prefill-kernels", prefill_kernels,
                 "experts past 16 tokens: auto, grouped (CUTLASS), warpgroup, tiles; each listed "
                 "one the shape allows is timed")
      ->delimiter(',');
  app.add_flag("--router", router,
               "also time the router (GEMV vs tensor-core logits) at the batches past 16 tokens");
  CLI11_PARSE(app, argc, argv);

  const double copy_bw = measure_copy_bandwidth();
  const double bf16_rate = measure_bf16_gemm_rate();
  const double fp8_rate = measure_fp8_gemm_rate();
  std::printf("%s\n", nlohmann::json{{"bench", "moe"},
                                     {"copy_gbps", copy_bw / 1e9},
                                     {"bf16_gemm_tflops", bf16_rate / 1e12},
                                     {"fp8_gemm_tflops", fp8_rate / 1e12}}
                          .dump()
                          .c_str());
  std::fflush(stdout);
  FlushedTimer decode_timer(iters);
  FlushedTimer prefill_timer(prefill_iters);
  // A blocking stream: the legacy default stream of the timer's events orders with it.
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  for (const Shape& s : kShapes) {
    if (std::find(shapes.begin(), shapes.end(), s.name) == shapes.end()) continue;
    ExpertMemory mem = make_experts(s);
    cuda::MoeExperts table = cuda::MoeExperts::upload(mem.experts.data(), s.experts);
    const cuda::MoePrefillKernel auto_kernel = table.prefill_kernel();
    cuda::Blas blas(stream);
    if (router) {
      for (int64_t batch : batches) {
        if (batch > cuda::kSmallBatchMaxTokens) time_router(s, batch, stream, blas, prefill_timer);
      }
    }
    for (const std::string& kernel_name : prefill_kernels) {
      cuda::MoePrefillKernel kernel = auto_kernel;
      if (kernel_name == "grouped") kernel = cuda::MoePrefillKernel::kGrouped;
      if (kernel_name == "warpgroup") kernel = cuda::MoePrefillKernel::kWarpgroup;
      if (kernel_name == "tiles") kernel = cuda::MoePrefillKernel::kTiles;
      if ((kernel == cuda::MoePrefillKernel::kGrouped && !table.grouped_gemm()) ||
          (kernel == cuda::MoePrefillKernel::kWarpgroup && !table.prefill_kernels())) {
        std::printf("%s\n", nlohmann::json{{"bench", "moe"},
                                           {"shape", s.name},
                                           {"prefill_kernel", kernel_name},
                                           {"skipped", "the experts do not allow it"}}
                                .dump()
                                .c_str());
        continue;
      }
      table.set_prefill_kernel(kernel);
      const char* kernel_label = kernel == cuda::MoePrefillKernel::kGrouped     ? "grouped"
                                 : kernel == cuda::MoePrefillKernel::kWarpgroup ? "warpgroup"
                                                                                : "tiles";
      std::mt19937_64 rng(7);
      for (int64_t batch : batches) {
        constexpr int kDraws = 8;
        std::vector<cuda::DeviceBuffer> ids, weights;
        double unique = 0;
        for (int d = 0; d < kDraws; ++d) {
          const Routing r = random_routing(batch, s, rng);
          ids.push_back(cuda::to_device(r.ids));
          weights.push_back(cuda::to_device(r.weights));
          unique += static_cast<double>(r.unique) / kDraws;
        }
        cuda::DeviceBuffer x(static_cast<size_t>(batch * s.hidden) * 4);
        fill(x.data(), batch * s.hidden * 4, 4, 0.0f, 99);  // positive fp32 ~ 2^-8
        cuda::DeviceBuffer y(static_cast<size_t>(batch * s.hidden) * 4);
        cuda::DeviceBuffer ws(cuda::moe_workspace_bytes(table, nullptr, batch, s.top_k));
        for (const std::string& input : inputs) {
          const cuda::MoeDecodeInput in =
              input == "bf16" ? cuda::MoeDecodeInput::kBf16 : cuda::MoeDecodeInput::kFp32;
          const auto call = [&](int d) {
            cuda::moe({.x = x.as<float>(),
                       .num_tokens = batch,
                       .hidden = s.hidden,
                       .num_experts = s.experts,
                       .expert_ids = ids[d].as<int32_t>(),
                       .expert_weights = weights[d].as<float>(),
                       .top_k = s.top_k,
                       .y = y.as<float>(),
                       .act = {}},
                      table, blas, ws.data(), ws.size(), stream, false, in);
          };
          std::vector<cudaGraphExec_t> graphs;
          for (int d = 0; d < kDraws; ++d) {
            cudaGraph_t graph = nullptr;
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            call(d);
            CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            cudaGraphExec_t exec = nullptr;
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            CUDA_CHECK(cudaGraphDestroy(graph));
            graphs.push_back(exec);
          }
          FlushedTimer& timer = batch > 256 ? prefill_timer : decode_timer;
          int draw = 0;
          const float us =
              timer.time_us([&] { CUDA_CHECK(cudaGraphLaunch(graphs[draw++ % kDraws], stream)); });
          const float eager_us = timer.time_us([&] { call(draw++ % kDraws); });
          for (cudaGraphExec_t g : graphs) CUDA_CHECK(cudaGraphExecDestroy(g));
          const double bytes = unique * static_cast<double>(mem.expert_bytes);
          const double gbps = bytes / (us * 1e-6) / 1e9;
          const double flops = 6.0 * static_cast<double>(batch * s.top_k) *
                               static_cast<double>(s.hidden) * static_cast<double>(s.inter);
          const double rate = flops / (us * 1e-6);
          std::printf("%s\n", nlohmann::json{{"bench", "moe"},
                                             {"shape", s.name},
                                             {"batch", batch},
                                             {"input", input},
                                             {"prefill_kernel", kernel_label},
                                             {"unique_experts", unique},
                                             {"weight_mb", bytes / 1e6},
                                             {"us", us},
                                             {"eager_us", eager_us},
                                             {"gbps", gbps},
                                             {"copy_ratio", gbps * 1e9 / copy_bw},
                                             {"tflops", rate / 1e12},
                                             {"bf16_gemm_ratio", rate / bf16_rate},
                                             {"fp8_gemm_ratio", rate / fp8_rate}}
                                  .dump()
                                  .c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_moe_bench", hyserve::bench::run, argc, argv);
}
