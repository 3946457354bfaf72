// Prefix caching on the CUDA backend: the bundled model (KDA + MLA + DSA indexer) on the
// GPU, a request that shares two full blocks with an earlier one reads their latents,
// index keys and KDA snapshot from the device pool, and gives what an engine without
// prefix caching gives. tests/engine_test.cpp's PrefixHitEqualsMissBitwise is the CPU
// version.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu/gpu_test_util.h"
#include "gpu/tiny_model_util.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::load_tiny_on_gpu;
using test::random_prompt;

struct Result {
  std::vector<OutputToken> tokens;
  int64_t num_cached_tokens = -1;
  bool finished = false;
};

// Runs one greedy request (3 top logprobs, 8 tokens) to completion on the caller's thread.
Result run_request(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt) {
  Result r;
  Request req;
  req.id = id;
  req.prompt_token_ids = prompt;
  req.sampling_params.temperature = 0.0f;
  req.sampling_params.max_tokens = 8;
  req.sampling_params.ignore_eos = true;
  req.sampling_params.logprobs = 3;
  engine.add_request(std::move(req), [&r](const RequestOutput& o) {
    r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    r.num_cached_tokens = o.num_cached_tokens;
    r.finished = r.finished || o.finished;
  });
  for (int i = 0; i < 10000 && engine.step(); ++i) {
  }
  EXPECT_TRUE(r.finished) << id;
  return r;
}

// Token ids exactly; logprobs (sampled and top-3) bitwise when tol is 0, else within tol
// absolute. Returns the largest logprob difference seen.
double compare(const Result& got, const Result& want, double tol, const std::string& what) {
  double worst = 0.0;
  std::string worst_at = "every logprob (all equal)";
  EXPECT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < std::min(got.tokens.size(), want.tokens.size()); ++i) {
    const OutputToken& a = got.tokens[i];
    const OutputToken& b = want.tokens[i];
    EXPECT_EQ(a.token, b.token) << what << " token " << i;
    std::vector<std::pair<float, float>> pairs = {{a.logprob, b.logprob}};
    EXPECT_EQ(a.top_logprobs.size(), b.top_logprobs.size()) << what << " token " << i;
    for (size_t j = 0; j < std::min(a.top_logprobs.size(), b.top_logprobs.size()); ++j) {
      EXPECT_EQ(a.top_logprobs[j].token, b.top_logprobs[j].token) << what << " token " << i;
      pairs.emplace_back(a.top_logprobs[j].logprob, b.top_logprobs[j].logprob);
    }
    for (size_t j = 0; j < pairs.size(); ++j) {
      const double d = std::fabs(static_cast<double>(pairs[j].first) - pairs[j].second);
      if (tol == 0.0) {
        EXPECT_EQ(std::memcmp(&pairs[j].first, &pairs[j].second, sizeof(float)), 0)
            << what << " token " << i << (j == 0 ? " logprob " : " top logprob ") << pairs[j].first
            << " vs " << pairs[j].second;
      }
      if (!(d <= worst)) {
        worst = d;
        worst_at = j == 0 ? str_cat("token ", i, " sampled") : str_cat("token ", i, " top ", j - 1);
      }
    }
  }
  if (tol > 0.0) {
    EXPECT_LE(worst, tol) << what << ": worst logprob difference at " << worst_at;
  }
  std::printf("%s: worst logprob difference %.3g at %s\n", what.c_str(), worst, worst_at.c_str());
  return worst;
}

// Two engines on the GPU, prefix caching on and off, each fed the same requests one at a
// time. The token budget of a step is one block.
struct EnginePair {
  int64_t block_size = 0;
  int64_t vocab = 0;
  std::unique_ptr<Engine> cached, plain;

  EnginePair() {
    EngineConfig config;
    config.min_block_size = 64;  // a multiple of the KDA chunk, as prefix caching needs
    auto model = load_tiny_on_gpu();
    block_size = model->cache_plan(config.min_block_size).block_size;
    vocab = model->config().vocab_size;
    config.scheduler.max_model_len = 4 * block_size;
    config.scheduler.max_num_seqs = 4;
    config.scheduler.max_num_batched_tokens = block_size;
    config.enable_prefix_caching = true;
    cached = std::make_unique<Engine>(std::move(model), config);
    config.enable_prefix_caching = false;
    plain = std::make_unique<Engine>(load_tiny_on_gpu(), config);
  }
};

// The budget is one block (a multiple of 64): both engines prefill in the same block-sized
// chunks, so the chunk that follows the hit computes the same token count at the same
// positions on either engine. cuBLAS picks its GEMM algorithm by shape, so this is what
// makes the comparison exact: a hit differs from a miss only in where the first two
// blocks' latents, index keys and KDA state come from (the cache, computed by an earlier
// request in the same chunks), and those must be the same bits. (With the whole prompt in
// one step the miss runs its linears on bf16 tensor cores and a short hit suffix on the
// fp32 GEMV, which round differently: batch_invariant_gpu_test.cpp checks that case in
// batch-invariant mode, where it is exact.)
TEST(GpuPrefixCache, HitEqualsMissBitwiseInBlockSizedChunks) {
  REQUIRE_GPU();
  EnginePair e;
  ASSERT_EQ(e.block_size % 64, 0);
  const int64_t bs = e.block_size;
  const std::vector<int32_t> prefix = random_prompt(2 * bs, 500, e.vocab);
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt = prefix;
    const auto suffix = random_prompt(5 + 13 * i, 510 + static_cast<uint32_t>(i), e.vocab);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const std::string id = str_cat("r", i);
    const Result with = run_request(*e.cached, id, prompt);
    const Result without = run_request(*e.plain, id, prompt);
    EXPECT_EQ(with.num_cached_tokens, i == 0 ? 0 : 2 * bs) << id;
    EXPECT_EQ(without.num_cached_tokens, 0) << id;
    compare(with, without, 0.0, id + " (block-sized chunks)");
  }
  EXPECT_EQ(e.cached->stats().prefix_cache_hits, 3 * 2 * bs);
  EXPECT_EQ(e.plain->stats().prefix_cache_hits, 0);
}

}  // namespace
}  // namespace hyserve
