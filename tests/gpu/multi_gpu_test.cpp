// Tensor and decode context parallelism on several GPUs (ranks as threads, one GPU each,
// NCCL): the CUDA counterparts of the CPU backend's tensor_parallel / context_parallel
// tests. They skip with fewer than 2 GPUs (the runs on nvidia-h200-x2 / -x8 machines).
//   TP 2 == TP 1 (reduction order: rel 1e-3 of the largest logit), DCP 2 == TP 2 (the
//   log-sum-exp merge: rel 1e-3; also over the FP8 latent), token-sharded prefill ==
//   head-sharded bitwise, and the
//   DSA top-k merge's steps over NCCL with a skew that forces round 2, exact.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "dsa_model_util.h"
#include "gpu/gpu_test_util.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "parallel/store.h"
#include "parallel/topk_merge.h"
#include "topk_merge_util.h"
#if HYSERVE_WITH_NCCL
#include "parallel/cuda/nccl_communicator.h"
#endif

// Skips the test unless this machine has at least n GPUs (and NCCL is built in).
#define REQUIRE_GPUS(n)                                                                        \
  do {                                                                                         \
    if (!HYSERVE_WITH_NCCL_ON || ::hyserve::cuda::device_count() < (n))                        \
      GTEST_SKIP() << "needs " << (n) << " GPUs and NCCL (" << ::hyserve::cuda::device_count() \
                   << " GPUs here)";                                                           \
  } while (0)

#if HYSERVE_WITH_NCCL
#define HYSERVE_WITH_NCCL_ON true
#else
#define HYSERVE_WITH_NCCL_ON false
#endif

namespace hyserve {
namespace {

using namespace std::chrono_literals;

#if HYSERVE_WITH_NCCL

std::filesystem::path fixture(const std::string& rel) {
  return std::filesystem::path(HYSERVE_SOURCE_DIR) / rel;
}

// Runs fn(rank, backend, tp_comm, dcp_comm) on `tp` threads, rank r on GPU r; DCP groups
// of `dcp` consecutive ranks (dcp_comm null when dcp is 1).
void run_ranks(int tp, int dcp,
               const std::function<void(int, std::unique_ptr<Backend>, parallel::Communicator&,
                                        parallel::Communicator*)>& fn) {
  parallel::HashStore store;
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        CUDA_CHECK(cudaSetDevice(rank));
        std::unique_ptr<Backend> backend = make_cuda_backend(rank);
        auto stream = static_cast<cudaStream_t>(backend->native_stream());
        auto tp_comm = parallel::make_nccl_communicator(store, rank, tp, rank, stream, 120s, "tp");
        std::unique_ptr<parallel::Communicator> dcp_comm;
        if (dcp > 1) {
          dcp_comm = parallel::make_nccl_communicator(store, rank % dcp, dcp, rank, stream, 120s,
                                                      "dcp" + std::to_string(rank / dcp));
        }
        fn(rank, std::move(backend), *tp_comm, dcp_comm.get());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < tp; ++rank) EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << rank;
}

// Makes a rank's model from its options and backend.
using MakeModel = std::function<std::unique_ptr<Model>(ModelOptions, std::unique_ptr<Backend>)>;

MakeModel from_dir(const std::filesystem::path& dir) {
  return [dir](ModelOptions o, std::unique_ptr<Backend> b) {
    return Model::load(dir, o, std::move(b));
  };
}

// Every rank's logits of a prompt (all positions) and one decode step after it.
std::vector<std::vector<float>> run_model(const MakeModel& make, int tp, int dcp,
                                          const std::vector<int32_t>& prompt,
                                          int64_t token_sharded = 0) {
  std::vector<std::vector<float>> logits(static_cast<size_t>(tp));
  run_ranks(tp, dcp,
            [&](int rank, std::unique_ptr<Backend> backend, parallel::Communicator& tp_comm,
                parallel::Communicator* dcp_comm) {
              ModelOptions o;
              o.parallel.tp = {rank, tp, &tp_comm};
              if (dcp > 1) o.parallel.dcp = {rank % dcp, dcp, dcp_comm};
              o.token_sharded_prefill = token_sharded;
              std::unique_ptr<Model> model = make(o, std::move(backend));
              SequenceState s = model->new_sequence();
              std::vector<float>& out = logits[static_cast<size_t>(rank)];
              model->forward(prompt, s, out, true);
              std::vector<float> next;
              model->forward(std::vector<int32_t>{prompt[2]}, s, next, false);
              out.insert(out.end(), next.begin(), next.end());
            });
  return logits;
}

// The DSA kernels' shapes (dsa_model_util.h) with random weights: FP8 latent and index keys.
MakeModel fp8_dsa_model(const ModelConfig& c) {
  return [c](ModelOptions o, std::unique_ptr<Backend> b) {
    o.indexer_fp8 = true;
    o.latent_cache = LatentCacheDtype::kFp8;
    return Model::create(c, std::make_unique<RandomWeights>(c, 11), o, std::move(b));
  };
}

std::vector<int32_t> prompt_for(const std::filesystem::path& dir, int n) {
  const ModelConfig c = ModelConfig::load(dir);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 53 + 11) % static_cast<int32_t>(c.vocab_size));
  return p;
}

// Every rank the same bits; rank 0 within tol (relative to the largest logit) of want.
void expect_close(const std::vector<float>& want, const std::vector<std::vector<float>>& got,
                  double tol) {
  ASSERT_FALSE(got.empty());
  for (size_t r = 1; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), got[0].size());
    EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), got[0].size() * 4), 0) << "rank " << r;
  }
  ASSERT_EQ(want.size(), got[0].size());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(want[i]) - got[0][i]));
  }
  EXPECT_GT(max_abs, 0.0);
  EXPECT_LE(max_diff, tol * max_abs) << "max |logit| " << max_abs;
}

const char* const kCheckpoints[] = {"tests/fixtures/deepseek_v32_tiny",
                                    "tests/fixtures/kimi_linear_tiny"};

TEST(MultiGpu, TensorParallelMatchesOneGpu) {
  REQUIRE_GPUS(2);
  for (const char* rel : kCheckpoints) {
    SCOPED_TRACE(rel);
    const std::filesystem::path dir = fixture(rel);
    const std::vector<int32_t> prompt = prompt_for(dir, 37);
    const std::vector<std::vector<float>> one = run_model(from_dir(dir), 1, 1, prompt);
    expect_close(one[0], run_model(from_dir(dir), 2, 1, prompt), 1e-3);
  }
}

TEST(MultiGpu, DecodeContextParallelMatchesTensorParallel) {
  REQUIRE_GPUS(2);
  for (const char* rel : kCheckpoints) {
    SCOPED_TRACE(rel);
    const std::filesystem::path dir = fixture(rel);
    // Longer than the tiny DSA model's top-k: the merge decides.
    const std::vector<int32_t> prompt = prompt_for(dir, 37);
    const std::vector<std::vector<float>> tp = run_model(from_dir(dir), 2, 1, prompt);
    expect_close(tp[0], run_model(from_dir(dir), 2, 2, prompt), 1e-3);
  }
}

TEST(MultiGpu, DecodeContextParallelOverTheFp8LatentMatchesTensorParallel) {
  REQUIRE_GPUS(2);
  // The DSA kernels' shapes (dsa_model_util.h): FP8 latent and index keys, the generic
  // indexer path and the top-k merge under DCP.
  const ModelConfig c = test::dsa_config("tests/fixtures/deepseek_v32_tiny");
  const MakeModel make = fp8_dsa_model(c);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back((i * 53 + 11) % static_cast<int32_t>(c.vocab_size));
  expect_close(run_model(make, 2, 1, prompt)[0], run_model(make, 2, 2, prompt), 1e-3);
}

TEST(MultiGpu, TokenShardedPrefillEqualsHeadShardedBitwise) {
  REQUIRE_GPUS(2);
  for (const char* rel : kCheckpoints) {
    SCOPED_TRACE(rel);
    const std::filesystem::path dir = fixture(rel);
    const std::vector<int32_t> prompt = prompt_for(dir, 45);
    const std::vector<std::vector<float>> heads = run_model(from_dir(dir), 2, 1, prompt);
    const std::vector<std::vector<float>> tokens = run_model(from_dir(dir), 2, 1, prompt, 1);
    ASSERT_EQ(heads[0].size(), tokens[0].size());
    EXPECT_EQ(std::memcmp(heads[0].data(), tokens[0].data(), heads[0].size() * 4), 0);
  }
}

TEST(MultiGpu, TokenShardedPrefillOverTheFp8LatentMatchesHeadSharded) {
  REQUIRE_GPUS(2);
  // The DSA kernels attend with every head on the rank's tokens (token-sharded) or with the
  // rank's heads on every token: the sparse kernel tiles the heads by their count, so the
  // two may round differently (rel 1e-3); with DCP 2 the gathered context gives the prompt's
  // logits of token-sharded prefill without DCP, the same bits.
  const ModelConfig c = test::dsa_config("tests/fixtures/deepseek_v32_tiny");
  const MakeModel make = fp8_dsa_model(c);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 53 + 11) % static_cast<int32_t>(c.vocab_size));
  const std::vector<std::vector<float>> tokens = run_model(make, 2, 1, prompt, 1);
  expect_close(run_model(make, 2, 1, prompt)[0], tokens, 1e-3);
  const std::vector<std::vector<float>> gathered = run_model(make, 2, 2, prompt, 1);
  ASSERT_EQ(gathered[0].size(), tokens[0].size());
  EXPECT_EQ(std::memcmp(gathered[0].data(), tokens[0].data(), prompt.size() * c.vocab_size * 4), 0);
}

TEST(MultiGpu, TopkMergeOverNcclResendsSkewedRowsExactly) {
  REQUIRE_GPUS(2);
  const int world = std::min(cuda::device_count(), 8);
  const int64_t k = 2048;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> normal;
  // Rows 0-1: rank 0 outscores everyone (round 2); rows 2-3: random (round 1 decides).
  test::Rows rows = test::random_rows({32768, 20000}, 11, [&](std::mt19937& g, int64_t p) {
    return u(g) + (p % world == 0 ? 10.0f : 0.0f);
  });
  for (test::Rows more =
           test::random_rows({32768, 5000}, 7, [&](std::mt19937&g, int64_t) { return normal(g); });
       auto& r : more) {
    rows.push_back(std::move(r));
  }
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const test::MergeStepsRun want = test::run_merge_steps(*cpu, rows, world, k);
  ASSERT_EQ(want.resent_rows, 2);
  const auto num_rows = std::ssize(rows);
  std::vector<std::vector<int32_t>> got(static_cast<size_t>(world));
  run_ranks(world, 1,
            [&](int rank, std::unique_ptr<Backend> b, parallel::Communicator& comm,
                parallel::Communicator*) {
              const test::RankInputs in = test::rank_inputs(rows, rank, world, k);
              const cuda::DeviceBuffer d_scores = cuda::to_device(in.scores);
              const cuda::DeviceBuffer d_selected = cuda::to_device(in.selected);
              TopkMergeParams p =
                  parallel::topk_merge_params(d_scores.as<float>(), in.num_keys,
                                              d_selected.as<int32_t>(), num_rows, k, rank, world);
              cuda::DeviceBuffer scratch_buffer(parallel::merge_scratch_bytes(p));
              const parallel::MergeScratch scratch =
                  parallel::bind_merge_scratch(p, scratch_buffer.data());
              EXPECT_EQ(parallel::merge_topk_steps(*b, comm, p, scratch), 2);
              std::vector<int32_t>& out = got[static_cast<size_t>(rank)];
              out.resize(static_cast<size_t>(num_rows * k));
              b->download(out.data(), p.selected, out.size() * 4);
            });
  EXPECT_EQ(got, want.per_rank);
}

#else

TEST(MultiGpu, NeedsNccl) {
  GTEST_SKIP() << "hyserve built without NCCL";
}

#endif

}  // namespace
}  // namespace hyserve
