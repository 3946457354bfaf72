// Runs the agentic workload (agentic_workload.h) against a server: sessions start at the
// arrival times (the request rate applies to session starts), at most max_concurrency
// sessions are open at once (a session holds its place through its think times, as a user
// of an agent does: max_concurrency counts users, and requests in flight never exceed it),
// each session's turns go one after the other, turn k + 1 sent think_time_s after turn k
// ended. Every turn is a streamed /v1/completions request of token ids with
// return_token_ids on, so its reply's ids extend the next prompt exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "client/agentic_workload.h"
#include "client/bench_metrics.h"
#include "client/bench_runner.h"

namespace hyserve::client {

struct AgenticRunResult {
  // One per turn, session-major (session 0's turns, then session 1's, ...). A turn after a
  // failed one is not sent and fails with that reason.
  std::vector<RequestOutcome> outcomes;
  std::vector<int64_t> session_of, turn_of;  // per outcome
  double duration_s = 0;                     // first send to last completion
  // Replies whose chunks carried no token ids (a server without return_token_ids): their
  // place in the next prompt is taken by as many ids of the turn's own new tokens, so the
  // prefix shared with the server's cache ends before that reply.
  int64_t num_replies_without_ids = 0;
};

// options.request.chat must be false; options.request.return_token_ids is forced on.
AgenticRunResult run_agentic_benchmark(const AgenticWorkload& workload,
                                       const BenchRunOptions& options);

// Context length (the prompt tokens of a turn) over the completed turns: overall and by turn
// index, for the report and the result JSON.
struct AgenticContextStats {
  double mean_context_len = 0;
  int64_t max_context_len = 0;
  std::vector<double> mean_context_len_by_turn;  // index k: mean over completed turns k
  std::vector<int64_t> completed_by_turn;
};
AgenticContextStats agentic_context_stats(const AgenticRunResult& result);

}  // namespace hyserve::client
