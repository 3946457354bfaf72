// hyserve_parallel_bench: the multi-GPU pieces of tensor and decode context parallelism,
// one JSON line per case, for the runs on several GPUs (issues 21 and 22). Ranks are
// threads, one GPU each (NCCL), or CPU ranks (Gloo, --device cpu) to check the tool here.
//
//   --case collectives  all_reduce / all_gather / all_to_all of 1 MiB .. --max-bytes per
//                       rank: time, algorithm bandwidth (bytes / time) and bus bandwidth
//                       (nccl-tests' definitions: all_reduce x 2 (N-1)/N, the others x (N-1)/N)
//   --case merge        the DCP top-k merge, exact (parallel/topk_merge.h) vs generic (every
//                       rank's full top-k): bytes sent per rank and time, for --rows rows
//                       (64 requests x 5 query tokens) of --context keys, k = --topk. The
//                       merge runs on the host today: timed over a Gloo group of the ranks.
//   --case kv-tokens    KV positions per GPU of --config under TP and under DCP (the cache
//                       planner's row layout, --kv-gib of KV cache per GPU)
//
// On --device cuda it refuses to run with fewer than 2 GPUs (a figure of one GPU would say
// nothing about NVLink), with a message.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/order_key.h"
#include "kv/cache_plan.h"
#include "model/config.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "parallel/topk_merge.h"
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
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median seconds of fn (all ranks in step: a barrier before each run), 3 warm-ups, 10 runs.
double time_it(parallel::Communicator& comm, Backend& backend, const std::function<void()>& fn) {
  std::vector<double> runs;
  for (int i = 0; i < 13; ++i) {
    comm.barrier();
    backend.synchronize();
    const auto t0 = Clock::now();
    fn();
    backend.synchronize();
    if (i >= 3) runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(runs);
}

// Runs body(rank, backend, comm) on every rank, one thread each.
void run_ranks(const Args& a,
               const std::function<void(int, Backend&, parallel::Communicator&)>& body) {
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
        body(r, *backend, *comm);
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
  run_ranks(a, [&](int rank, Backend& backend, parallel::Communicator& comm) {
    for (int64_t bytes = int64_t{1} << 20; bytes <= a.max_bytes; bytes *= 4) {
      const int64_t per = bytes / a.ranks / 4 * 4;  // all_gather / all_to_all blocks
      BackendBuffer x(&backend, static_cast<size_t>(bytes));
      BackendBuffer y(&backend, static_cast<size_t>(bytes));
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
  // Host merge: a Gloo group whatever the device.
  Args cpu = a;
  cpu.device = "cpu";
  const int64_t local_keys = a.context / a.ranks;
  run_ranks(cpu, [&](int rank, Backend& backend, parallel::Communicator& comm) {
    std::mt19937 rng(static_cast<uint32_t>(17 + rank));
    std::normal_distribution<float> normal;
    std::vector<parallel::LocalCandidates> local(static_cast<size_t>(a.rows));
    std::vector<float> scores(static_cast<size_t>(local_keys));
    std::vector<int64_t> order(static_cast<size_t>(local_keys));
    for (parallel::LocalCandidates& lc : local) {
      for (float& s : scores) s = normal(rng);
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
      const auto keep = static_cast<size_t>(std::min(a.topk, local_keys));
      std::partial_sort(order.begin(), order.begin() + static_cast<long>(keep), order.end(),
                        [&](int64_t x, int64_t y) {
                          return float_rank_key(scores[static_cast<size_t>(x)], x) >
                                 float_rank_key(scores[static_cast<size_t>(y)], y);
                        });
      for (size_t i = 0; i < keep; ++i) {
        lc.scores.push_back(scores[static_cast<size_t>(order[i])]);
        lc.positions.push_back(order[i]);
      }
    }
    for (const bool exact : {true, false}) {
      parallel::TopkMergeStats stats;
      const double seconds = time_it(comm, backend, [&] {
        stats = {};
        if (exact) {
          parallel::merge_topk(comm, local, a.topk, &stats);
        } else {
          parallel::merge_topk_generic(comm, local, a.topk, &stats);
        }
      });
      if (rank != 0) continue;
      print({{"bench", "merge"},
             {"merge", exact ? "exact" : "generic"},
             {"ranks", a.ranks},
             {"rows", a.rows},
             {"context", a.context},
             {"topk", a.topk},
             {"bytes_sent_per_rank", stats.bytes_sent},
             {"bytes_per_row_per_rank", static_cast<double>(stats.bytes_sent) / a.rows},
             {"resent_rows", stats.resent_rows},
             {"time_us", seconds * 1e6},
             {"transport", "gloo (host)"}});
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

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"hyserve_parallel_bench: collectives, the DCP top-k merge, KV tokens per GPU"};
  app.add_option("--device", a.device, "cuda (NCCL, one GPU per rank) or cpu (Gloo)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ranks", a.ranks, "ranks (cuda: default every GPU)");
  app.add_option("--case", a.bench)->check(CLI::IsMember({"collectives", "merge", "kv-tokens"}));
  app.add_option("--max-bytes", a.max_bytes, "largest collective, bytes per rank");
  app.add_option("--rows", a.rows, "merge: query rows (requests x query tokens)");
  app.add_option("--context", a.context, "merge: keys of each row over the group");
  app.add_option("--topk", a.topk, "merge: k");
  app.add_option("--config", a.config, "kv-tokens: config.json");
  app.add_option("--dcp", a.dcp, "kv-tokens: DCP size (default --ranks)");
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
