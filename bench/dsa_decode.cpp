// hyserve_dsa_decode_bench: one DSA decode step of one full-attention layer at K3.1 Pro's
// dimensions (index 32 heads x 128, top-2048, FP8 latent 576 B/token, FP8 index keys
// 132 B/token), over a packed block pool holding batch x context tokens, on one GPU.
//
// Per (batch, context) it prints one JSON line: median time (CUDA events, --iters runs
// after warm-up, L2 flushed before each run) of the indexer, the top-k, sparse MLA, the
// whole step (dsa_decode) and dense MLA over the same cache; the bytes each must read;
// achieved GB/s and its ratio to the device-to-device copy bandwidth measured at the start
// of the same run (read + written bytes, as layer_bench counts it); the ratio of the DSA
// step to dense MLA. Combos whose pool does not fit in free memory print a "skipped" line.
// tools/bench_dsa_torch.py times PyTorch's version of the same step;
// bench/run_dsa_decode.sh runs both and prints them side by side.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "kernels/attention/dsa/cuda.h"
#include "peaks.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

struct Shape {
  int64_t batch, context, num_q, heads, index_heads, topk, block_size;
};

int64_t round256(int64_t n) {
  return (n + 255) / 256 * 256;
}

// Fills `bytes` of device memory by replicating a host-made chunk of whole pool rows:
// finite e4m3 codes (bit 3 clear: never S.1111.111) and key scales of 2^-8.
void fill_pool(uint8_t* pool, int64_t num_blocks, const DsaCache& cache, std::mt19937_64& rng) {
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t{64} << 20) / cache.row_bytes);
  std::vector<uint8_t> chunk(static_cast<size_t>(rows_per_chunk * cache.row_bytes));
  for (auto& v : chunk) v = static_cast<uint8_t>(rng() & 0xf7);
  for (int64_t r = 0; r < rows_per_chunk; ++r) {
    auto* scales =
        reinterpret_cast<float*>(chunk.data() + r * cache.row_bytes + cache.index_offset +
                                 int64_t{cache.block_size} * kDsaIndexDim);
    for (int64_t j = 0; j < cache.block_size; ++j)
      scales[j] = std::ldexp(1.0f, -8 - static_cast<int>(rng() % 4));
  }
  cuda::DeviceBuffer staging = cuda::to_device(chunk);
  for (int64_t r = 0; r < num_blocks; r += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, num_blocks - r);
    CUDA_CHECK(cudaMemcpy(pool + r * cache.row_bytes, staging.data(), n * cache.row_bytes,
                          cudaMemcpyDeviceToDevice));
  }
}

void run_case(const Shape& s, double copy_bw, FlushedTimer& timer, std::mt19937_64& rng) {
  nlohmann::json j;
  j["bench"] = "dsa_decode";
  j["impl"] = "hyserve";
  j["batch"] = s.batch;
  j["context"] = s.context;
  j["n_q"] = s.num_q;
  j["heads"] = s.heads;
  j["index_heads"] = s.index_heads;
  j["topk"] = s.topk;
  j["block_size"] = s.block_size;

  DsaCache cache;
  cache.block_size = static_cast<int32_t>(s.block_size);
  cache.latent_offset = 0;
  cache.index_offset = round256(s.block_size * kDsaLatentDim);
  cache.row_bytes = cache.index_offset + round256(s.block_size * kDsaIndexKeyBytes);
  cache.latent_scale = 1.0f / 64;
  const int64_t blocks_per_request = (s.context + s.block_size - 1) / s.block_size;
  cache.num_blocks = s.batch * blocks_per_request;
  const int64_t pool_bytes = cache.num_blocks * cache.row_bytes;
  const int64_t rows = s.batch * s.num_q;

  // Queries and the per-step arrays.
  std::vector<int32_t> tables(static_cast<size_t>(cache.num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);  // scattered blocks, as in a used pool
  const std::vector<int32_t> lens(static_cast<size_t>(s.batch), static_cast<int32_t>(s.context));
  std::vector<uint8_t> q8(static_cast<size_t>(rows * s.index_heads * kDsaIndexDim));
  for (auto& v : q8) v = static_cast<uint8_t>(rng() & 0xf7);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> weights(static_cast<size_t>(rows * s.index_heads));
  for (auto& v : weights) v = uni(rng) * 1e-3f;
  std::vector<float> q_lat(static_cast<size_t>(rows * s.heads * kDsaLoraDim));
  for (auto& v : q_lat) v = uni(rng);
  std::vector<float> q_pe(static_cast<size_t>(rows * s.heads * kDsaRopeDim));
  for (auto& v : q_pe) v = uni(rng);

  DsaDecodeParams p{.cache = cache,
                    .batch = {.block_tables = nullptr,
                              .seq_lens = nullptr,
                              .num_requests = s.batch,
                              .max_blocks = blocks_per_request,
                              .num_q = s.num_q,
                              .max_context = s.context},
                    .index_q8 = nullptr,
                    .index_weights = nullptr,
                    .index_num_heads = s.index_heads,
                    .topk = s.topk,
                    .q_lat = nullptr,
                    .q_pe = nullptr,
                    .num_heads = s.heads,
                    .softmax_scale = 1.0f / std::sqrt(192.0f),
                    .o_lat = nullptr,
                    .lse = nullptr,
                    .slots = nullptr};
  const size_t step_ws = cuda::dsa_decode_workspace_bytes(p);
  DsaMlaParams dense{.cache = cache,
                     .batch = p.batch,
                     .q_lat = nullptr,
                     .q_pe = nullptr,
                     .slots = nullptr,
                     .topk_width = 0,
                     .num_heads = s.heads,
                     .softmax_scale = p.softmax_scale,
                     .o_lat = nullptr,
                     .lse = nullptr};
  const size_t dense_ws = cuda::dsa_mla_workspace_bytes(dense);
  const int64_t stride = (s.context + 3) / 4 * 4;
  const int64_t need = pool_bytes + static_cast<int64_t>(std::max(step_ws, dense_ws)) +
                       rows * stride * 4 + (int64_t{1} << 30);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  j["pool_bytes"] = pool_bytes;
  if (need > static_cast<int64_t>(free_bytes)) {
    j["skipped"] = str_cat("needs ", need / 1e9, " GB, ", free_bytes / 1e9, " GB free");
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    return;
  }

  cuda::DeviceBuffer d_pool(static_cast<size_t>(pool_bytes));
  cache.pool = d_pool.as<uint8_t>();
  fill_pool(d_pool.as<uint8_t>(), cache.num_blocks, cache, rng);
  cuda::DeviceBuffer d_tables = cuda::to_device(tables), d_lens = cuda::to_device(lens),
                     d_q8 = cuda::to_device(q8), d_w = cuda::to_device(weights),
                     d_q_lat = cuda::to_device(q_lat), d_q_pe = cuda::to_device(q_pe);
  cuda::DeviceBuffer d_o(sizeof(float) * rows * s.heads * kDsaLoraDim),
      d_lse(sizeof(float) * rows * s.heads), d_slots(sizeof(int32_t) * rows * s.topk),
      d_scores(sizeof(float) * rows * stride);
  cuda::DeviceBuffer d_ws(std::max<size_t>(256, std::max(step_ws, dense_ws)));

  p.cache = cache;
  p.batch.block_tables = d_tables.as<int32_t>();
  p.batch.seq_lens = d_lens.as<int32_t>();
  p.index_q8 = d_q8.as<uint8_t>();
  p.index_weights = d_w.as<float>();
  p.q_lat = d_q_lat.as<float>();
  p.q_pe = d_q_pe.as<float>();
  p.o_lat = d_o.as<float>();
  p.lse = d_lse.as<float>();
  p.slots = d_slots.as<int32_t>();
  const DsaIndexerParams indexer{.cache = cache,
                                 .batch = p.batch,
                                 .q8 = p.index_q8,
                                 .weights = p.index_weights,
                                 .num_heads = s.index_heads,
                                 .scores = d_scores.as<float>(),
                                 .score_stride = stride};
  const DsaTopkParams topk{.batch = p.batch,
                           .block_size = cache.block_size,
                           .scores = indexer.scores,
                           .score_stride = stride,
                           .topk = s.topk,
                           .slots = p.slots,
                           .positions = nullptr};
  DsaMlaParams sparse = dense;
  sparse.cache = cache;
  sparse.batch = p.batch;
  sparse.q_lat = p.q_lat;
  sparse.q_pe = p.q_pe;
  sparse.slots = p.slots;
  sparse.topk_width = s.topk;
  sparse.o_lat = p.o_lat;
  sparse.lse = p.lse;
  dense = sparse;
  dense.slots = nullptr;
  dense.topk_width = 0;
  const size_t topk_ws = cuda::dsa_topk_workspace_bytes(topk);
  const size_t sparse_ws = cuda::dsa_mla_workspace_bytes(sparse);
  CHECK(topk_ws <= d_ws.size() && sparse_ws <= d_ws.size(), "bench workspace too small");

  const float indexer_us = timer.time_us([&] { cuda::dsa_indexer_scores(indexer, nullptr); });
  const float topk_us =
      timer.time_us([&] { cuda::dsa_topk(topk, d_ws.data(), d_ws.size(), nullptr); });
  const float sparse_us =
      timer.time_us([&] { cuda::dsa_mla_decode(sparse, d_ws.data(), d_ws.size(), nullptr); });
  const float step_us =
      timer.time_us([&] { cuda::dsa_decode(p, d_ws.data(), d_ws.size(), nullptr); });
  const float dense_us =
      timer.time_us([&] { cuda::dsa_mla_decode(dense, d_ws.data(), d_ws.size(), nullptr); });

  const int64_t selected = rows * std::min(s.topk, s.context);
  const double q_bytes = static_cast<double>(rows) * s.heads * kDsaLatentDim * 4;
  const double indexer_bytes = static_cast<double>(s.batch) * s.context * kDsaIndexKeyBytes +
                               static_cast<double>(rows) * s.index_heads * (kDsaIndexDim + 4);
  const double topk_bytes = static_cast<double>(rows) * s.context * 4;
  const double sparse_bytes = static_cast<double>(selected) * kDsaLatentDim + q_bytes;
  const double step_bytes = indexer_bytes + sparse_bytes;
  const double dense_bytes = static_cast<double>(s.batch) * s.context * kDsaLatentDim + q_bytes;
  auto put = [&](const char* name, float us, double bytes) {
    j[str_cat(name, "_us")] = us;
    j[str_cat(name, "_bytes")] = bytes;
    const double gbps = bytes / (us * 1e-6) / 1e9;
    j[str_cat(name, "_gb_per_s")] = gbps;
    j[str_cat(name, "_frac_copy_bw")] = gbps * 1e9 / copy_bw;
  };
  put("indexer", indexer_us, indexer_bytes);
  put("topk", topk_us, topk_bytes);
  put("sparse_mla", sparse_us, sparse_bytes);
  put("step", step_us, step_bytes);
  put("dense", dense_us, dense_bytes);
  j["dsa_over_dense"] = step_us / dense_us;
  j["copy_gb_per_s"] = copy_bw / 1e9;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"DSA decode step (indexer, top-k, sparse MLA) vs dense MLA over the packed cache"};
  std::vector<int64_t> batches = {1, 8, 32, 64};
  std::vector<int64_t> contexts = {8192, 32768, 131072, 524288, 1048576};
  int iters = 20;
  Shape s{0, 0, 1, 64, 32, 2048, 64};
  bool no_flush = false;
  app.add_option("--batch", batches, "batch sizes")->delimiter(',');
  app.add_option("--context", contexts, "context lengths (tokens per request)")->delimiter(',');
  app.add_option("--iters", iters, "timed runs per measurement")->capture_default_str();
  app.add_option("--n-q", s.num_q, "query tokens per request (1..8)")->capture_default_str();
  app.add_option("--heads", s.heads, "MLA heads on this GPU (num_attention_heads / tp)")
      ->capture_default_str();
  app.add_option("--index-heads", s.index_heads, "indexer heads")->capture_default_str();
  app.add_option("--topk", s.topk, "index_topk")->capture_default_str();
  app.add_option("--block-size", s.block_size, "tokens per cache block")->capture_default_str();
  app.add_flag("--no-flush", no_flush, "do not flush L2 before each timed run");
  CLI11_PARSE(app, argc, argv);

  const double copy_bw = measure_copy_bandwidth();
  {
    nlohmann::json j;
    j["bench"] = "peaks";
    j["copy_gb_per_s"] = copy_bw / 1e9;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    j["gpu"] = prop.name;
    std::printf("%s\n", j.dump().c_str());
  }
  FlushedTimer timer(iters, !no_flush);
  std::mt19937_64 rng(5);
  for (const int64_t ctx : contexts) {
    for (const int64_t b : batches) {
      Shape c = s;
      c.batch = b;
      c.context = ctx;
      run_case(c, copy_bw, timer, rng);
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_dsa_decode_bench", hyserve::bench::run, argc, argv);
}
