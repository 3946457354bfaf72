// The agentic workload's generator (client/agentic_workload.h): deterministic in its seed,
// every turn's prompt extends the previous prompt and reply exactly, and its distributions
// (tool turns, think times, turns per session) have the asked statistics. The run against
// the real server is in bench_serve_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "client/agentic_workload.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

std::vector<int32_t> vocabulary() {
  std::vector<int32_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 5);
  return ids;
}

AgenticOptions small_options() {
  AgenticOptions o;
  o.num_sessions = 50;
  o.system_len = 32;
  o.user_len = 7;
  o.tool_result_len = 19;
  o.output_len = 5;
  o.seed = 11;
  return o;
}

void expect_same(const AgenticWorkload& a, const AgenticWorkload& b) {
  EXPECT_EQ(a.system_ids, b.system_ids);
  ASSERT_EQ(a.sessions.size(), b.sessions.size());
  for (size_t s = 0; s < a.sessions.size(); ++s) {
    ASSERT_EQ(a.sessions[s].turns.size(), b.sessions[s].turns.size()) << "session " << s;
    for (size_t k = 0; k < a.sessions[s].turns.size(); ++k) {
      const AgenticTurn& x = a.sessions[s].turns[k];
      const AgenticTurn& y = b.sessions[s].turns[k];
      EXPECT_EQ(x.tool_result, y.tool_result);
      EXPECT_EQ(x.new_ids, y.new_ids);
      EXPECT_EQ(x.output_len, y.output_len);
      EXPECT_EQ(x.think_time_s, y.think_time_s);
    }
  }
}

TEST(AgenticWorkload, DeterministicInTheSeed) {
  AgenticOptions o = small_options();
  const AgenticWorkload a = make_agentic_workload(o, vocabulary());
  expect_same(a, make_agentic_workload(o, vocabulary()));
  o.seed = 12;
  const AgenticWorkload c = make_agentic_workload(o, vocabulary());
  EXPECT_NE(a.system_ids, c.system_ids);
  EXPECT_EQ(a.system_ids.size(), 32u);
}

TEST(AgenticWorkload, EveryPromptExtendsThePreviousPromptAndReply) {
  AgenticOptions o = small_options();
  o.range_ratio = 0.5;
  const AgenticWorkload w = make_agentic_workload(o, vocabulary());
  for (size_t s = 0; s < w.sessions.size(); ++s) {
    AgenticConversation conversation(w, s);
    std::vector<int32_t> previous = conversation.prompt(0);
    std::vector<int32_t> expected = w.system_ids;
    const auto& turns = w.sessions[s].turns;
    expected.insert(expected.end(), turns[0].new_ids.begin(), turns[0].new_ids.end());
    EXPECT_EQ(previous, expected);
    for (size_t k = 0; k + 1 < turns.size(); ++k) {
      // A made-up reply of the turn's length (the server's ids in a real run).
      std::vector<int32_t> reply(static_cast<size_t>(turns[k].output_len),
                                 static_cast<int32_t>(2000 + k));
      conversation.add_reply(k, reply);
      const std::vector<int32_t> next = conversation.prompt(k + 1);
      expected = previous;
      expected.insert(expected.end(), reply.begin(), reply.end());
      expected.insert(expected.end(), turns[k + 1].new_ids.begin(), turns[k + 1].new_ids.end());
      EXPECT_EQ(next, expected) << "session " << s << " turn " << k + 1;
      previous = next;
    }
  }
  AgenticConversation conversation(w, 0);
  EXPECT_THROW(conversation.prompt(1), InvalidArgument);  // turn 0's reply missing
  EXPECT_THROW(conversation.add_reply(1, {}), InvalidArgument);
}

TEST(AgenticWorkload, ToolTurnsAtTheConfiguredRatio) {
  AgenticOptions o = small_options();
  o.num_sessions = 2000;
  o.tool_call_ratio = 0.3;
  o.turns_dist = "uniform";
  o.min_turns = 2;
  o.max_turns = 10;
  const AgenticWorkload w = make_agentic_workload(o, vocabulary());
  int64_t later = 0, tools = 0;
  for (const AgenticSession& s : w.sessions) {
    EXPECT_FALSE(s.turns[0].tool_result);  // a session opens with a user message
    for (size_t k = 0; k < s.turns.size(); ++k) {
      const AgenticTurn& t = s.turns[k];
      EXPECT_EQ(t.new_ids.size(), t.tool_result ? 19u : 7u);
      EXPECT_EQ(t.output_len, 5);
      if (k == 0) continue;
      ++later;
      tools += t.tool_result ? 1 : 0;
    }
  }
  ASSERT_GT(later, 10000);
  EXPECT_NEAR(static_cast<double>(tools) / static_cast<double>(later), 0.3, 0.015);
}

TEST(AgenticWorkload, ThinkTimesHaveTheirMean) {
  AgenticOptions o = small_options();
  o.num_sessions = 3000;
  o.think_time_s = 2.0;
  double sum = 0, sum_sq = 0;
  int64_t n = 0;
  for (const AgenticSession& s : make_agentic_workload(o, vocabulary()).sessions) {
    EXPECT_EQ(s.turns[0].think_time_s, 0.0);  // turn 0 goes at the session's start
    for (size_t k = 1; k < s.turns.size(); ++k) {
      const double t = s.turns[k].think_time_s;
      EXPECT_GE(t, 0.0);
      sum += t;
      sum_sq += t * t;
      ++n;
    }
  }
  ASSERT_GT(n, 5000);
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 2.0, 0.1);
  // An exponential's standard deviation equals its mean.
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(n) - mean * mean), 2.0, 0.15);

  o.think_time_dist = "constant";
  o.think_time_s = 0.25;
  for (const AgenticSession& s : make_agentic_workload(o, vocabulary()).sessions)
    for (size_t k = 1; k < s.turns.size(); ++k) EXPECT_EQ(s.turns[k].think_time_s, 0.25);
}

TEST(AgenticWorkload, SessionLengths) {
  AgenticOptions o = small_options();
  o.num_sessions = 5000;
  o.min_turns = 2;
  o.mean_turns = 5.0;
  o.max_turns = 1000;  // far enough that the cut does not move the mean
  double sum = 0;
  for (const AgenticSession& s : make_agentic_workload(o, vocabulary()).sessions) {
    EXPECT_GE(s.turns.size(), 2u);
    sum += static_cast<double>(s.turns.size());
  }
  EXPECT_NEAR(sum / 5000.0, 5.0, 0.15);

  o.max_turns = 4;  // the cut
  for (const AgenticSession& s : make_agentic_workload(o, vocabulary()).sessions)
    EXPECT_LE(s.turns.size(), 4u);

  o.turns_dist = "uniform";
  o.min_turns = 3;
  o.max_turns = 7;
  std::set<size_t> seen;
  sum = 0;
  for (const AgenticSession& s : make_agentic_workload(o, vocabulary()).sessions) {
    seen.insert(s.turns.size());
    sum += static_cast<double>(s.turns.size());
  }
  EXPECT_EQ(seen, (std::set<size_t>{3, 4, 5, 6, 7}));
  EXPECT_NEAR(sum / 5000.0, 5.0, 0.1);
}

TEST(AgenticWorkload, BadOptionsAreRefused) {
  const auto refused = [](auto edit) {
    AgenticOptions o = small_options();
    edit(o);
    EXPECT_THROW(make_agentic_workload(o, vocabulary()), InvalidArgument);
  };
  refused([](AgenticOptions& o) { o.tool_call_ratio = 1.5; });
  refused([](AgenticOptions& o) { o.min_turns = 0; });
  refused([](AgenticOptions& o) { o.max_turns = 0; });
  refused([](AgenticOptions& o) { o.mean_turns = 0.5; });
  refused([](AgenticOptions& o) { o.turns_dist = "poisson"; });
  refused([](AgenticOptions& o) { o.think_time_dist = "normal"; });
  refused([](AgenticOptions& o) { o.think_time_s = -1; });
  refused([](AgenticOptions& o) { o.user_len = 0; });
  EXPECT_THROW(make_agentic_workload(small_options(), {}), InvalidArgument);
}

}  // namespace
}  // namespace hyserve::client
