// Scheduler with fake requests and a fake model. The fake model's token at position p of
// request r is fake_token(r.id, p), so the output a request would have alone is known in
// closed form (alone_output). The fake runner also plays the device: it keeps a "KV cache"
// (one prefix hash per slot) and "KDA state" rows (prefix hash + position), checks that every
// step reads exactly the cached prefix it should (inputs, slots, restored and zeroed states),
// and follows the snapshot copies. So a scheduling, preemption or prefix-cache mistake shows
// either as a wrong output or as a failed device check.
#include "engine/scheduler.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

constexpr int32_t kVocab = 50;
constexpr int32_t kEos = 7;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_id(const std::string& id) {
  uint64_t h = 1469598103934665603ull;
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

int32_t fake_token(const std::string& id, int64_t pos) {
  return static_cast<int32_t>(mix(hash_id(id) ^ mix(static_cast<uint64_t>(pos))) % kVocab);
}

// Prefix hash of tokens [0, p]: chain[p + 1]; chain[0] is the empty prefix.
std::vector<uint64_t> prefix_chain(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> chain{mix(12345)};
  for (int32_t t : tokens) chain.push_back(mix(chain.back() ^ static_cast<uint64_t>(t)));
  return chain;
}

// The output of `r` run alone: fake tokens until EOS / a stop token (after min_tokens) or
// the length limit min(prompt + max_tokens, max_model_len).
std::vector<int32_t> alone_output(const Request& r, int64_t max_model_len) {
  const SamplingParams& sp = r.sampling_params;
  const int64_t prompt = r.num_prompt_tokens();
  const int64_t limit =
      sp.max_tokens ? std::min(prompt + *sp.max_tokens, max_model_len) : max_model_len;
  std::vector<int32_t> out;
  for (int64_t pos = prompt;; ++pos) {
    const int32_t t = fake_token(r.id, pos);
    out.push_back(t);
    const bool can_stop = static_cast<int64_t>(out.size()) >= sp.min_tokens;
    if (can_stop && !sp.ignore_eos && t == kEos) break;
    if (can_stop && std::ranges::find(sp.stop_token_ids, t) != sp.stop_token_ids.end()) break;
    if (prompt + static_cast<int64_t>(out.size()) >= limit) break;
  }
  return out;
}

class FakeRunner {
 public:
  explicit FakeRunner(const KvCacheConfig& kv)
      : block_size_(kv.block_size),
        kv_(static_cast<size_t>(kv.num_blocks * kv.block_size), 0),
        state_(kv.num_blocks) {}

  // The sequence (prompt + alone output) the request must see.
  void expect(const Request& r, int64_t max_model_len) {
    std::vector<int32_t> seq = r.prompt_token_ids;
    const auto out = alone_output(r, max_model_len);
    seq.insert(seq.end(), out.begin(), out.end());
    chains_[r.id] = prefix_chain(seq);
    num_tokens_[r.id] = r.num_prompt_tokens();
    sequences_[r.id] = std::move(seq);
  }

  ModelRunnerOutput execute(const SchedulerOutput& step) {
    ModelRunnerOutput result;
    for (const ScheduledRequest& s : step.requests) {
      const auto& seq = sequences_.at(s.request_id);
      const auto& chain = chains_.at(s.request_id);
      const int64_t begin = s.start_position;
      const int64_t end = begin + s.num_new_tokens();
      EXPECT_GT(s.num_new_tokens(), 0) << s.request_id;
      EXPECT_EQ(s.token_ids, std::vector<int32_t>(seq.begin() + begin, seq.begin() + end))
          << s.request_id << " inputs at " << begin;
      // Attention reads every earlier position: each slot must hold that exact prefix.
      for (int64_t p = 0; p < begin; ++p) {
        const uint64_t held = kv_[slot(s, p)];
        if (held != chain[p + 1]) {
          ADD_FAILURE() << s.request_id << ": KV slot of position " << p << " holds a wrong prefix";
          break;
        }
      }
      if (s.state_block) {
        State& st = state_[*s.state_block];
        if (s.restore_state_from) {
          st = state_[*s.restore_state_from];
        } else if (begin == 0) {
          st = State{chain[0], 0};
        }
        EXPECT_EQ(st.pos, begin) << s.request_id << ": KDA state at the wrong position";
        EXPECT_EQ(st.prefix, chain[begin]) << s.request_id << ": KDA state of another prefix";
        st = State{chain[end], end};
      }
      for (int64_t p = begin; p < end; ++p) {
        EXPECT_EQ(s.slot_mapping[p - begin], slot(s, p));
        kv_[slot(s, p)] = chain[p + 1];
      }
      int64_t& num_tokens = num_tokens_.at(s.request_id);
      EXPECT_LE(end, num_tokens) << s.request_id;
      EXPECT_EQ(s.samples, end == num_tokens) << s.request_id;
      if (s.samples) {
        result.sampled_token_ids[s.request_id] = {fake_token(s.request_id, end)};
        ++num_tokens;
      }
    }
    for (const SnapshotCopy& c : step.snapshot_copies) {
      EXPECT_EQ(state_[c.state_block].pos, c.num_tokens) << c.request_id << " snapshot";
      state_[c.snapshot_block] = state_[c.state_block];
    }
    return result;
  }

 private:
  struct State {
    uint64_t prefix = 0;
    int64_t pos = -1;
  };

  int64_t slot(const ScheduledRequest& s, int64_t pos) const {
    return int64_t{s.block_ids.at(pos / block_size_)} * block_size_ + pos % block_size_;
  }

  int64_t block_size_;
  std::vector<uint64_t> kv_;  // [num_blocks * block_size] prefix hash written in each slot
  std::vector<State> state_;  // [num_blocks] KDA state rows
  std::map<std::string, std::vector<int32_t>> sequences_;
  std::map<std::string, std::vector<uint64_t>> chains_;
  std::map<std::string, int64_t> num_tokens_;  // prompt + tokens sampled so far
};

// Runs a scheduler and the fake runner, collecting streamed outputs and checking the pool.
struct Harness {
  Harness(const SchedulerConfig& config, const KvCacheConfig& kv)
      : scheduler(config, kv), runner(kv) {}

  void add(Request r) {
    runner.expect(r, scheduler.config().max_model_len);
    expected[r.id] = alone_output(r, scheduler.config().max_model_len);
    scheduler.add_request(std::move(r));
  }

  SchedulerOutput step() {
    SchedulerOutput out = schedule();
    finish_step(out);
    return out;
  }

  SchedulerOutput schedule() {
    SchedulerOutput out = scheduler.schedule();
    EXPECT_LE(out.num_scheduled_tokens, scheduler.config().max_num_batched_tokens);
    EXPECT_LE(static_cast<int64_t>(out.requests.size()), scheduler.config().max_num_seqs);
    EXPECT_LE(scheduler.num_running(), scheduler.config().max_num_seqs);
    int64_t total = 0;
    for (const auto& s : out.requests) total += s.num_new_tokens();
    EXPECT_EQ(total, out.num_scheduled_tokens);
    for (const auto& id : out.preempted_request_ids) ++num_preemptions[id];
    return out;
  }

  // extra_finished: requests the detokenizer finishes in this step (stop strings).
  void finish_step(const SchedulerOutput& out,
                   const std::map<std::string, RequestStatus>& extra_finished = {}) {
    ModelRunnerOutput result = runner.execute(out);
    result.finished.insert(extra_finished.begin(), extra_finished.end());
    for (const RequestUpdate& u : scheduler.update_from_output(out, result)) {
      auto& o = outputs[u.request_id];
      o.insert(o.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (is_finished(u.status)) {
        EXPECT_FALSE(status.contains(u.request_id)) << u.request_id << " finished twice";
        status[u.request_id] = u.status;
        finish_order.push_back(u.request_id);
      }
    }
    scheduler.kv_cache().pool().check_invariants();
    ++num_steps;
  }

  void run_to_completion(int max_steps = 100000) {
    while (scheduler.has_unfinished_requests()) {
      ASSERT_LT(num_steps, max_steps) << "no progress";
      step();
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_DOUBLE_EQ(scheduler.kv_cache().usage(), 0.0);
  }

  // Every finished, non-aborted request produced its alone output, with the right reason.
  void check_outputs(const std::set<std::string>& aborted = {}) {
    for (const auto& [id, want] : expected) {
      if (aborted.contains(id)) continue;
      ASSERT_TRUE(status.contains(id)) << id << " never finished";
      EXPECT_EQ(outputs[id], want) << id;
      EXPECT_NE(status[id], RequestStatus::kFinishedAborted) << id;
    }
  }

  Scheduler scheduler;
  FakeRunner runner;
  std::map<std::string, std::vector<int32_t>> expected, outputs;
  std::map<std::string, RequestStatus> status;
  std::map<std::string, int> num_preemptions;
  std::vector<std::string> finish_order;
  int num_steps = 0;
};

SchedulerConfig make_config(int64_t budget, int64_t max_num_seqs, int64_t max_model_len,
                            SchedulingPolicy policy = SchedulingPolicy::kFcfs) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_num_seqs;
  c.max_model_len = max_model_len;
  c.vocab_size = kVocab;
  c.policy = policy;
  c.eos_token_ids = {kEos};
  return c;
}

KvCacheConfig make_kv(int32_t num_blocks, int64_t block_size, bool kda = false, bool prefix = false,
                      int64_t every_blocks = 0) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.has_kda_layers = kda;
  c.enable_prefix_caching = prefix;
  c.snapshot_policy.every_blocks = every_blocks;
  return c;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, kVocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

Request make_request(const std::string& id, std::vector<int32_t> prompt,
                     std::optional<int64_t> max_tokens, int32_t priority = 0,
                     double arrival = 0.0) {
  Request r{.id = id, .prompt_token_ids = std::move(prompt)};
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.ignore_eos = true;
  r.priority = priority;
  r.arrival_time = arrival;
  return r;
}

TEST(SamplingParamsTest, ValidateNamesTheFieldOutOfRange) {
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate(kVocab, 100));
  ok.temperature = 0.0f;
  ok.top_p = 1.0f;
  ok.top_k = -1;
  ok.min_p = 1.0f;
  ok.presence_penalty = -2.0f;
  ok.frequency_penalty = 2.0f;
  ok.max_tokens = 100;
  ok.min_tokens = 100;
  ok.logprobs = 0;
  ok.prompt_logprobs = 20;
  ok.stop_token_ids = {0, kVocab - 1};
  ok.logit_bias = {{kVocab - 1, -100.0f}};
  EXPECT_NO_THROW(ok.validate(kVocab, 100));

  struct Case {
    const char* field;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.1f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.1f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{kVocab, 1.0f}};
       }},
      {"stop",
       [](SamplingParams& p) {
         p.stop = {"ok", ""};
       }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 101; }},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = -1; }},
      {"min_tokens", [](SamplingParams& p) { p.max_tokens = 5, p.min_tokens = 6; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
      {"prompt_logprobs", [](SamplingParams& p) { p.prompt_logprobs = -1; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    try {
      p.validate(kVocab, 100);
      ADD_FAILURE() << c.field << ": accepted";
    } catch (const InvalidRequest& e) {
      EXPECT_EQ(e.param(), c.field) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }
}

TEST(SchedulerTest, ChunkedPrefillRunsUnderTheBudgetWhileDecodesContinue) {
  Harness h(make_config(256, 16, 2048), make_kv(256, 16));
  std::mt19937 rng(1);
  h.add(make_request("d1", random_tokens(rng, 10), 50));
  h.add(make_request("d2", random_tokens(rng, 12), 50));
  h.step();  // both prompts in one step
  h.add(make_request("long", random_tokens(rng, 1000), 5));
  std::vector<int64_t> chunks;
  for (int i = 0; i < 4; ++i) {
    const SchedulerOutput out = h.step();
    ASSERT_EQ(out.requests.size(), 3u);
    EXPECT_EQ(out.requests[0].request_id, "d1");
    EXPECT_EQ(out.requests[1].request_id, "d2");
    EXPECT_EQ(out.requests[0].num_new_tokens(), 1);
    EXPECT_EQ(out.requests[1].num_new_tokens(), 1);
    EXPECT_EQ(out.requests[2].request_id, "long");
    chunks.push_back(out.requests[2].num_new_tokens());
    EXPECT_EQ(out.requests[2].samples, i == 3);
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{254, 254, 254, 238}));
  h.run_to_completion();
  h.check_outputs();
}

TEST(SchedulerTest, LongPrefillThresholdCapsEachStep) {
  SchedulerConfig config = make_config(256, 16, 2048);
  config.long_prefill_token_threshold = 100;
  Harness h(config, make_kv(256, 16));
  std::mt19937 rng(2);
  h.add(make_request("a", random_tokens(rng, 250), 3));
  h.add(make_request("b", random_tokens(rng, 250), 3));
  std::vector<int64_t> a_chunks;
  while (h.scheduler.has_unfinished_requests()) {
    const SchedulerOutput out = h.step();
    for (const auto& s : out.requests) {
      EXPECT_LE(s.num_new_tokens(), 100);
      if (s.request_id == "a") a_chunks.push_back(s.num_new_tokens());
    }
  }
  EXPECT_EQ(a_chunks, (std::vector<int64_t>{100, 100, 50, 1, 1}));
  h.check_outputs();
}

TEST(SchedulerTest, MaxNumSeqsIsRespected) {
  Harness h(make_config(512, 3, 512), make_kv(256, 16));
  std::mt19937 rng(3);
  for (int i = 0; i < 10; ++i) {
    h.add(make_request(str_cat("r", i), random_tokens(rng, 5 + i * 7), 4 + i));
  }
  size_t most = 0;
  while (h.scheduler.has_unfinished_requests()) {
    most = std::max(most, h.step().requests.size());
    EXPECT_LE(h.scheduler.num_running(), 3);
  }
  EXPECT_EQ(most, 3u);
  h.check_outputs();
}

TEST(SchedulerTest, FcfsAdmitsInAddOrderWhateverThePriority) {
  Harness h(make_config(512, 1, 512), make_kv(64, 16));
  std::mt19937 rng(4);
  for (int i = 0; i < 5; ++i) {
    h.add(make_request(str_cat("r", i), random_tokens(rng, 20), 3, /*priority=*/-i,
                       /*arrival=*/10.0 - i));
  }
  h.run_to_completion();
  EXPECT_EQ(h.finish_order, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4"}));
  h.check_outputs();
}

TEST(SchedulerTest, PriorityAdmitsByPriorityThenArrival) {
  Harness h(make_config(512, 1, 512, SchedulingPolicy::kPriority), make_kv(64, 16));
  std::mt19937 rng(5);
  h.add(make_request("a", random_tokens(rng, 20), 3, 5, 0.0));
  h.add(make_request("b", random_tokens(rng, 20), 3, 1, 1.0));
  h.add(make_request("c", random_tokens(rng, 20), 3, 1, 0.5));
  h.add(make_request("d", random_tokens(rng, 20), 3, 3, 2.0));
  h.add(make_request("e", random_tokens(rng, 20), 3, 1, 0.5));  // ties with c: add order
  h.run_to_completion();
  EXPECT_EQ(h.finish_order, (std::vector<std::string>{"c", "e", "b", "d", "a"}));
  h.check_outputs();
}

// Two requests outgrow an 8-block pool: the victim is the least urgent running request,
// the later-added one under fcfs, the lower-priority one under priority (though it came
// first). Both still produce their alone outputs.
TEST(SchedulerTest, PreemptionPicksTheLeastUrgentRunningRequest) {
  for (auto policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    Harness h(make_config(64, 4, 64, policy), make_kv(8, 4));
    std::mt19937 rng(6);
    h.add(make_request("low", random_tokens(rng, 8), 20, /*priority=*/10, 0.0));
    h.step();
    h.add(make_request("high", random_tokens(rng, 8), 20, /*priority=*/0, 1.0));
    h.run_to_completion();
    h.check_outputs();
    const std::string victim = policy == SchedulingPolicy::kFcfs ? "high" : "low";
    const std::string other = policy == SchedulingPolicy::kFcfs ? "low" : "high";
    EXPECT_GE(h.num_preemptions[victim], 1) << "policy " << static_cast<int>(policy);
    EXPECT_EQ(h.num_preemptions[other], 0) << "policy " << static_cast<int>(policy);
    EXPECT_EQ(h.finish_order.front(), other);
  }
}

TEST(SchedulerTest, PreemptionByRecomputeResumesExactly) {
  for (bool kda : {false, true}) {
    Harness h(make_config(64, 8, 256), make_kv(24, 4, kda));
    std::mt19937 rng(7);
    for (int i = 0; i < 8; ++i) {
      Request r = make_request(str_cat("r", i), random_tokens(rng, 3 + 5 * i), 30 + i);
      r.sampling_params.ignore_eos = i % 2 == 0;  // some stop at EOS
      h.add(std::move(r));
    }
    h.run_to_completion();
    h.check_outputs();
    int total = 0;
    for (const auto& [id, n] : h.num_preemptions) total += n;
    EXPECT_GT(total, 0) << "the pool should have forced preemptions";
  }
}

TEST(SchedulerTest, AbortFreesBlocksAtOnce) {
  Harness h(make_config(64, 4, 512), make_kv(64, 4, true, true));
  std::mt19937 rng(8);
  for (int i = 0; i < 8; ++i) {
    h.add(make_request(str_cat("r", i), random_tokens(rng, 40), 100));
  }
  for (int i = 0; i < 3; ++i) h.step();
  ASSERT_GT(h.scheduler.num_running(), 0);
  ASSERT_GT(h.scheduler.num_waiting(), 0);
  const double before = h.scheduler.kv_cache().usage();
  const std::string running_id = "r0";
  ASSERT_EQ(h.scheduler.find_request(running_id)->status, RequestStatus::kRunning);
  EXPECT_TRUE(h.scheduler.abort_request(running_id));
  EXPECT_LT(h.scheduler.kv_cache().usage(), before);
  EXPECT_EQ(h.scheduler.find_request(running_id), nullptr);
  EXPECT_FALSE(h.scheduler.abort_request(running_id));
  EXPECT_FALSE(h.scheduler.abort_request("nope"));

  // An abort between schedule() and update_from_output(): the update skips it.
  const SchedulerOutput out = h.schedule();
  ASSERT_FALSE(out.requests.empty());
  EXPECT_EQ(out.finished_request_ids, std::vector<std::string>{running_id});
  const std::string mid_step = out.requests.front().request_id;
  EXPECT_TRUE(h.scheduler.abort_request(mid_step));
  h.finish_step(out);
  EXPECT_EQ(h.scheduler.find_request(mid_step), nullptr);

  for (int i = 0; i < 8; ++i) h.scheduler.abort_request(str_cat("r", i));
  EXPECT_FALSE(h.scheduler.has_unfinished_requests());
  EXPECT_EQ(h.scheduler.num_running(), 0);
  EXPECT_EQ(h.scheduler.num_waiting(), 0);
  EXPECT_DOUBLE_EQ(h.scheduler.kv_cache().usage(), 0.0);
  h.scheduler.kv_cache().pool().check_invariants();
  EXPECT_TRUE(h.scheduler.schedule().requests.empty());
}

// 20,000 queued requests (a prompt batch), 4 running at a time; every other one aborted
// in a shuffled order, waiting and running alike (the queues are ordered sets: one abort
// costs O(log n), not a shift of the whole queue). The rest still run in add order and
// give their alone outputs.
TEST(SchedulerTest, ManyAbortsInAnyOrderKeepTheQueueOrder) {
  constexpr int kNum = 20000;
  Harness h(make_config(64, 4, 64), make_kv(64, 4));
  std::mt19937 rng(12);
  for (int i = 0; i < kNum; ++i) {
    h.add(make_request(str_cat("r", i), random_tokens(rng, 3), 2));
  }
  h.step();
  ASSERT_EQ(h.scheduler.num_running(), 4);
  std::vector<int> victims;
  for (int i = 0; i < kNum; i += 2) victims.push_back(i);
  std::shuffle(victims.begin(), victims.end(), rng);
  std::set<std::string> aborted;
  for (int i : victims) {
    EXPECT_TRUE(h.scheduler.abort_request(str_cat("r", i)));
    aborted.insert(str_cat("r", i));
  }
  EXPECT_EQ(h.scheduler.num_running() + h.scheduler.num_waiting(), kNum / 2);
  h.finish_order.clear();
  h.run_to_completion();
  ASSERT_EQ(h.finish_order.size(), static_cast<size_t>(kNum / 2));
  for (size_t k = 0; k < h.finish_order.size(); ++k) {
    ASSERT_EQ(h.finish_order[k], str_cat("r", 2 * k + 1));
  }
  h.check_outputs(aborted);
  EXPECT_DOUBLE_EQ(h.scheduler.kv_cache().usage(), 0.0);
}

// a runs first; b shares 90 of its 100 prompt tokens, c all of them. With KDA layers a hit
// lands only where a left a snapshot (every 2 blocks of 16 and at its last full prompt block:
// 32, 64, 96); without, at any block boundary.
TEST(SchedulerTest, PrefixHitsSkipComputationOnlyAtSnapshotBoundaries) {
  for (bool kda : {true, false}) {
    Harness h(make_config(512, 8, 512), make_kv(64, 16, kda, true, 2));
    std::mt19937 rng(9);
    const auto prompt = random_tokens(rng, 100);
    h.add(make_request("a", prompt, 4));
    std::vector<int64_t> a_chunks;
    while (h.scheduler.has_unfinished_requests()) {
      const SchedulerOutput out = h.step();
      a_chunks.push_back(out.requests.at(0).num_new_tokens());
      if (kda) {
        EXPECT_EQ(out.snapshot_copies.size(), a_chunks.size() <= 3 ? 1u : 0u);
      }
    }
    if (kda) {
      EXPECT_EQ(a_chunks, (std::vector<int64_t>{32, 32, 32, 4, 1, 1, 1}));
    } else {
      EXPECT_EQ(a_chunks, (std::vector<int64_t>{100, 1, 1, 1}));
    }
    auto b_prompt = prompt;
    for (int i = 90; i < 100; ++i) b_prompt[i] = (b_prompt[i] + 1) % kVocab;
    h.add(make_request("b", b_prompt, 4));
    const SchedulerOutput b_first = h.step();
    ASSERT_EQ(b_first.requests.size(), 1u);
    EXPECT_EQ(b_first.requests[0].start_position, kda ? 64 : 80);
    EXPECT_EQ(b_first.requests[0].restore_state_from.has_value(), kda);
    EXPECT_EQ(h.scheduler.find_request("b")->num_cached_prompt_tokens, kda ? 64 : 80);
    h.run_to_completion();
    h.add(make_request("c", prompt, 4));
    EXPECT_EQ(h.step().requests.at(0).start_position, 96);
    h.run_to_completion();
    h.check_outputs();
    const PrefixCacheStats& stats = h.scheduler.kv_cache().prefix_cache_stats();
    EXPECT_EQ(stats.num_requests, 3);
    EXPECT_EQ(stats.num_query_tokens, 300);
    EXPECT_EQ(stats.num_hit_tokens, (kda ? 64 : 80) + 96);
  }
}

TEST(SchedulerTest, RequestsThatCanNeverRunAreRejected) {
  // max_model_len 64; the pool holds 8 blocks of 4 = 32 tokens.
  Scheduler s(make_config(64, 4, 64), make_kv(8, 4));
  std::mt19937 rng(10);
  const auto rejects = [&](Request r, const std::string& needle) {
    try {
      s.add_request(std::move(r));
      ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  rejects(make_request("p64", random_tokens(rng, 64), 1), "your request has 64 input tokens");
  rejects(make_request("over", random_tokens(rng, 40), 30), "is too large: 30");
  rejects(make_request("pool", random_tokens(rng, 20), 20), "needs 10 KV blocks");
  rejects(make_request("unbounded", random_tokens(rng, 20), std::nullopt), "needs 16 KV blocks");
  rejects(make_request("empty", {}, 5), "empty");
  rejects(make_request("badtok", {1, kVocab}, 5), "out of vocabulary");
  Request hot = make_request("hot", random_tokens(rng, 5), 5);
  hot.sampling_params.temperature = -1.0f;
  rejects(hot, "temperature");
  EXPECT_FALSE(s.has_unfinished_requests());
  s.add_request(make_request("fits", random_tokens(rng, 20), 13));  // 32 positions: 8 blocks
  rejects(make_request("fits", random_tokens(rng, 5), 5), "already in use");

  Scheduler with_kda(make_config(64, 4, 64), make_kv(8, 4, true));
  EXPECT_THROW(with_kda.add_request(make_request("fits", random_tokens(rng, 20), 13)),
               InvalidArgument);  // + its KDA state block
}

TEST(SchedulerTest, StopConditions) {
  Harness h(make_config(512, 8, 40), make_kv(64, 4));
  std::mt19937 rng(11);
  const auto prompt = random_tokens(rng, 10);
  // Find where the fake model emits EOS for id "eos", to place min_tokens around it.
  int64_t first_eos = -1;
  for (int64_t p = 10; p < 40 && first_eos < 0; ++p) {
    if (fake_token("eos", p) == kEos) first_eos = p - 10 + 1;
  }
  Request eos = make_request("eos", prompt, std::nullopt);
  eos.sampling_params.ignore_eos = false;
  h.add(std::move(eos));
  Request min_tok = make_request("min", prompt, 25);
  min_tok.sampling_params.ignore_eos = false;
  min_tok.sampling_params.min_tokens = 20;
  h.add(std::move(min_tok));
  Request stop_id = make_request("stopid", prompt, 25);
  stop_id.sampling_params.stop_token_ids = {fake_token("stopid", 13)};
  h.add(std::move(stop_id));
  h.add(make_request("len", prompt, std::nullopt));  // runs to max_model_len
  Request by_string = make_request("string", prompt, 25);
  h.add(std::move(by_string));
  for (int i = 0; i < 3; ++i) h.step();
  // The detokenizer reports a stop string for "string" along with this step's token.
  h.finish_step(h.schedule(), {{"string", RequestStatus::kFinishedStopped}});
  EXPECT_EQ(h.scheduler.find_request("string"), nullptr);
  EXPECT_EQ(h.status["string"], RequestStatus::kFinishedStopped);
  EXPECT_EQ(h.outputs["string"].size(), 4u);
  h.expected.erase("string");
  h.run_to_completion();
  h.check_outputs();
  EXPECT_EQ(h.outputs["len"].size(), 30u);
  EXPECT_EQ(h.status["len"], RequestStatus::kFinishedLength);
  EXPECT_EQ(h.status["stopid"], RequestStatus::kFinishedStopped);
  EXPECT_LE(h.outputs["stopid"].size(), 4u);
  EXPECT_GE(h.outputs["min"].size(), 20u);
  if (first_eos > 0) {
    EXPECT_EQ(h.outputs["eos"].size(), static_cast<size_t>(first_eos));
    EXPECT_EQ(h.status["eos"], RequestStatus::kFinishedStopped);
  }
}

TEST(SchedulerTest, ChunkedPrefillOffRunsPromptsWhole) {
  SchedulerConfig config = make_config(128, 8, 128);
  config.enable_chunked_prefill = false;
  Harness h(config, make_kv(128, 4));
  std::mt19937 rng(12);
  h.add(make_request("a", random_tokens(rng, 100), 5));
  h.add(make_request("b", random_tokens(rng, 100), 5));
  const SchedulerOutput first = h.step();
  ASSERT_EQ(first.requests.size(), 1u);
  EXPECT_EQ(first.requests[0].num_new_tokens(), 100);
  const SchedulerOutput second = h.step();
  ASSERT_EQ(second.requests.size(), 2u);
  EXPECT_EQ(second.requests[1].num_new_tokens(), 100);
  h.run_to_completion();
  h.check_outputs();
  config.max_num_batched_tokens = 127;
  EXPECT_THROW(Scheduler(config, make_kv(128, 4)), InvalidArgument);
}

// 64 requests with random lengths, arrival steps, priorities, shared prefixes, stop settings
// and aborts, on a pool small enough to force preemptions: every request that is not aborted
// finishes with its exact alone output; the pool invariants hold after every step.
TEST(SchedulerTest, RandomWorkload) {
  struct Variant {
    SchedulingPolicy policy;
    bool kda, prefix;
  };
  for (const Variant v : {Variant{SchedulingPolicy::kFcfs, true, true},
                          Variant{SchedulingPolicy::kPriority, true, true},
                          Variant{SchedulingPolicy::kFcfs, false, true},
                          Variant{SchedulingPolicy::kPriority, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "policy " << static_cast<int>(v.policy) << " kda " << v.kda
                                      << " prefix " << v.prefix);
    Harness h(make_config(96, 8, 300, v.policy), make_kv(80, 8, v.kda, v.prefix, 4));
    std::mt19937 rng(13);
    std::vector<std::vector<int32_t>> bases;
    for (int i = 0; i < 4; ++i) bases.push_back(random_tokens(rng, 150));
    struct Plan {
      int add_step;
      int abort_step;  // -1: never
      Request request;
    };
    std::vector<Plan> plans;
    for (int i = 0; i < 64; ++i) {
      const int len = std::uniform_int_distribution<int>(1, 200)(rng);
      std::vector<int32_t> prompt = random_tokens(rng, len);
      if (rng() % 2 == 0) {
        const auto& base = bases[rng() % bases.size()];
        const int shared = std::min<int>(len, std::uniform_int_distribution<int>(1, 150)(rng));
        std::copy(base.begin(), base.begin() + shared, prompt.begin());
      }
      std::optional<int64_t> max_tokens;
      if (rng() % 4 != 0) max_tokens = std::uniform_int_distribution<int>(1, 60)(rng);
      Request r = make_request(str_cat("q", i), std::move(prompt), max_tokens,
                               static_cast<int32_t>(rng() % 4));
      r.sampling_params.ignore_eos = rng() % 3 == 0;
      if (rng() % 4 == 0) r.sampling_params.stop_token_ids = {static_cast<int32_t>(rng() % 50)};
      if (rng() % 4 == 0)
        r.sampling_params.min_tokens = std::min<int64_t>(5, max_tokens.value_or(5));
      r.cache_salt = rng() % 8 == 0 ? "salt" : "";
      const int add_step = std::uniform_int_distribution<int>(0, 80)(rng);
      r.arrival_time = add_step + std::uniform_real_distribution<double>(0, 1)(rng);
      const int abort_step =
          rng() % 8 == 0 ? add_step + std::uniform_int_distribution<int>(0, 40)(rng) : -1;
      plans.push_back({add_step, abort_step, std::move(r)});
    }
    std::stable_sort(plans.begin(), plans.end(),
                     [](const Plan& a, const Plan& b) { return a.add_step < b.add_step; });
    std::set<std::string> aborted;
    size_t next = 0;
    for (int step = 0; next < plans.size() || h.scheduler.has_unfinished_requests(); ++step) {
      ASSERT_LT(step, 20000) << "no progress";
      for (; next < plans.size() && plans[next].add_step <= step; ++next) {
        h.add(plans[next].request);
      }
      for (const Plan& p : plans) {
        if (p.abort_step == step && h.scheduler.abort_request(p.request.id)) {
          aborted.insert(p.request.id);
          EXPECT_TRUE(h.scheduler.kv_cache().block_table(p.request.id) == nullptr);
        }
      }
      h.step();
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_DOUBLE_EQ(h.scheduler.kv_cache().usage(), 0.0);
    h.check_outputs(aborted);
    int num_preemptions = 0;
    for (const auto& [id, n] : h.num_preemptions) num_preemptions += n;
    EXPECT_GT(num_preemptions, 0) << "the pool should force preemptions";
    EXPECT_EQ(h.scheduler.kv_cache().prefix_cache_stats().num_hit_tokens > 0, v.prefix);
  }
}

}  // namespace
}  // namespace hyserve

namespace hyserve {
namespace {

// Speculative decoding's share of scheduling: a decode step takes the request's drafts as far
// as the budget and its length allow, each with a slot, and update_from_output keeps the
// accepted ones (the rejected positions are computed no more); a prefill chunk takes none.
TEST(SchedulerDrafts, DecodeStepsVerifyDraftsWithinTheBudgetAndLengthAndRollBack) {
  Scheduler s(make_config(6, 4, 64), make_kv(16, 4, /*kda=*/true));
  s.add_request(make_request("a", {1, 2, 3, 4, 5}, 9));
  s.propose_drafts([](const Request&) { return std::vector<int32_t>{9, 9}; });
  // The prompt is a prefill: the drafts are not proposed for it, nor taken.
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].num_draft_tokens, 0);
  EXPECT_EQ(out.requests[0].num_new_tokens(), 5);
  ModelRunnerOutput result;
  result.sampled_token_ids["a"] = {20};
  s.update_from_output(out, result);

  // Decode: 5 drafts, a budget of 6 tokens: all five, after the last token.
  s.propose_drafts([](const Request& r) {
    EXPECT_EQ(r.num_computed_tokens + 1, r.num_tokens());
    return std::vector<int32_t>{30, 31, 32, 33, 34};
  });
  out = s.schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  const ScheduledRequest& step = out.requests[0];
  EXPECT_EQ(step.start_position, 5);
  EXPECT_EQ(step.token_ids, (std::vector<int32_t>{20, 30, 31, 32, 33, 34}));
  EXPECT_EQ(step.num_draft_tokens, 5);
  EXPECT_EQ(step.slot_mapping.size(), 6u);
  EXPECT_TRUE(step.samples);
  EXPECT_EQ(out.num_scheduled_tokens, 6);
  // Two drafts accepted, then a token of the model's own.
  result.sampled_token_ids["a"] = {30, 31, 40};
  std::vector<RequestUpdate> updates = s.update_from_output(out, result);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].new_token_ids, (std::vector<int32_t>{30, 31, 40}));
  const Request* a = s.find_request("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->num_computed_tokens, 8);  // the last token and the two accepted drafts
  EXPECT_EQ(a->num_tokens(), 9);
  EXPECT_TRUE(a->spec_token_ids.empty());

  // max_tokens 9: 4 outputs so far, so at most 5 more; the drafts leave room for the token
  // after them: 4 at most.
  s.propose_drafts([](const Request&) { return std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}; });
  out = s.schedule();
  EXPECT_EQ(out.requests.at(0).num_draft_tokens, 4);
  result.sampled_token_ids["a"] = {1, 2, 3, 4, 8};  // every draft and one more: the limit
  updates = s.update_from_output(out, result);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].status, RequestStatus::kFinishedLength);
  EXPECT_EQ(updates[0].new_token_ids.size(), 5u);
  EXPECT_EQ(s.find_request("a"), nullptr);
}

TEST(SchedulerDrafts, TheBudgetCutsDraftsAndRefusesWrongCounts) {
  Scheduler s(make_config(3, 4, 64), make_kv(16, 4));
  s.add_request(make_request("a", {1, 2}, 20));
  SchedulerOutput out = s.schedule();
  ModelRunnerOutput result;
  result.sampled_token_ids["a"] = {5};
  s.update_from_output(out, result);
  s.propose_drafts([](const Request&) { return std::vector<int32_t>{6, 7, 8, 9}; });
  out = s.schedule();
  // Budget 3: the token and two drafts.
  EXPECT_EQ(out.requests.at(0).num_draft_tokens, 2);
  EXPECT_EQ(out.requests.at(0).token_ids, (std::vector<int32_t>{5, 6, 7}));
  result.sampled_token_ids["a"] = {6, 7, 8, 9};  // more tokens than drafts + 1
  EXPECT_THROW(s.update_from_output(out, result), Error);
}

}  // namespace
}  // namespace hyserve
