#include "client/bench_runner.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <utility>

#include <boost/asio/steady_timer.hpp>

#include "client/http_stream_call.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr auto kProgressPeriod = std::chrono::milliseconds(250);

// The benchmark's event loop: arrivals, the concurrency limit, completions, progress.
class Runner {
 public:
  Runner(const std::vector<BenchRequest>& requests, const BenchRunOptions& options)
      : requests_(requests),
        options_(options),
        arrival_timer_(io_),
        progress_timer_(io_),
        outcomes_(requests.size()) {}

  BenchRunResult run() {
    times_ = arrival_times_s(num_requests(), options_.arrivals);
    t0_ = Clock::now();
    error_code ec;
    tcp::resolver resolver(io_);
    endpoints_ = resolver.resolve(options_.base_url.host, options_.base_url.port, ec);
    if (ec) {
      for (RequestOutcome& o : outcomes_)
        o.error = str_cat("cannot resolve ", options_.base_url.host, ": ", ec.message());
      return {outcomes_, seconds_since(t0_)};
    }
    schedule_arrivals();
    if (options_.show_progress) show_progress();
    io_.run();
    if (options_.show_progress) std::fputc('\n', stderr);
    return {outcomes_, std::chrono::duration<double>(end_ - t0_).count()};
  }

 private:
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

  void schedule_arrivals() {
    if (next_ == requests_.size()) return;
    arrival_timer_.expires_at(t0_ + to_duration(times_[next_]));
    arrival_timer_.async_wait([this](error_code) {
      const double now = seconds_since(t0_);
      while (next_ < requests_.size() && times_[next_] <= now) waiting_.push_back(next_++);
      send_waiting();
      schedule_arrivals();
    });
  }

  void send_waiting() {
    while (!waiting_.empty() &&
           (!options_.max_concurrency || in_flight_ < *options_.max_concurrency)) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      ++in_flight_;
      const BenchRequest& request = requests_[i];
      start_stream(io_, endpoints_,
                   http_request(options_.base_url, options_.endpoint,
                                openai_request_body(request, options_.request), options_.api_key),
                   request.prompt_len, options_.request_timeout_s,
                   [this, i](RequestOutcome outcome) { complete(i, std::move(outcome)); });
    }
  }

  void complete(size_t i, RequestOutcome outcome) {
    outcomes_[i] = std::move(outcome);
    --in_flight_;
    if (++num_done_ == requests_.size()) {
      end_ = Clock::now();
      progress_timer_.cancel();
      if (options_.show_progress) print_progress();
    }
    send_waiting();
  }

  void print_progress() const {
    std::fprintf(stderr, "\r[bench] %zu/%zu requests done, %zu in flight, %.1f s elapsed   ",
                 num_done_, requests_.size(), static_cast<size_t>(in_flight_), seconds_since(t0_));
  }

  void show_progress() {
    if (num_done_ == requests_.size()) return;
    print_progress();
    progress_timer_.expires_after(kProgressPeriod);
    progress_timer_.async_wait([this](error_code ec) {
      if (!ec) show_progress();
    });
  }

  const std::vector<BenchRequest>& requests_;
  const BenchRunOptions& options_;
  asio::io_context io_;  // before the timers that use it
  asio::steady_timer arrival_timer_;
  asio::steady_timer progress_timer_;
  Endpoints endpoints_;
  std::vector<double> times_;  // send times, s from t0_
  std::vector<RequestOutcome> outcomes_;
  std::deque<size_t> waiting_;  // arrived, not sent (the concurrency limit)
  size_t next_ = 0;             // the next request to arrive
  int64_t in_flight_ = 0;
  size_t num_done_ = 0;
  Clock::time_point t0_, end_;
};

}  // namespace

BaseUrl parse_base_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  CHECK(url.rfind("https://", 0) != 0, "--base-url ", url,
        ": https is not supported (use http://host:port)");
  CHECK(url.rfind(kScheme, 0) == 0, "--base-url ", url, ": expected http://host:port");
  std::string_view rest = std::string_view(url).substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  BaseUrl out;
  if (slash != std::string_view::npos) out.path_prefix = std::string(rest.substr(slash));
  while (!out.path_prefix.empty() && out.path_prefix.back() == '/') out.path_prefix.pop_back();
  if (!authority.empty() && authority.front() == '[') {  // [v6 address]:port
    const size_t close = authority.find(']');
    CHECK(close != std::string_view::npos, "--base-url ", url, ": unclosed '['");
    out.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    if (!authority.empty()) {
      CHECK(authority.front() == ':', "--base-url ", url, ": expected ':' after ']'");
      out.port = std::string(authority.substr(1));
    }
  } else {
    const size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) out.port = std::string(authority.substr(colon + 1));
  }
  if (out.port.empty()) out.port = "80";
  CHECK(!out.host.empty(), "--base-url ", url, ": no host");
  CHECK(out.port.find_first_not_of("0123456789") == std::string::npos, "--base-url ", url,
        ": the port is not a number");
  return out;
}

BenchRunResult run_benchmark(const std::vector<BenchRequest>& requests,
                             const BenchRunOptions& options) {
  CHECK(!options.max_concurrency || *options.max_concurrency >= 1,
        "--max-concurrency must be >= 1");
  CHECK(options.request_timeout_s > 0, "the request timeout must be > 0");
  Runner runner(requests, options);
  return runner.run();
}

std::optional<std::string> http_get(const BaseUrl& base_url, const std::string& path,
                                    double timeout_s) {
  asio::io_context io;
  error_code ec;
  tcp::resolver resolver(io);
  const Endpoints endpoints = resolver.resolve(base_url.host, base_url.port, ec);
  if (ec) return std::nullopt;
  std::optional<std::string> result;
  std::string body;
  HttpCallHandlers handlers;
  handlers.on_body = [&body](int, std::string_view bytes) { body.append(bytes); };
  handlers.on_end = [&](const HttpResponseReader& response, const std::string& error) {
    if (error.empty() && response.status() == 200) result = std::move(body);
  };
  start_http_call(io, endpoints, http_request(base_url, path, "", ""), timeout_s,
                  std::move(handlers));
  io.run();
  return result;
}

HttpReply http_post_json(const BaseUrl& base_url, const std::string& path, const std::string& body,
                         double timeout_s) {
  asio::io_context io;
  error_code ec;
  tcp::resolver resolver(io);
  const Endpoints endpoints = resolver.resolve(base_url.host, base_url.port, ec);
  HttpReply reply;
  if (ec) {
    reply.error = "cannot resolve " + base_url.host + ": " + ec.message();
    return reply;
  }
  HttpCallHandlers handlers;
  handlers.on_body = [&reply](int, std::string_view bytes) { reply.body.append(bytes); };
  handlers.on_end = [&](const HttpResponseReader& response, const std::string& error) {
    reply.status = response.status();
    reply.error = error;
  };
  start_http_call(io, endpoints, http_request(base_url, path, body, ""), timeout_s,
                  std::move(handlers));
  io.run();
  return reply;
}

}  // namespace hyserve::client
