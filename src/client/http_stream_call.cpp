#include "client/http_stream_call.h"

#include <array>
#include <memory>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "client/openai_stream.h"
#include "client/sse_parser.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string host_header(const BaseUrl& url) {
  const bool v6 = url.host.find(':') != std::string::npos;
  return (v6 ? "[" + url.host + "]" : url.host) + ":" + url.port;
}

constexpr size_t kReadSize = 16 << 10;
constexpr size_t kMaxErrorBodyBytes = 8 << 10;

// One HTTP exchange on a connection of its own: connect, write the request, read the
// response to its end, the connection's end or the deadline, whichever comes first. The
// handlers run on the io_context's thread; on_end exactly once.
class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  using Handlers = HttpCallHandlers;

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

}  // namespace

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void start_http_call(asio::io_context& io, const Endpoints& endpoints, std::string request,
                     double timeout_s, HttpCallHandlers handlers) {
  std::make_shared<HttpCall>(io, endpoints, std::move(request), timeout_s, std::move(handlers))
      ->start();
}

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
  HttpCallHandlers handlers;
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
  start_http_call(io, endpoints, std::move(request_bytes), timeout_s, std::move(handlers));
}

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

}  // namespace hyserve::client
