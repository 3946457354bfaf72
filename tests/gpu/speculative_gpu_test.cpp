// Speculative decoding on the CUDA backend, end to end through the Engine. In batch-invariant
// mode a verification computes each position as the decode step does (the same fixed-order
// kernels, one query row per token), so with ngram drafts a request's tokens and logprobs are
// bitwise those without speculation. In the default mode a verification of more than 16 tokens
// runs its linears on bf16 tensor cores where a decode step of 8 takes the fp32 GEMV path
// (model_gpu_test.cpp), and a step with prefill chunks and drafts runs the chunks as a forward
// of their own: the two drift apart by bf16 rounding, which the KDA states carry on (the bundled
// model's logits are sensitive: 0.13 on average over 108 tokens, measured), so the check is loose:
// logprobs within 0.25 on average until the sequences part. The verifications replay graphs. Both
// for the bundled model (KDA: verification without state writes, then the commit) and the
// DSA-dimension model on the FP8 formats (the DSA decode kernels with every draft a query row).
#include <cmath>
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

std::unique_ptr<Model> make_model(Variant v, bool batch_invariant) {
  ModelOptions o;
  o.batch_invariant = batch_invariant;
  if (v == Variant::kBundled) {
    return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", o,
                       make_cuda_backend(0));
  }
  o.indexer_fp8 = true;
  o.latent_cache = LatentCacheDtype::kFp8;
  const ModelConfig c = test::dsa_config("models/tiny-kimi-k3");
  return Model::create(c, std::make_unique<RandomWeights>(c, 11), o, make_cuda_backend(0));
}

struct Result {
  std::vector<OutputToken> tokens;
  bool finished = false;
};

struct SpecRun {
  std::vector<Result> results;
  SpecDecodeCounts spec;
};

// Eight greedy requests; odd ones biased to three tokens (their outputs cycle, so that prompt
// lookup's drafts are accepted), all together.
SpecRun run(Variant v, bool batch_invariant, int64_t drafts) {
  auto model = make_model(v, batch_invariant);
  const int64_t vocab = model->config().vocab_size;
  EngineConfig c;
  c.min_block_size = 64;
  c.scheduler.max_model_len = 512;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.max_num_batched_tokens = 1024;
  c.decode_graph_max_batch = 8;
  if (drafts > 0) {
    c.speculative.method = SpeculativeMethod::kNgram;
    c.speculative.num_speculative_tokens = drafts;
    c.speculative.prompt_lookup_min = 1;
    c.speculative.prompt_lookup_max = 3;
  }
  Engine engine(std::move(model), c);
  SpecRun out;
  out.results.resize(8);
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.id = str_cat("r", i);
    r.prompt_token_ids = test::random_prompt(20 + 31 * i, 900 + i, vocab);
    r.sampling_params.temperature = 0.0f;
    r.sampling_params.max_tokens = 40;
    r.sampling_params.ignore_eos = true;
    r.sampling_params.logprobs = 2;
    if (i % 2 == 1) {
      for (int32_t id : {5, 11, 23}) r.sampling_params.logit_bias.push_back({id, 30.0f});
    }
    Result& res = out.results[static_cast<size_t>(i)];
    engine.add_request(r, [&res](const RequestOutput& o) {
      res.tokens.insert(res.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      res.finished = res.finished || o.finished;
    });
  }
  for (int i = 0; i < 100000 && engine.step(); ++i) {
  }
  out.spec = engine.stats().spec_decode;
  return out;
}

TEST(GpuSpeculative, BatchInvariantNgramDraftsAreBitwiseNoSpeculation) {
  REQUIRE_GPU();
  for (Variant v : {Variant::kBundled, Variant::kDsaFp8}) {
    SCOPED_TRACE(v == Variant::kBundled ? "bundled" : "dsa fp8");
    const SpecRun plain = run(v, true, 0);
    const SpecRun spec = run(v, true, 4);
    EXPECT_GT(spec.spec.num_accepted_tokens, 0);
    EXPECT_LT(spec.spec.num_accepted_tokens, spec.spec.num_draft_tokens);
    for (size_t i = 0; i < plain.results.size(); ++i) {
      const Result& a = plain.results[i];
      const Result& b = spec.results[i];
      ASSERT_TRUE(a.finished && b.finished) << i;
      ASSERT_EQ(a.tokens.size(), b.tokens.size()) << i;
      for (size_t t = 0; t < a.tokens.size(); ++t) {
        ASSERT_EQ(a.tokens[t].token, b.tokens[t].token) << "request " << i << " token " << t;
        EXPECT_EQ(std::memcmp(&a.tokens[t].logprob, &b.tokens[t].logprob, 4), 0)
            << "request " << i << " token " << t;
      }
    }
  }
}

TEST(GpuSpeculative, NgramDraftsMatchNoSpeculationWithinBf16Drift) {
  REQUIRE_GPU();
  for (Variant v : {Variant::kBundled, Variant::kDsaFp8}) {
    SCOPED_TRACE(v == Variant::kBundled ? "bundled" : "dsa fp8");
    const SpecRun plain = run(v, false, 0);
    const SpecRun spec = run(v, false, 4);
    EXPECT_GT(spec.spec.num_accepted_tokens, 0);
    double sum = 0.0;
    int64_t n = 0;
    for (size_t i = 0; i < plain.results.size(); ++i) {
      const Result& a = plain.results[i];
      const Result& b = spec.results[i];
      ASSERT_TRUE(a.finished && b.finished) << i;
      ASSERT_EQ(a.tokens.size(), b.tokens.size()) << i;
      for (size_t t = 0; t < a.tokens.size() && a.tokens[t].token == b.tokens[t].token; ++t) {
        sum += std::fabs(a.tokens[t].logprob - b.tokens[t].logprob);
        ++n;
      }
    }
    // Until the sequences part, the logprobs differ by the bf16 drift alone: a wrong context
    // (a position, a state, a draft's key) would move them by whole units.
    ASSERT_GT(n, 40);
    EXPECT_LT(sum / static_cast<double>(n), 0.25) << n << " tokens compared";
  }
}

}  // namespace
}  // namespace hyserve
