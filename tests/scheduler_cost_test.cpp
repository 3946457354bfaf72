// The prefill cost cap (SchedulerConfig::max_step_prefill_cost) on the Scheduler with
// hand-made requests and a runner that samples token 1 for every request that samples: a
// long prompt's chunks shrink as its context grows so that each step's cost (step_cost of
// every scheduled request) stays within the cap, every decode runs in every step, chunk
// ends stay aligned, and the prompt still finishes; with the cap off (or too high to bite)
// the chunks are the token budget's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "util/error.h"

namespace hyserve {
namespace {

constexpr int32_t kVocab = 50;
constexpr int64_t kAlign = 64;

SchedulerConfig cost_config(int64_t max_num_batched_tokens, int64_t max_step_prefill_cost) {
  SchedulerConfig c;
  c.max_num_batched_tokens = max_num_batched_tokens;
  c.max_num_seqs = 64;
  c.max_model_len = 40000;
  c.vocab_size = kVocab;
  c.eos_token_ids = {7};
  c.prefill_chunk_alignment = kAlign;
  c.max_step_prefill_cost = max_step_prefill_cost;
  return c;
}

KvCacheConfig cost_kv() {
  KvCacheConfig kv;
  kv.num_blocks = 8192;
  kv.block_size = 16;
  return kv;
}

Request request(const std::string& id, int64_t num_prompt_tokens, int64_t max_tokens) {
  Request r{.id = id, .prompt_token_ids = std::vector<int32_t>(num_prompt_tokens, 3)};
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  return r;
}

// One step: schedule, then every sampling request gets token 1.
SchedulerOutput run_step(Scheduler& s) {
  SchedulerOutput out = s.schedule();
  ModelRunnerOutput result;
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids[r.request_id] = {1};
  }
  s.update_from_output(out, result);
  return out;
}

int64_t cost_of(const SchedulerOutput& out, int64_t linear) {
  int64_t cost = 0;
  for (const ScheduledRequest& r : out.requests) {
    cost += step_cost(r.start_position, r.num_new_tokens(), linear);
  }
  return cost;
}

const ScheduledRequest* find(const SchedulerOutput& out, const std::string& id) {
  for (const ScheduledRequest& r : out.requests) {
    if (r.request_id == id) return &r;
  }
  return nullptr;
}

// The long prompt's chunks (start position, tokens) while 20 requests decode; every step
// is checked: all 20 decodes in it, aligned chunk ends, the cost within the cap or the
// prefill chunk the least aligned one.
struct LongPromptRun {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  int64_t max_cost = 0;
};

LongPromptRun run_long_prompt(const SchedulerConfig& config, int64_t num_prompt_tokens) {
  Scheduler s(config, cost_kv());
  constexpr int kStreams = 20;
  for (int i = 0; i < kStreams; ++i) s.add_request(request(str_cat("d", i), 8, 5000));
  run_step(s);  // the 20 short prompts, whole
  s.add_request(request("long", num_prompt_tokens, 1));
  LongPromptRun run;
  const int64_t linear = config.prefill_linear_cost_tokens;
  for (int step = 0; step < 5000 && s.find_request("long") != nullptr; ++step) {
    const SchedulerOutput out = run_step(s);
    EXPECT_EQ(std::ssize(out.requests), kStreams + 1) << "step " << step;
    for (int i = 0; i < kStreams; ++i) {
      const ScheduledRequest* d = find(out, str_cat("d", i));
      EXPECT_TRUE(d != nullptr && d->num_new_tokens() == 1)
          << "step " << step << ": d" << i << " got no token";
    }
    const ScheduledRequest* chunk = find(out, "long");
    if (chunk == nullptr) {
      ADD_FAILURE() << "step " << step << ": the long prompt made no progress";
      break;
    }
    const int64_t end = chunk->start_position + chunk->num_new_tokens();
    EXPECT_TRUE(end % kAlign == 0 || end == num_prompt_tokens) << "chunk end " << end;
    const int64_t cost = cost_of(out, linear);
    if (config.max_step_prefill_cost > 0) {
      EXPECT_TRUE(cost <= config.max_step_prefill_cost || chunk->num_new_tokens() == kAlign)
          << "step " << step << ": cost " << cost << ", chunk " << chunk->num_new_tokens();
    }
    run.max_cost = std::max(run.max_cost, cost);
    run.chunks.emplace_back(chunk->start_position, chunk->num_new_tokens());
  }
  EXPECT_EQ(s.find_request("long"), nullptr) << "the long prompt never finished";
  EXPECT_TRUE(!run.chunks.empty() &&
              run.chunks.back().first + run.chunks.back().second == num_prompt_tokens);
  return run;
}

TEST(SchedulerCostCap, LongPromptChunksShrinkWithContextWhileEveryDecodeRuns) {
  SchedulerConfig config = cost_config(2048, 0);
  config.max_step_prefill_cost = default_max_step_prefill_cost(config);
  EXPECT_EQ(config.max_step_prefill_cost, 2048 * 1024 + 2048 * 2048 / 2);
  const LongPromptRun capped = run_long_prompt(config, 16384);
  const LongPromptRun off = run_long_prompt(cost_config(2048, 0), 16384);

  // The first chunk is the token budget's (2048 - 20 decodes, aligned down); later ones
  // shrink as the context grows, never below one aligned chunk.
  ASSERT_GE(capped.chunks.size(), 3u);
  EXPECT_EQ(capped.chunks[0], off.chunks[0]);
  EXPECT_EQ(capped.chunks[0].second, 1984);
  for (size_t i = 1; i < capped.chunks.size(); ++i) {
    EXPECT_LE(capped.chunks[i].second, capped.chunks[i - 1].second) << "chunk " << i;
    EXPECT_GE(capped.chunks[i].second, kAlign) << "chunk " << i;
  }
  // At 8K of context a step affords 2048 x 1024 + 2048^2 / 2 = 4,194,304 units, less the
  // decodes' ~20 x 1,100: about 430 tokens, 384 after alignment.
  for (const auto& [start, n] : capped.chunks) {
    if (start >= 8192 && start < 8192 + 512) {
      EXPECT_EQ(n, 384) << "chunk at " << start;
    }
  }
  EXPECT_LE(capped.max_cost, config.max_step_prefill_cost);
  EXPECT_GT(off.max_cost, 4 * config.max_step_prefill_cost);
  EXPECT_GT(capped.chunks.size(), off.chunks.size());
}

// Off, or on but never biting: exactly the token budget's chunks (the budget less the
// decodes, aligned down).
TEST(SchedulerCostCap, OffOrTooHighToBiteKeepsTheTokenBudgetsChunks) {
  const LongPromptRun off = run_long_prompt(cost_config(2048, 0), 16384);
  const LongPromptRun high = run_long_prompt(cost_config(2048, int64_t{1} << 40), 16384);
  EXPECT_EQ(high.chunks, off.chunks);
  std::vector<std::pair<int64_t, int64_t>> want;
  for (int64_t p = 0; p < 16384;) {
    const int64_t end = std::min<int64_t>(16384, (p + 2048 - 20) / kAlign * kAlign);
    want.emplace_back(p, end - p);
    p = end;
  }
  EXPECT_EQ(off.chunks, want);
}

// Alone, with a cap below any chunk's cost, a long prompt advances one aligned chunk per
// step; a second prompt prefilling beside it waits until the first is done.
TEST(SchedulerCostCap, AFirstPrefillAlwaysAdvancesOneAlignedChunk) {
  Scheduler s(cost_config(2048, 1000), cost_kv());
  s.add_request(request("a", 1000, 1));
  s.add_request(request("b", 100, 1));
  int64_t computed = 0;
  while (s.find_request("a") != nullptr) {
    const SchedulerOutput out = run_step(s);
    ASSERT_EQ(out.requests.size(), 1u);
    const ScheduledRequest& r = out.requests[0];
    ASSERT_EQ(r.request_id, "a");
    EXPECT_EQ(r.start_position, computed);
    EXPECT_EQ(r.num_new_tokens(), std::min<int64_t>(kAlign, 1000 - computed));
    computed += r.num_new_tokens();
  }
  EXPECT_EQ(computed, 1000);
  const SchedulerOutput out = run_step(s);
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].request_id, "b");
  EXPECT_EQ(out.requests[0].num_new_tokens(), kAlign);
}

// Without an alignment the least chunk is one token.
TEST(SchedulerCostCap, WithoutAlignmentTheLeastChunkIsOneToken) {
  SchedulerConfig config = cost_config(2048, 5000);
  config.prefill_chunk_alignment = 0;
  config.prefill_linear_cost_tokens = 100;
  Scheduler s(config, cost_kv());
  s.add_request(request("a", 200, 1));
  std::vector<int64_t> chunks;
  while (s.find_request("a") != nullptr) chunks.push_back(run_step(s).num_scheduled_tokens);
  // 5000 units: 41 tokens from 0 (41 x 100 + 41^2 / 2 = 4940), then fewer.
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0], 41);
  int64_t p = 0;
  for (int64_t n : chunks) {
    EXPECT_TRUE(step_cost(p, n, 100) <= 5000 || n == 1) << "chunk of " << n << " at " << p;
    if (n > 1 && p + n < 200) {
      EXPECT_GT(step_cost(p, n + 1, 100), 5000) << "chunk at " << p << " could be longer";
    }
    p += n;
  }
  EXPECT_EQ(p, 200);
}

// An abort of a request mid-prefill frees its blocks at once; the next step runs without it
// and reports it finished.
TEST(SchedulerCostCap, AbortMidPrefillTakesEffectInTheNextStep) {
  Scheduler s(cost_config(2048, 1'000'000), cost_kv());
  s.add_request(request("long", 16384, 1));
  s.add_request(request("d", 8, 100));
  run_step(s);
  run_step(s);
  ASSERT_NE(s.find_request("long"), nullptr);
  EXPECT_GT(s.find_request("long")->num_computed_tokens, 0);
  const double before = s.kv_cache().usage();
  EXPECT_TRUE(s.abort_request("long"));
  EXPECT_LT(s.kv_cache().usage(), before);
  const SchedulerOutput out = run_step(s);
  EXPECT_EQ(out.finished_request_ids, std::vector<std::string>{"long"});
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].request_id, "d");
  s.abort_request("d");
  EXPECT_DOUBLE_EQ(s.kv_cache().usage(), 0.0);
}

TEST(SchedulerCostCap, RefusesANegativeCap) {
  EXPECT_THROW(Scheduler(cost_config(2048, -1), cost_kv()), Error);
}

}  // namespace
}  // namespace hyserve
