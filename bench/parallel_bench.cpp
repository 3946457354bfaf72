// hyserve_parallel_bench: the multi-GPU pieces of tensor and decode context parallelism,
// one JSON line per case, for the runs on several GPUs (issues 21 and 22). Ranks are
// threads, one GPU each (NCCL), or CPU ranks (Gloo, --device cpu) to check the tool here.
//
//   --case collectives  all_reduce / all_gather / all_to_all of 1 MiB .. --max-bytes per
//                       rank: time, algorithm bandwidth (bytes / time) and bus bandwidth
//                       (nccl-tests' definitions: all_reduce x 2 (N-1)/N, the others x (N-1)/N)
//   --case merge        the DCP top-k merge as the model runs it (the backend's steps of
//                       kernels/attention/topk_merge with the communicator's all_gathers), exact vs
//                       generic (every rank's full top-k as score + position, 8 bytes each):
//                       bytes sent per rank and time, for --rows rows (64 requests x 5 query
//                       tokens) of --context keys over the group, k = --topk
//   --case kv-tokens    KV positions per GPU of --config under TP and under DCP (the cache
//                       planner's row layout, --kv-gib of KV cache per GPU)
//   --case prefill      TTFT of one prompt of each --prompts length on the --config slice
//                       (bench/slice.h, random weights) under TP, head-sharded vs
//                       token-sharded prefill, in chunks of --chunk tokens; with --dcp W,
//                       DCP's merged prefill vs the gathered-context form
//   --case decode       TPOT of a decode step of each --batches size at each --contexts length
//                       on the slice, TP vs DCP (--dcp, default --ranks); the cache is filled
//                       with random values instead of being prefilled (the step's cost does not
//                       depend on them), so long contexts take seconds to set up
//
// On --device cuda it refuses to run with fewer than 2 GPUs (a figure of one GPU would say
// nothing about NVLink), with a message.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/order_key.h"
#include "kv/cache_plan.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "model/workspace.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "parallel/topk_merge.h"
#include "slice.h"
#include "util/error.h"
#ifdef HYSERVE_WITH_CUDA
#include "core/cuda/device_buffer.h"
#endif
#if HYSERVE_WITH_NCCL
#include <cuda_runtime_api.h>

#include "parallel/cuda/nccl_communicator.h"
#endif

namespace hyserve {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Args {
  std::string device = "cpu";
  int ranks = 2;
  std::string bench = "collectives";
  int64_t max_bytes = int64_t{256} << 20;
  int64_t rows = 320;
  int64_t context = 131072;
  int64_t topk = 2048;
  std::string config;
  int dcp = 0;  // 0: the rank count
  double kv_gib = 64.0;
  std::vector<int64_t> prompts = {27648, 110592, 348160};  // 27K, 108K, 340K
  int64_t chunk = 16384;
  std::vector<int64_t> contexts = {32768, 131072};
  std::vector<int64_t> batches = {1, 64};
  int64_t steps = 10;
  std::string kv_cache_dtype = "bf16";
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median seconds of fn (all ranks in step: a barrier before each run), 3 warm-ups, 10 runs;
// prepare (untimed) before each.
double time_it(parallel::Communicator& comm, Backend& backend, const std::function<void()>& fn,
               const std::function<void()>& prepare = {}, int runs_timed = 10) {
  std::vector<double> runs;
  for (int i = 0; i < runs_timed + 3; ++i) {
    if (prepare) prepare();
    comm.barrier();
    backend.synchronize();
    const auto t0 = Clock::now();
    fn();
    backend.synchronize();
    if (i >= 3) runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(runs);
}

// Runs body(rank, backend, comm, dcp_comm) on every rank, one thread each; dcp_comm: the
// rank's group of dcp consecutive ranks (null when dcp is 1). body may take the backend.
using RankBody = std::function<void(int, std::unique_ptr<Backend>&, parallel::Communicator&,
                                    parallel::Communicator*)>;
void run_ranks(const Args& a, int dcp, const RankBody& body) {
  parallel::HashStore store;
  std::vector<std::string> errors(static_cast<size_t>(a.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < a.ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Backend> backend =
            a.device == "cuda" ? make_cuda_backend(r) : make_cpu_backend();
        std::unique_ptr<parallel::Communicator> comm;
#if HYSERVE_WITH_NCCL
        if (a.device == "cuda") {
          comm = parallel::make_nccl_communicator(
              store, r, a.ranks, r, static_cast<cudaStream_t>(backend->native_stream()), 120s,
              "bench");
        }
#endif
        if (!comm) comm = parallel::make_cpu_communicator(store, r, a.ranks, 120s, "bench");
        std::unique_ptr<parallel::Communicator> dcp_comm;
        if (dcp > 1) {
          const std::string group = "bench_dcp" + std::to_string(r / dcp);
#if HYSERVE_WITH_NCCL
          if (a.device == "cuda") {
            dcp_comm = parallel::make_nccl_communicator(
                store, r % dcp, dcp, r, static_cast<cudaStream_t>(backend->native_stream()), 120s,
                group);
          }
#endif
          if (!dcp_comm)
            dcp_comm = parallel::make_cpu_communicator(store, r % dcp, dcp, 120s, group);
        }
        body(r, backend, *comm, dcp_comm.get());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < a.ranks; ++r) {
    CHECK(errors[static_cast<size_t>(r)].empty(), "rank ", r, ": ", errors[static_cast<size_t>(r)]);
  }
}

void print(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

void collectives(const Args& a) {
  const double n = a.ranks;
  run_ranks(
      a, 1,
      [&](int rank, std::unique_ptr<Backend>& owned, parallel::Communicator& comm,
          parallel::Communicator*) {
        Backend& backend = *owned;
        for (int64_t bytes = int64_t{1} << 20; bytes <= a.max_bytes; bytes *= 4) {
          const int64_t per = bytes / a.ranks / 4 * 4;  // all_gather / all_to_all blocks
          DeviceAllocation x(&backend, static_cast<size_t>(bytes));
          DeviceAllocation y(&backend, static_cast<size_t>(bytes));
          const auto report = [&](const char* op, double seconds, double factor) {
            if (rank != 0) return;
            const double algbw = static_cast<double>(bytes) / seconds;
            print({{"bench", "collectives"},
                   {"device", a.device},
                   {"ranks", a.ranks},
                   {"op", op},
                   {"bytes", bytes},
                   {"time_us", seconds * 1e6},
                   {"algbw_GBps", algbw / 1e9},
                   {"busbw_GBps", algbw * factor / 1e9}});
          };
          report("all_reduce",
                 time_it(comm, backend, [&] { comm.all_reduce(x.as<float>(), bytes / 4); }),
                 2 * (n - 1) / n);
          report("all_gather",
                 time_it(comm, backend,
                         [&] { comm.all_gather(x.data(), y.data(), static_cast<size_t>(per)); }),
                 (n - 1) / n);
          report("all_to_all",
                 time_it(comm, backend,
                         [&] { comm.all_to_all(x.data(), y.data(), static_cast<size_t>(per)); }),
                 (n - 1) / n);
        }
      });
}

void merge(const Args& a) {
  const int world = a.ranks;
  const int64_t rows = a.rows, k = a.topk, local_keys = a.context / world;
  run_ranks(
      a, 1,
      [&](int rank, std::unique_ptr<Backend>& owned, parallel::Communicator& comm,
          parallel::Communicator*) {
        Backend& backend = *owned;
        // This rank's scores of its keys and their top-k (ascending, -1 padded), as the
        // indexer's causal_topk leaves them.
        std::mt19937 rng(static_cast<uint32_t>(17 + rank));
        std::normal_distribution<float> normal;
        std::vector<float> scores(static_cast<size_t>(rows * local_keys));
        for (float& x : scores) x = normal(rng);
        std::vector<int32_t> topk(static_cast<size_t>(rows * k), -1);
        std::vector<int32_t> order(static_cast<size_t>(local_keys));
        for (int64_t row = 0; row < rows; ++row) {
          const float* sc = scores.data() + row * local_keys;
          for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
          const auto keep = static_cast<size_t>(std::min(k, local_keys));
          std::partial_sort(order.begin(), order.begin() + static_cast<long>(keep), order.end(),
                            [&](int32_t x, int32_t y) {
                              return float_rank_key(sc[x], x) > float_rank_key(sc[y], y);
                            });
          std::sort(order.begin(), order.begin() + static_cast<long>(keep));
          std::copy(order.begin(), order.begin() + static_cast<long>(keep), topk.begin() + row * k);
        }
        const auto buffer = [&](size_t bytes) {
          return DeviceAllocation(&backend, std::max<size_t>(bytes, 8));
        };
        DeviceAllocation d_scores = buffer(scores.size() * 4), d_topk = buffer(topk.size() * 4),
                         selected = buffer(topk.size() * 4);
        backend.upload(d_scores.data(), scores.data(), scores.size() * 4);
        backend.upload(d_topk.data(), topk.data(), topk.size() * 4);
        TopkMergeParams p = parallel::topk_merge_params(d_scores.as<float>(), local_keys,
                                                        static_cast<int32_t*>(selected.data()),
                                                        rows, k, rank, world);
        DeviceAllocation scratch_buffer = buffer(parallel::merge_scratch_bytes(p));
        const parallel::MergeScratch scratch =
            parallel::bind_merge_scratch(p, scratch_buffer.data());
        std::vector<int32_t> exact_out;
        for (const bool exact : {true, false}) {
          p.resend_all = !exact;
          parallel::TopkMergeStats stats;
          // The local top-k again before each run (the steps replace it).
          const auto reset = [&] {
            backend.copy_2d(
                {reinterpret_cast<float*>(p.selected), k, d_topk.as<float>(), k, rows, k});
          };
          const double seconds = time_it(
              comm, backend,
              [&] {
                stats = {};
                parallel::merge_topk_steps(backend, comm, p, scratch, &stats);
              },
              reset);
          // Both forms select the same keys.
          std::vector<int32_t> out(static_cast<size_t>(rows * k));
          backend.download(out.data(), p.selected, out.size() * 4);
          if (exact) {
            exact_out = out;
          } else {
            CHECK(out == exact_out, "rank ", rank, ": the exact and generic merges differ");
          }
          if (rank != 0) continue;
          print({{"bench", "merge"},
                 {"merge", exact ? "exact" : "generic"},
                 {"device", a.device},
                 {"ranks", a.ranks},
                 {"rows", a.rows},
                 {"context", a.context},
                 {"topk", a.topk},
                 {"bytes_sent_per_rank", stats.bytes_sent},
                 {"bytes_per_row_per_rank", static_cast<double>(stats.bytes_sent) / a.rows},
                 {"resent_rows", stats.resent_rows},
                 {"time_us", seconds * 1e6},
                 {"transport", a.device == "cuda" ? "nccl" : "gloo"}});
        }
      });
}

void kv_tokens(const Args& a) {
  CHECK(!a.config.empty(), "--case kv-tokens needs --config");
  const ModelConfig c = ModelConfig::load(a.config);
  const int dcp = a.dcp > 0 ? a.dcp : a.ranks;
  const double bytes = a.kv_gib * 1024 * 1024 * 1024;
  for (const int w : {1, dcp}) {
    CachePlanOptions o;
    o.tp = a.ranks;
    o.dcp = w;
    const CachePlan plan = plan_cache(c.cache_spec(), o);
    const double rows = bytes / static_cast<double>(plan.row_bytes);
    print({{"bench", "kv-tokens"},
           {"config", a.config},
           {"tp", a.ranks},
           {"dcp", w},
           {"kv_gib_per_gpu", a.kv_gib},
           {"row_bytes", plan.row_bytes},
           {"tokens_per_gpu", rows * static_cast<double>(plan.block_size)},
           {"tokens_per_dcp_group", rows * static_cast<double>(plan.tokens_per_block())}});
  }
}

ModelConfig slice_config(const Args& a, const char* bench_case) {
  CHECK(!a.config.empty(), "--case ", bench_case, " needs --config (a full-size config.json)");
  return bench::layer_slice(ModelConfig::load(a.config));
}

LatentCacheDtype latent_dtype(const Args& a) {
  return a.kv_cache_dtype == "fp32" ? LatentCacheDtype::kFp32 : LatentCacheDtype::kBf16;
}

// The slice on this rank: TP over the group, DCP over dcp_comm's group when given.
std::unique_ptr<Model> rank_model(const Args& a, const ModelConfig& c, int rank,
                                  std::unique_ptr<Backend>& backend, parallel::Communicator& comm,
                                  parallel::Communicator* dcp_comm, int64_t token_sharded) {
  ModelOptions o;
  o.latent_cache = latent_dtype(a);
  o.parallel.tp = {rank, a.ranks, &comm};
  if (dcp_comm != nullptr) o.parallel.dcp = {dcp_comm->rank(), dcp_comm->size(), dcp_comm};
  o.token_sharded_prefill = token_sharded;
  return Model::create(c, std::make_unique<RandomWeights>(c, 1), o, std::move(backend));
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) t = id(rng);
  return out;
}

void prefill(const Args& a) {
  const ModelConfig c = slice_config(a, "prefill");
  // With --dcp W: DCP's merged prefill vs the gathered-context form.
  const int dcp = a.dcp > 0 ? a.dcp : 1;
  CHECK(a.ranks % dcp == 0, "--dcp ", dcp, " must divide --ranks ", a.ranks);
  for (const bool token_sharded : {false, true}) {
    run_ranks(a, dcp,
              [&](int rank, std::unique_ptr<Backend>& owned, parallel::Communicator& comm,
                  parallel::Communicator* dcp_comm) {
                Backend& backend = *owned;
                const std::unique_ptr<Model> model =
                    rank_model(a, c, rank, owned, comm, dcp_comm, token_sharded ? 1 : 0);
                std::vector<float> logits;
                {
                  // Warm-up: one chunk (the kernels' first launches, the op workspaces).
                  SequenceState warm = model->new_sequence();
                  model->forward(random_tokens(a.chunk, c.vocab_size, 5), warm, logits, false);
                }
                for (const int64_t n : a.prompts) {
                  const std::vector<int32_t> prompt = random_tokens(n, c.vocab_size, 7);
                  SequenceState s = model->new_sequence(n);
                  comm.barrier();
                  backend.synchronize();
                  const auto t0 = Clock::now();
                  for (int64_t at = 0; at < n; at += a.chunk) {
                    const int64_t m = std::min(a.chunk, n - at);
                    model->forward(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(at),
                                                                            static_cast<size_t>(m)),
                                   s, logits, false);  // the logits come back: the step is done
                  }
                  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
                  if (rank != 0) continue;
                  print({{"bench", "prefill"},
                         {"device", a.device},
                         {"config", a.config},
                         {"tp", a.ranks},
                         {"dcp", dcp},
                         {"sharding", token_sharded ? (dcp > 1 ? "gathered" : "token")
                                                    : (dcp > 1 ? "dcp-merged" : "head")},
                         {"prompt_tokens", n},
                         {"chunk", a.chunk},
                         {"kv_cache_dtype", a.kv_cache_dtype},
                         {"ttft_ms", seconds * 1e3},
                         {"tokens_per_s", static_cast<double>(n) / seconds}});
                }
              });
  }
}

// Fills the cache pool with uniform values in [-1, 1) (fp32 or bf16 words), uploaded in
// pieces of 64 MiB, a different stream of numbers each.
void fill_random(Backend& backend, KvCache& cache, uint64_t seed) {
  const size_t piece = size_t{64} << 20;
  std::vector<uint32_t> host(piece / 4);
  for (size_t at = 0; at < cache.num_bytes(); at += piece) {
    uint64_t x = seed + 0x9e3779b97f4a7c15ULL * (at / piece + 1);
    for (uint32_t& w : host) {
      // splitmix64; a float in [-1, 1) in each half (bf16 words) and in the whole word.
      x += 0x9e3779b97f4a7c15ULL;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      const auto f = std::bit_cast<uint32_t>(static_cast<float>(z >> 40) * 0x1p-23f - 1.0f);
      w = (f & 0xffff0000u) | (f >> 16);
    }
    backend.upload(cache.base() + at, host.data(), std::min(piece, cache.num_bytes() - at));
  }
}

void decode(const Args& a) {
  const ModelConfig c = slice_config(a, "decode");
  const int dcp = a.dcp > 0 ? a.dcp : a.ranks;
  CHECK(dcp >= 1 && a.ranks % dcp == 0, "--dcp ", dcp, " must divide --ranks ", a.ranks);
  for (const int w : dcp > 1 ? std::vector<int>{1, dcp} : std::vector<int>{1}) {
    run_ranks(
        a, w,
        [&](int rank, std::unique_ptr<Backend>& owned, parallel::Communicator& comm,
            parallel::Communicator* dcp_comm) {
          Backend& backend = *owned;
          const std::unique_ptr<Model> model = rank_model(a, c, rank, owned, comm, dcp_comm, 0);
          const CachePlan plan = model->cache_plan();
          for (const int64_t context : a.contexts) {
            for (const int64_t batch : a.batches) {
              const int64_t per_seq = plan.blocks_for_tokens(context + 1);
              const int64_t state_rows = plan.kda_state_rows;
              KvCache cache(backend, plan, batch * (per_seq + state_rows));
              fill_random(backend, cache, static_cast<uint64_t>(rank % w) + 1);
              std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
              const std::vector<int32_t> tokens = random_tokens(batch, c.vocab_size, 3);
              std::vector<SequenceInput> inputs(static_cast<size_t>(batch));
              for (int64_t i = 0; i < batch; ++i) {
                std::vector<int32_t>& t = tables[static_cast<size_t>(i)];
                for (int64_t b = 0; b < per_seq; ++b)
                  t.push_back(static_cast<int32_t>(i * per_seq + b));
                SequenceInput& in = inputs[static_cast<size_t>(i)];
                in.cache = &cache;
                in.blocks = t;
                in.state_block = state_rows > 0 ? static_cast<int32_t>(batch * per_seq + i) : -1;
                in.num_computed = context;
                in.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(i), 1);
              }
              Workspace ws(&backend);
              const double seconds = time_it(
                  comm, backend, [&] { model->forward_logits(inputs, ws); }, {},
                  static_cast<int>(a.steps));
              if (rank != 0) continue;
              print({{"bench", "decode"},
                     {"device", a.device},
                     {"config", a.config},
                     {"tp", a.ranks},
                     {"dcp", w},
                     {"context", context},
                     {"batch", batch},
                     {"kv_cache_dtype", a.kv_cache_dtype},
                     {"kv_tokens_per_gpu", batch * ((context + w - 1) / w)},
                     {"cache_gib_per_gpu", static_cast<double>(cache.num_bytes()) / (1 << 30)},
                     {"tpot_ms", seconds * 1e3}});
            }
          }
        });
  }
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"hyserve_parallel_bench: collectives, the DCP top-k merge, KV tokens per GPU"};
  app.add_option("--device", a.device, "cuda (NCCL, one GPU per rank) or cpu (Gloo)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ranks", a.ranks, "ranks (cuda: default every GPU)");
  app.add_option("--case", a.bench)
      ->check(CLI::IsMember({"collectives", "merge", "kv-tokens", "prefill", "decode"}));
  app.add_option("--max-bytes", a.max_bytes, "largest collective, bytes per rank");
  app.add_option("--rows", a.rows, "merge: query rows (requests x query tokens)");
  app.add_option("--context", a.context, "merge: keys of each row over the group");
  app.add_option("--topk", a.topk, "merge: k");
  app.add_option("--config", a.config, "kv-tokens, prefill, decode: config.json");
  app.add_option("--dcp", a.dcp,
                 "kv-tokens, decode: DCP size (default --ranks); prefill: DCP size (default 1)");
  app.add_option("--prompts", a.prompts, "prefill: prompt lengths")->delimiter(',');
  app.add_option("--chunk", a.chunk, "prefill: tokens per prefill step");
  app.add_option("--contexts", a.contexts, "decode: past tokens per sequence")->delimiter(',');
  app.add_option("--batches", a.batches, "decode: sequences per step")->delimiter(',');
  app.add_option("--steps", a.steps, "decode: timed steps per case (after 3 warm-ups)");
  app.add_option("--kv-cache-dtype", a.kv_cache_dtype, "prefill, decode: the MLA latent cache")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--kv-gib", a.kv_gib, "kv-tokens: KV cache per GPU, GiB");
  bool ranks_given = false;
  try {
    app.parse(argc, argv);
    ranks_given = app.count("--ranks") > 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.device == "cuda" && a.bench != "kv-tokens") {
    int gpus = 0;
#ifdef HYSERVE_WITH_CUDA
    gpus = cuda::device_count();
#endif
    CHECK(gpus >= 2, "--device cuda needs at least 2 GPUs, this machine has ", gpus,
          ": the figures of one GPU say nothing about the links between them (run --device "
          "cpu to check the tool)");
#if !HYSERVE_WITH_NCCL
    CHECK(false, "--device cuda needs NCCL: this hyserve was built without it");
#endif
    if (!ranks_given) a.ranks = gpus;
    CHECK(a.ranks >= 2 && a.ranks <= gpus, "--ranks ", a.ranks, " of ", gpus, " GPUs");
  }
  CHECK(a.ranks >= 1, "--ranks must be >= 1");
  if (a.bench == "collectives") collectives(a);
  if (a.bench == "merge") merge(a);
  if (a.bench == "kv-tokens") kv_tokens(a);
  if (a.bench == "prefill") prefill(a);
  if (a.bench == "decode") decode(a);
  return 0;
}

}  // namespace
}  // namespace hyserve

int main(int argc, char** argv) {
  try {
    return hyserve::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve_parallel_bench: %s\n", e.what());
    return 1;
  }
}
