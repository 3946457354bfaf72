// Batch-invariant mode on the CUDA backend, end to end through the Engine: with
// ModelOptions::batch_invariant a request's tokens and logprobs are bitwise the same
// (1) when its prefix comes from the cache as when it is computed, under serve's default
//     token budget (the miss prefills the whole prompt in one step, the hit only the
//     suffix, down to one token), and
// (2) when it runs alone as when it shares every step with other requests (prefill chunks
//     cut differently by the shared budget, mixed with other requests' decode tokens).
// Both for the bundled model (fp32 latent, fp32 index keys) and for the DSA-dimension
// model on the GPU's FP8 formats (FP8 latent and index keys: the DSA kernels).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsa_model_util.h"
#include "engine/engine.h"
#include "gpu/gpu_test_util.h"
#include "gpu/tiny_model_util.h"
#include "util/error.h"

namespace hyserve {
namespace {

enum class Variant { kBundled, kDsaFp8 };

std::string variant_name(Variant v) {
  return v == Variant::kBundled ? "bundled model, fp32 latent" : "DSA model, FP8 latent";
}

std::unique_ptr<Model> make_model(Variant v) {
  ModelOptions o;
  o.batch_invariant = true;
  if (v == Variant::kBundled) {
    return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", o,
                       make_cuda_backend(0));
  }
  o.indexer_fp8 = true;
  o.latent_cache = LatentCacheDtype::kFp8;
  const ModelConfig c = test::dsa_config("models/tiny-kimi-k3");
  return Model::create(c, std::make_unique<RandomWeights>(c, 11), o, make_cuda_backend(0));
}

Request greedy_request(const std::string& id, const std::vector<int32_t>& prompt,
                       int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt_token_ids = prompt;
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.logprobs = 3;
  return r;
}

struct Result {
  std::vector<OutputToken> tokens;
  int64_t num_cached_tokens = -1;
  bool finished = false;
};

OutputCallback collect(Result& r) {
  return [&r](const RequestOutput& o) {
    r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    r.num_cached_tokens = o.num_cached_tokens;
    r.finished = r.finished || o.finished;
  };
}

void run_to_completion(Engine& e) {
  for (int i = 0; i < 100000 && e.step(); ++i) {
  }
}

// Token ids, sampled logprobs and top-3 logprobs, bitwise.
void expect_same(const Result& got, const Result& want, const std::string& what) {
  ASSERT_TRUE(got.finished && want.finished) << what;
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const OutputToken& a = got.tokens[i];
    const OutputToken& b = want.tokens[i];
    ASSERT_EQ(a.token, b.token) << what << " token " << i;
    EXPECT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0)
        << what << " token " << i << " logprob " << a.logprob << " vs " << b.logprob;
    ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size()) << what << " token " << i;
    for (size_t j = 0; j < a.top_logprobs.size(); ++j) {
      EXPECT_EQ(a.top_logprobs[j].token, b.top_logprobs[j].token) << what << " token " << i;
      EXPECT_EQ(std::memcmp(&a.top_logprobs[j].logprob, &b.top_logprobs[j].logprob, sizeof(float)),
                0)
          << what << " token " << i << " top " << j;
    }
  }
}

EngineConfig serve_like_config(const Model& model, int64_t max_num_batched_tokens) {
  EngineConfig c;
  c.min_block_size = 64;
  const int64_t bs = model.cache_plan(c.min_block_size).block_size;
  c.scheduler.max_model_len = 8 * bs;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  return c;
}

TEST(GpuBatchInvariant, PrefixHitEqualsMissUnderServeDefaultBudget) {
  REQUIRE_GPU();
  for (Variant v : {Variant::kBundled, Variant::kDsaFp8}) {
    SCOPED_TRACE(variant_name(v));
    auto cached_model = make_model(v);
    const int64_t bs = cached_model->cache_plan(64).block_size;
    const int64_t vocab = cached_model->config().vocab_size;
    EngineConfig config = serve_like_config(*cached_model, /*serve's default*/ 8192);
    config.enable_prefix_caching = true;
    Engine cached(std::move(cached_model), config);
    config.enable_prefix_caching = false;
    Engine plain(make_model(v), config);
    const std::vector<int32_t> prefix = test::random_prompt(2 * bs, 700, vocab);
    // The first request fills the cache; the next ones hit 2 blocks and compute a suffix
    // of 1 (a one-token prefill chunk), 5, 70 and bs + 3 tokens.
    const int64_t suffixes[] = {9, 1, 5, 70, bs + 3};
    for (int i = 0; i < 5; ++i) {
      std::vector<int32_t> prompt = prefix;
      const auto suffix = test::random_prompt(suffixes[i], 710 + i, vocab);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      const std::string id = str_cat("r", i);
      Result with, without;
      cached.add_request(greedy_request(id, prompt, 8), collect(with));
      run_to_completion(cached);
      plain.add_request(greedy_request(id, prompt, 8), collect(without));
      run_to_completion(plain);
      EXPECT_EQ(with.num_cached_tokens, i == 0 ? 0 : 2 * bs) << id;
      expect_same(with, without, str_cat(id, " (suffix ", suffixes[i], ")"));
    }
  }
}

TEST(GpuBatchInvariant, RequestAloneEqualsInAMixedBatch) {
  REQUIRE_GPU();
  for (Variant v : {Variant::kBundled, Variant::kDsaFp8}) {
    SCOPED_TRACE(variant_name(v));
    auto model = make_model(v);
    const int64_t vocab = model->config().vocab_size;
    // A shared budget of 160 tokens: prompts are cut into chunks that depend on what else
    // runs, and most steps mix prefill chunks with decode tokens.
    const EngineConfig config = serve_like_config(*model, 160);
    Engine batched(std::move(model), config);
    Engine alone(make_model(v), config);
    std::vector<Request> requests;
    for (int i = 0; i < 8; ++i) {
      const int64_t n = 1 + (i * 97) % 400;
      requests.push_back(
          greedy_request(str_cat("r", i), test::random_prompt(n, 800 + i, vocab), 4 + i % 5));
    }
    std::vector<Result> got(requests.size()), want(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      batched.add_request(requests[i], collect(got[i]));
    }
    run_to_completion(batched);
    for (size_t i = 0; i < requests.size(); ++i) {
      alone.add_request(requests[i], collect(want[i]));
      run_to_completion(alone);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      expect_same(got[i], want[i],
                  str_cat(requests[i].id, " (prompt ", requests[i].prompt_token_ids.size(), ")"));
    }
  }
}

}  // namespace
}  // namespace hyserve
