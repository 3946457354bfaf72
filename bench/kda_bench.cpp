// hyserve_kda_bench: the KDA layer's core on one GPU at the model shapes (head_dim 128,
// conv width 4; K3's 96 heads at TP1 and 12 at TP8, Kimi Linear's 32), inputs random.
//
//   --case decode: kda_decode (the fused decode: convs, gate, l2norm, the delta rule
//     with the state read and written once, the gated RMSNorm) for --batches requests of
//     --tokens-per-row tokens each, their states in a packed pool. Bytes: each state read
//     and written once, conv states too, and the per-token inputs and output.
//   --case prefill: the chunked recurrence (kda_chunked, the prefill's core; q, k
//     l2-normed, g and beta given) over --lengths tokens, one sequence or a varlen batch of
//     8 sequences of unequal lengths summing to the same count (as the layer runs them:
//     one call per sequence); FLOPs counted as the chunked form's products.
//
// One JSON line per point: median microseconds (CUDA events, --iters runs after warm-up,
// L2 flushed before each), bytes, GB/s and their ratio to the device-to-device copy
// bandwidth measured at the start of the run, or TFLOP/s. tools/bench_kda_fla.py times
// flash-linear-attention's fused_recurrent_kda and chunk_kda on the same shapes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "kernels/kda/cuda.h"
#include "peaks.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kTaps = 4;

cuda::DeviceBuffer random_device(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return cuda::to_device(v);
}

void bench_decode(int64_t heads, int64_t batch, int64_t per_row, int iters, double copy_bw) {
  const int64_t w = heads * kDim, t = batch * per_row;
  const int64_t conv_floats = (kTaps - 1) * w, row_floats = 3 * conv_floats + heads * kDim * kDim;
  cuda::DeviceBuffer q = random_device(t * w, -1, 1, 1), k = random_device(t * w, -1, 1, 2),
                     v = random_device(t * w, -1, 1, 3), f = random_device(t * w, -3, 1, 4),
                     b = random_device(t * heads, -2, 2, 5), gate = random_device(t * w, -2, 2, 6),
                     cw = random_device(3 * w * kTaps, -0.5, 0.5, 7),
                     dt_bias = random_device(w, -0.5, 0.5, 8),
                     a_log = random_device(heads, -1, 1, 9),
                     o_norm = random_device(kDim, 0.5, 1.5, 10),
                     pool = random_device(batch * row_floats, -0.1f, 0.1f, 11), y(t * w * 4);
  std::vector<int32_t> offsets(batch + 1), rows(batch);
  for (int64_t r = 0; r <= batch; ++r) offsets[r] = static_cast<int32_t>(r * per_row);
  for (int64_t r = 0; r < batch; ++r) rows[r] = static_cast<int32_t>(batch - 1 - r);
  cuda::DeviceBuffer d_offsets = cuda::to_device(offsets), d_rows = cuda::to_device(rows);
  KdaDecodeParams p;
  p.q = q.as<float>();
  p.k = k.as<float>();
  p.v = v.as<float>();
  p.f = f.as<float>();
  p.b = b.as<float>();
  p.gate = gate.as<float>();
  for (int i = 0; i < 3; ++i) {
    p.conv_weight[i] = cw.as<float>() + i * w * kTaps;
    p.conv_state[i] = pool.as<float>() + i * conv_floats;
  }
  p.dt_bias = dt_bias.as<float>();
  p.a_log = a_log.as<float>();
  p.o_norm = o_norm.as<float>();
  p.lower_bound = -5.0f;
  p.eps = 1e-5f;
  p.state = pool.as<float>() + 3 * conv_floats;
  p.state_rows = d_rows.as<int32_t>();
  p.state_row_bytes = row_floats * 4;
  p.token_offsets = per_row == 1 ? nullptr : d_offsets.as<int32_t>();
  p.num_rows = batch;
  p.num_tokens = t;
  p.num_heads = heads;
  p.head_dim = kDim;
  p.kernel_size = kTaps;
  p.y = y.as<float>();
  const float us = FlushedTimer(iters).time_us([&] { cuda::kda_decode(p, nullptr); });
  const double state_bytes = 2.0 * batch * row_floats * 4;
  const double bytes = state_bytes + static_cast<double>(t) * (6 * w + heads) * 4;
  const double gbps = bytes / (us * 1e-6) / 1e9;
  nlohmann::json j = {{"bench", "kda_decode"},
                      {"heads", heads},
                      {"head_dim", kDim},
                      {"batch", batch},
                      {"tokens_per_row", per_row},
                      {"us", us},
                      {"bytes", bytes},
                      {"state_bytes", state_bytes},
                      {"gbps", gbps},
                      {"copy_ratio", gbps * 1e9 / copy_bw},
                      {"us_per_token_row", us / per_row}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

void bench_prefill(int64_t heads, int64_t total, int64_t num_seqs, int iters, int v_slice) {
  // Unequal lengths summing to total: weights 1..num_seqs, rounded to chunks of 64.
  std::vector<int64_t> lengths;
  const int64_t weight_sum = num_seqs * (num_seqs + 1) / 2;
  int64_t used = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    int64_t n = s + 1 == num_seqs ? total - used : total * (s + 1) / weight_sum / 64 * 64;
    lengths.push_back(n);
    used += n;
  }
  const int64_t w = heads * kDim;
  cuda::DeviceBuffer q = random_device(total * w, -0.09f, 0.09f, 1),
                     k = random_device(total * w, -0.09f, 0.09f, 2),
                     v = random_device(total * w, -1, 1, 3), g = random_device(total * w, -2, 0, 4),
                     beta = random_device(total * heads, 0, 1, 5),
                     state = random_device(num_seqs * heads * kDim * kDim, -0.1f, 0.1f, 6),
                     o(total * w * 4);
  std::vector<KdaParams> ps;
  size_t ws_bytes = 0;
  int64_t offset = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    KdaParams p;
    p.q = q.as<float>() + offset * w;
    p.k = k.as<float>() + offset * w;
    p.v = v.as<float>() + offset * w;
    p.g = g.as<float>() + offset * w;
    p.beta = beta.as<float>() + offset * heads;
    p.state = state.as<float>() + s * heads * kDim * kDim;
    p.o = o.as<float>() + offset * w;
    p.num_tokens = lengths[s];
    p.num_heads = heads;
    p.head_dim = kDim;
    ws_bytes = std::max(ws_bytes, cuda::kda_chunked_workspace_bytes(p));
    ps.push_back(p);
    offset += lengths[s];
  }
  cuda::DeviceBuffer ws(ws_bytes);
  const float us = FlushedTimer(iters).time_us([&] {
    for (const KdaParams& p : ps) {
      cuda::kda_chunked(p, ws.data(), ws_bytes, nullptr, kKdaChunkSize, v_slice);
    }
  });
  // The chunked form's products per token and head: the in-chunk K K^T and Q K^T (2 x 64
  // x K), W and U (64 x K each), W S and Q S (K x V each), Aqk V' (64 x V), the state
  // update K^T V' (K x V): about 4 K^2 + 6 x 64 K multiply-adds.
  const double flops = 2.0 * total * heads * (4.0 * kDim * kDim + 6.0 * 64 * kDim);
  std::string lens;
  for (int64_t n : lengths) lens += (lens.empty() ? "" : ",") + std::to_string(n);
  nlohmann::json j = {{"bench", "kda_chunked"},
                      {"heads", heads},
                      {"head_dim", kDim},
                      {"tokens", total},
                      {"seqs", num_seqs},
                      {"v_slice", v_slice == 0 ? std::string("auto") : std::to_string(v_slice)},
                      {"lengths", lens},
                      {"us", us},
                      {"flops", flops},
                      {"tflops", flops / (us * 1e-6) / 1e12}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"KDA decode and chunked prefill at the model shapes"};
  std::string which = "all";
  std::vector<int64_t> heads = {96, 12, 32}, batches = {1, 8, 64, 256}, per_row = {1, 4, 8},
                       lengths = {4096, 16384, 65536}, seqs = {1, 8};
  int iters = 20;
  app.add_option("--case", which, "decode, prefill or all")
      ->check(CLI::IsMember({"decode", "prefill", "all"}));
  app.add_option("--heads", heads, "KDA heads per GPU");
  app.add_option("--batches", batches, "decode: requests");
  app.add_option("--tokens-per-row", per_row, "decode: new tokens per request");
  app.add_option("--lengths", lengths, "prefill: tokens per call");
  app.add_option("--seqs", seqs, "prefill: sequences the tokens are split into");
  app.add_option("--iters", iters, "timed runs per point");
  std::vector<int> v_slices = {0};
  app.add_option("--v-slices", v_slices,
                 "prefill: the inter-chunk blocks' V slice widths to time (0: the automatic pick; "
                 "64: the one before it)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  CHECK(cuda::device_count() > 0, "no GPU");
  const double copy_bw = measure_copy_bandwidth();
  std::printf("%s\n", nlohmann::json({{"bench", "copy"}, {"gbps", copy_bw / 1e9}}).dump().c_str());
  if (which != "prefill") {
    for (int64_t h : heads) {
      for (int64_t b : batches) {
        for (int64_t n : per_row) bench_decode(h, b, n, iters, copy_bw);
      }
    }
  }
  if (which != "decode") {
    for (int64_t h : heads) {
      for (int64_t t : lengths) {
        for (int64_t s : seqs) {
          for (const int v : v_slices) bench_prefill(h, t, s, std::max(3, iters / 4), v);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_kda_bench", hyserve::bench::run, argc, argv);
}
