#include "client/bench_runner.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "client/http_response_reader.h"
#include "client/sse_parser.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using Endpoints = tcp::resolver::results_type;

constexpr size_t kReadSize = 16 << 10;
constexpr size_t kMaxErrorBodyBytes = 8 << 10;
constexpr auto kProgressPeriod = std::chrono::milliseconds(250);

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string host_header(const BaseUrl& url) {
  const bool v6 = url.host.find(':') != std::string::npos;
  return (v6 ? "[" + url.host + "]" : url.host) + ":" + url.port;
}

// The bytes of a request with `body` (empty: a GET).
std::string http_request(const BaseUrl& url, const std::string& path, const std::string& body,
                         const std::string& api_key) {
  std::string r = (body.empty() ? "GET " : "POST ") + url.path_prefix + path + " HTTP/1.1\r\n";
  r += "Host: " + host_header(url) + "\r\nUser-Agent: hyserve-bench\r\nConnection: close\r\n";
  if (!api_key.empty()) r += "Authorization: Bearer " + api_key + "\r\n";
  if (!body.empty()) {
    r += "Content-Type: application/json\r\nAccept: text/event-stream\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return r + "\r\n" + body;
}

// One HTTP exchange on a connection of its own: connect, write the request, read the
// response to its end, the connection's end or the deadline, whichever comes first. The
// handlers run on the io_context's thread; on_end exactly once.
class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  struct Handlers {
    std::function<void(int status, std::string_view body)> on_body;  // decoded body bytes
    // error: why the exchange failed, empty when the response arrived whole.
    std::function<void(const HttpResponseReader& response, std::string error)> on_end;
  };

  HttpCall(asio::io_context& io, Endpoints endpoints, std::string request, double timeout_s,
           Handlers handlers)
      : socket_(io),
        deadline_(io),
        endpoints_(std::move(endpoints)),
        request_(std::move(request)),
        timeout_s_(timeout_s),
        handlers_(std::move(handlers)) {}

  void start() {
    auto self = shared_from_this();
    deadline_.expires_after(to_duration(timeout_s_));
    deadline_.async_wait([self](error_code ec) {
      if (!ec) self->end(str_cat("timed out after ", self->timeout_s_, " s"));
    });
    asio::async_connect(socket_, endpoints_, [self](error_code ec, const tcp::endpoint&) {
      if (self->ended_) return;
      if (ec) return self->end("cannot connect: " + ec.message());
      error_code ignored;
      self->socket_.set_option(tcp::no_delay(true), ignored);
      asio::async_write(self->socket_, asio::buffer(self->request_),
                        [self](error_code wec, size_t) {
                          if (self->ended_) return;
                          if (wec) return self->end("cannot send the request: " + wec.message());
                          self->read();
                        });
    });
  }

 private:
  void read() {
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(buffer_), [self](error_code ec, size_t n) {
      if (self->ended_) return;
      if (n > 0 && !self->consume(std::string_view(self->buffer_.data(), n))) return;
      if (ec == asio::error::eof) {
        if (self->reader_.finish_at_eof()) return self->end("");
        return self->end(self->reader_.has_head() ? "the connection closed inside the response"
                                                  : "the connection closed before a response");
      }
      if (ec) return self->end("cannot read the response: " + ec.message());
      self->read();
    });
  }

  // False when the exchange ended on these bytes.
  bool consume(std::string_view bytes) {
    std::string body;
    if (!reader_.feed(bytes, body)) {
      end("malformed HTTP response: " + reader_.error());
      return false;
    }
    if (!body.empty()) handlers_.on_body(reader_.status(), body);
    if (!reader_.done()) return true;
    end("");
    return false;
  }

  void end(std::string error) {
    if (ended_) return;
    ended_ = true;
    deadline_.cancel();
    error_code ignored;
    socket_.close(ignored);
    handlers_.on_end(reader_, std::move(error));
  }

  tcp::socket socket_;
  asio::steady_timer deadline_;
  Endpoints endpoints_;
  std::string request_;
  double timeout_s_;
  Handlers handlers_;
  HttpResponseReader reader_;
  std::array<char, kReadSize> buffer_{};
  bool ended_ = false;
};

// Streams one benchmark request; `done` gets its outcome.
void start_stream(asio::io_context& io, const Endpoints& endpoints, std::string request_bytes,
                  int64_t prompt_len, double timeout_s, std::function<void(RequestOutcome)> done) {
  struct State {
    explicit State(int64_t len) : events(len) {}
    StreamAccumulator events;
    SseParser sse;
    std::string error_body;  // of a response other than 200
    Clock::time_point t0 = Clock::now();
  };
  auto state = std::make_shared<State>(prompt_len);
  HttpCall::Handlers handlers;
  handlers.on_body = [state](int status, std::string_view bytes) {
    if (status != 200) {
      if (state->error_body.size() < kMaxErrorBodyBytes) state->error_body.append(bytes);
      return;
    }
    const double t = seconds_since(state->t0);
    for (const std::string& event : state->sse.feed(bytes)) state->events.on_event(event, t);
  };
  handlers.on_end = [state, done = std::move(done)](const HttpResponseReader& response,
                                                    std::string error) {
    const double end_s = seconds_since(state->t0);
    if (error.empty() && response.status() != 200)
      error = str_cat("HTTP ", response.status(), ": ", error_message_of(state->error_body));
    if (error.empty() && !state->events.ended() && state->sse.has_partial_event())
      error = "malformed SSE: the body ended inside an event";
    done(state->events.finish(end_s, error));
  };
  std::make_shared<HttpCall>(io, endpoints, std::move(request_bytes), timeout_s,
                             std::move(handlers))
      ->start();
}

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
  HttpCall::Handlers handlers;
  handlers.on_body = [&body](int, std::string_view bytes) { body.append(bytes); };
  handlers.on_end = [&](const HttpResponseReader& response, const std::string& error) {
    if (error.empty() && response.status() == 200) result = std::move(body);
  };
  std::make_shared<HttpCall>(io, endpoints, http_request(base_url, path, "", ""), timeout_s,
                             std::move(handlers))
      ->start();
  io.run();
  return result;
}

}  // namespace hyserve::client
