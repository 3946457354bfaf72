#include "client/agentic_runner.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <utility>

#include <boost/asio/steady_timer.hpp>

#include "client/arrival_schedule.h"
#include "client/http_stream_call.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

constexpr auto kProgressPeriod = std::chrono::milliseconds(250);

// `n` ids cycling through `source` (non-empty): the stand-in for a reply without ids.
std::vector<int32_t> stand_in_reply(const std::vector<int32_t>& source, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < out.size(); ++i) out[i] = source[i % source.size()];
  return out;
}

// The event loop: session arrivals, the session limit, turns, think times, progress.
class SessionRunner {
 public:
  SessionRunner(const AgenticWorkload& workload, const BenchRunOptions& options)
      : workload_(workload), options_(options), arrival_timer_(io_), progress_timer_(io_) {
    options_.request.return_token_ids = true;
    for (size_t s = 0; s < workload.sessions.size(); ++s) {
      first_turn_.push_back(result_.outcomes.size());
      conversations_.emplace_back(workload, s);
      for (size_t k = 0; k < workload.sessions[s].turns.size(); ++k) {
        result_.outcomes.emplace_back();
        result_.session_of.push_back(static_cast<int64_t>(s));
        result_.turn_of.push_back(static_cast<int64_t>(k));
      }
    }
  }

  AgenticRunResult run() {
    times_ = arrival_times_s(static_cast<int64_t>(num_sessions()), options_.arrivals);
    t0_ = end_ = Clock::now();
    error_code ec;
    asio::ip::tcp::resolver resolver(io_);
    endpoints_ = resolver.resolve(options_.base_url.host, options_.base_url.port, ec);
    if (ec) {
      for (RequestOutcome& o : result_.outcomes)
        o.error = str_cat("cannot resolve ", options_.base_url.host, ": ", ec.message());
      return std::move(result_);
    }
    schedule_arrivals();
    if (options_.show_progress) show_progress();
    io_.run();
    if (options_.show_progress) std::fputc('\n', stderr);
    result_.duration_s = std::chrono::duration<double>(end_ - t0_).count();
    return std::move(result_);
  }

 private:
  size_t num_sessions() const { return workload_.sessions.size(); }

  void schedule_arrivals() {
    if (next_ == num_sessions()) return;
    arrival_timer_.expires_at(t0_ + to_duration(times_[next_]));
    arrival_timer_.async_wait([this](error_code) {
      const double now = seconds_since(t0_);
      while (next_ < num_sessions() && times_[next_] <= now) waiting_.push_back(next_++);
      open_waiting();
      schedule_arrivals();
    });
  }

  void open_waiting() {
    while (!waiting_.empty() && (!options_.max_concurrency || open_ < *options_.max_concurrency)) {
      const size_t s = waiting_.front();
      waiting_.pop_front();
      ++open_;
      send_turn(s, 0);
    }
  }

  void send_turn(size_t s, size_t k) {
    BenchRequest request;
    request.prompt_ids = conversations_[s].prompt(k);
    request.prompt_len = static_cast<int64_t>(request.prompt_ids.size());
    request.output_len = workload_.sessions[s].turns[k].output_len;
    ++in_flight_;
    start_stream(io_, endpoints_,
                 http_request(options_.base_url, options_.endpoint,
                              openai_request_body(request, options_.request), options_.api_key),
                 request.prompt_len, options_.request_timeout_s,
                 [this, s, k](RequestOutcome outcome) { end_turn(s, k, std::move(outcome)); });
  }

  void end_turn(size_t s, size_t k, RequestOutcome outcome) {
    --in_flight_;
    ++num_turns_done_;
    const std::vector<AgenticTurn>& turns = workload_.sessions[s].turns;
    const bool success = outcome.success;
    if (success) {
      if (outcome.output_token_ids.empty()) {
        ++result_.num_replies_without_ids;
        conversations_[s].add_reply(k, stand_in_reply(turns[k].new_ids, outcome.output_tokens));
      } else {
        conversations_[s].add_reply(k, outcome.output_token_ids);
      }
    }
    result_.outcomes[first_turn_[s] + k] = std::move(outcome);
    if (!success || k + 1 == turns.size()) {
      for (size_t later = k + 1; later < turns.size(); ++later) {
        result_.outcomes[first_turn_[s] + later].error =
            str_cat("not sent: turn ", k, " of the session failed");
        ++num_turns_done_;
      }
      return close_session();
    }
    auto timer = std::make_shared<asio::steady_timer>(io_);
    timer->expires_after(to_duration(turns[k + 1].think_time_s));
    timer->async_wait([this, s, k, timer](error_code) { send_turn(s, k + 1); });
  }

  void close_session() {
    --open_;
    if (++num_sessions_done_ == num_sessions()) {
      end_ = Clock::now();
      progress_timer_.cancel();
      if (options_.show_progress) print_progress();
    }
    open_waiting();
  }

  void print_progress() const {
    std::fprintf(
        stderr, "\r[bench] %zu/%zu sessions done, %zu/%zu turns, %lld in flight, %.1f s elapsed   ",
        num_sessions_done_, num_sessions(), num_turns_done_, result_.outcomes.size(),
        static_cast<long long>(in_flight_), seconds_since(t0_));
  }

  void show_progress() {
    if (num_sessions_done_ == num_sessions()) return;
    print_progress();
    progress_timer_.expires_after(kProgressPeriod);
    progress_timer_.async_wait([this](error_code ec) {
      if (!ec) show_progress();
    });
  }

  const AgenticWorkload& workload_;
  BenchRunOptions options_;
  asio::io_context io_;  // before the timers that use it
  asio::steady_timer arrival_timer_;
  asio::steady_timer progress_timer_;
  Endpoints endpoints_;
  AgenticRunResult result_;
  std::vector<AgenticConversation> conversations_;
  std::vector<size_t> first_turn_;  // per session: its turn 0's index in result_.outcomes
  std::vector<double> times_;       // session start times, s from t0_
  std::deque<size_t> waiting_;      // arrived sessions not yet open (the concurrency limit)
  size_t next_ = 0;                 // the next session to arrive
  int64_t open_ = 0, in_flight_ = 0;
  size_t num_sessions_done_ = 0, num_turns_done_ = 0;
  Clock::time_point t0_, end_;
};

}  // namespace

AgenticRunResult run_agentic_benchmark(const AgenticWorkload& workload,
                                       const BenchRunOptions& options) {
  CHECK(!options.request.chat,
        "the agentic workload sends token ids to /v1/completions (exact prefixes), not chat");
  CHECK(!options.max_concurrency || *options.max_concurrency >= 1,
        "--max-concurrency must be >= 1");
  CHECK(options.request_timeout_s > 0, "the request timeout must be > 0");
  SessionRunner runner(workload, options);
  return runner.run();
}

AgenticContextStats agentic_context_stats(const AgenticRunResult& result) {
  AgenticContextStats stats;
  std::vector<double> sum_by_turn;
  int64_t total = 0, completed = 0;
  for (size_t i = 0; i < result.outcomes.size(); ++i) {
    const RequestOutcome& o = result.outcomes[i];
    if (!o.success) continue;
    const auto k = static_cast<size_t>(result.turn_of[i]);
    if (sum_by_turn.size() <= k) {
      sum_by_turn.resize(k + 1, 0.0);
      stats.completed_by_turn.resize(k + 1, 0);
    }
    sum_by_turn[k] += static_cast<double>(o.prompt_len);
    ++stats.completed_by_turn[k];
    total += o.prompt_len;
    ++completed;
    stats.max_context_len = std::max(stats.max_context_len, o.prompt_len);
  }
  if (completed > 0) stats.mean_context_len = static_cast<double>(total) / completed;
  for (size_t k = 0; k < sum_by_turn.size(); ++k)
    stats.mean_context_len_by_turn.push_back(
        stats.completed_by_turn[k] > 0 ? sum_by_turn[k] / stats.completed_by_turn[k] : 0.0);
  return stats;
}

}  // namespace hyserve::client
