// CUDA sample_tokens against the CPU op: the tokens must be EQUAL (params.h: all the
// arithmetic after one IEEE division is integer), for greedy and sampled rows, every
// filter, ties, NaN and -inf logits, all-NaN rows, and awkward vocabularies.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/sampling/cpu.h"
#include "kernels/sampling/cuda.h"

namespace hyserve {
namespace {

std::vector<int32_t> run_gpu(const std::vector<float>& logits,
                             const std::vector<SamplingOptions>& opts, int64_t vocab) {
  const auto rows = static_cast<int64_t>(opts.size());
  const cuda::DeviceBuffer dl = cuda::to_device(logits);
  const cuda::DeviceBuffer d_opts = cuda::to_device(opts);
  cuda::DeviceBuffer tokens(opts.size() * sizeof(int32_t) + 4);
  cuda::DeviceBuffer workspace(static_cast<size_t>(sampling::sample_workspace_bytes(rows, vocab)) +
                               4);
  cuda::sample_tokens({.logits = dl.as<float>(),
                       .options = d_opts.as<SamplingOptions>(),
                       .tokens = tokens.as<int32_t>(),
                       .num_rows = rows,
                       .vocab = vocab,
                       .workspace = workspace.data(),
                       .workspace_bytes = workspace.size()},
                      nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return cuda::to_host<int32_t>(tokens, opts.size());
}

std::vector<SamplingOptions> option_grid(uint64_t seed) {
  std::vector<SamplingOptions> out;
  uint64_t step = 0;
  for (float t : {0.0f, 0.3f, 1.0f, 1.7f}) {
    for (int32_t k : {0, 1, 5, 40}) {
      for (float p : {1.0f, 0.9f, 0.5f}) {
        for (float m : {0.0f, 0.05f}) {
          out.push_back(
              {.temperature = t, .top_k = k, .top_p = p, .min_p = m, .seed = seed, .step = step++});
        }
      }
    }
  }
  return out;
}

std::vector<int32_t> run_cpu(const std::vector<float>& logits,
                             const std::vector<SamplingOptions>& opts, int64_t vocab) {
  std::vector<int32_t> want(opts.size());
  cpu::sample_tokens({.logits = logits.data(),
                      .options = opts.data(),
                      .tokens = want.data(),
                      .num_rows = static_cast<int64_t>(opts.size()),
                      .vocab = vocab});
  return want;
}

TEST(GpuSampling, TokensEqualCpuTokens) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (int64_t vocab : {1, 3, 63, 65, 321, 5000, 160000}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " kind " + std::to_string(kind));
      const std::vector<SamplingOptions> opts = option_grid(seed++);
      const auto rows = static_cast<int64_t>(opts.size());
      std::mt19937_64 rng(seed++);
      std::normal_distribution<float> d(0.0f, kind == 2 ? 8.0f : 2.0f);
      std::vector<float> logits(rows * vocab);
      for (float& v : logits) {
        v = d(rng);
        if (kind == 1) v = std::round(v * 2.0f) / 2.0f;  // many exact ties
        if (kind == 2 && rng() % 17 == 0) v = rng() % 2 ? NAN : -INFINITY;
      }
      if (kind == 2) {  // one all-NaN row
        for (int64_t i = 0; i < vocab; ++i) logits[3 * vocab + i] = NAN;
      }
      const std::vector<int32_t> want = run_cpu(logits, opts, vocab);
      if (kind == 2) {
        EXPECT_EQ(want[3], -1);
      }
      EXPECT_EQ(run_gpu(logits, opts, vocab), want);
    }
  }
}

// K3's vocabulary, the shapes the many-block sampler was written for: peaked rows (a few
// candidates), flat rows (every id a candidate, boundary bins of hundreds), rows of equal
// logits (one bin of every id: the list overflows and the block resolves it alone), a
// plateau at the top (the top-k / top-p cut inside a run of equal logits, by id), and the
// same rows alone and in batches of other sizes (other chunkings): every token the CPU's.
TEST(GpuSampling, LargeVocabularyEveryBinPath) {
  REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::mt19937_64 rng(11);
  std::vector<float> logits;
  std::vector<SamplingOptions> opts;
  uint64_t step = 0;
  const auto add_row = [&](int shape) {
    std::normal_distribution<float> d(0.0f, shape == 0 ? 6.0f : 1.0f);
    for (int64_t i = 0; i < vocab; ++i) {
      float v = d(rng);
      if (shape == 2) v = 0.25f;                                  // all equal
      if (shape == 3) v = i % 7 == 0 ? 3.0f : std::min(v, 2.0f);  // a plateau on top
      if (shape == 4) v = std::round(v * 64.0f) / 64.0f;          // many ties
      logits.push_back(v);
    }
  };
  for (int shape = 0; shape < 5; ++shape) {
    for (int32_t k : {0, 1, 50, 4000, 30000}) {
      for (float p : {1.0f, 0.95f, 0.3f}) {
        add_row(shape);
        opts.push_back({.temperature = shape == 0 ? 0.8f : 1.3f,
                        .top_k = k,
                        .top_p = p,
                        .min_p = k == 50 ? 0.01f : 0.0f,
                        .seed = 1234 + step,
                        .step = step});
        ++step;
      }
    }
  }
  const std::vector<int32_t> want = run_cpu(logits, opts, vocab);
  EXPECT_EQ(run_gpu(logits, opts, vocab), want);
  // Each row alone (one row: the most chunks) and the first eight (another chunking).
  for (size_t row : {0, 17, 31, 44, 52, 74}) {
    SCOPED_TRACE("row " + std::to_string(row));
    const std::vector<float> one(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
    EXPECT_EQ(run_gpu(one, {opts[row]}, vocab), std::vector<int32_t>{want[row]});
  }
  const std::vector<float> eight(logits.begin(), logits.begin() + 8 * vocab);
  EXPECT_EQ(run_gpu(eight, std::vector<SamplingOptions>(opts.begin(), opts.begin() + 8), vocab),
            std::vector<int32_t>(want.begin(), want.begin() + 8));
}

TEST(GpuSampling, ManySeedsAgreeOnOneRow) {
  REQUIRE_GPU();
  const int64_t vocab = 1000;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> row(vocab);
  for (float& v : row) v = d(rng);
  std::vector<SamplingOptions> opts;
  std::vector<float> logits;
  for (uint64_t s = 0; s < 2000; ++s) {
    opts.push_back({.temperature = 1.0f, .top_p = 0.95f, .seed = s * 7919, .step = s % 13});
    logits.insert(logits.end(), row.begin(), row.end());
  }
  EXPECT_EQ(run_gpu(logits, opts, vocab), run_cpu(logits, opts, vocab));
}

TEST(GpuSampling, InvalidOptionsGiveMinusOne) {
  REQUIRE_GPU();
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const std::vector<SamplingOptions> opts = {{.temperature = -1.0f},
                                             {.temperature = 1.0f, .top_p = 0.0f},
                                             {.temperature = 1.0f, .min_p = 2.0f},
                                             {.temperature = 0.0f}};
  std::vector<float> all;
  for (size_t i = 0; i < opts.size(); ++i) all.insert(all.end(), logits.begin(), logits.end());
  EXPECT_EQ(run_gpu(all, opts, 3), (std::vector<int32_t>{-1, -1, -1, 2}));
  EXPECT_NO_THROW(cuda::sample_tokens({.num_rows = 0, .vocab = 3}, nullptr));
  EXPECT_THROW(cuda::sample_tokens({.num_rows = 1, .vocab = 0}, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
