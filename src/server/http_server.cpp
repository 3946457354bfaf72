// HttpServer on Boost.Asio: the acceptor, HttpConnection (one client's socket, read
// through RequestParser, answered one request at a time, written from a queue) and the
// stop sequence. Reads wait for readiness (async_wait) and then read into a per-thread
// buffer, so an idle connection holds no read buffer.
//
// A connection's phases, each with its deadline:
//   kReading   waiting for / receiving a request: idle_timeout_ms before its first byte
//              (then a quiet close), header_timeout_ms to the end of its head and
//              read_timeout_ms to its end (then 408)
//   kHandling  a handler owns the response; reads go on only to notice a disconnect
//              (and buffer a pipelined request); no deadline but write_timeout_ms per write
//   kLingering after an error response: the sending side is shut, what the client still
//              sends is read and dropped for up to kLinger, so that closing with unread
//              bytes does not reset the connection before the client reads the response
//   kClosed
//
// The client's EOF (a half-close) only means no more requests: what it sent is answered,
// streams included, then the connection closes. A reset, a read error or a failed write is
// the client gone (on_disconnect); after EOF the socket is watched for a reset, and while
// no byte of the response is out an interim 100 Continue (HTTP/1.1 clients skip it) makes
// a client that closed entirely, rather than half-closed, answer with one.
#include "server/http_server.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include "server/http_process_limits.h"
#include "server/request_parser.h"
#include "util/log.h"

namespace hyserve {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadSize = 64 << 10;
// While a handler runs, reading (to notice a disconnect) pauses past this many buffered
// bytes of pipelined requests.
constexpr std::size_t kMaxBufferedWhileHandling = 1 << 20;
constexpr auto kLinger = std::chrono::milliseconds(500);
constexpr auto kAcceptBackoff = std::chrono::milliseconds(10);
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

bool wants_keep_alive(const HttpRequest& request) {
  const std::string connection = request.headers.get_or("Connection", "");
  if (request.minor_version >= 1) return !header_has_token(connection, "close");
  return header_has_token(connection, "keep-alive");
}

std::string format_endpoint(const tcp::endpoint& endpoint) {
  const std::string address = endpoint.address().to_string();
  if (endpoint.address().is_v6()) return str_cat("[", address, "]:", endpoint.port());
  return str_cat(address, ":", endpoint.port());
}

}  // namespace

class HttpConnection;

struct HttpServer::Core {
  explicit Core(HttpServer& s) : server(s) {}

  void accept();
  void on_accept(const error_code& ec, tcp::socket socket);
  void remove(HttpConnection* connection, bool counted);
  std::vector<std::shared_ptr<HttpConnection>> snapshot();

  HttpServer& server;
  asio::io_context io;  // first: destroyed last, after everything that uses it
  asio::strand<asio::io_context::executor_type> accept_strand = asio::make_strand(io);
  tcp::acceptor acceptor{accept_strand};
  asio::steady_timer accept_backoff{accept_strand};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  int bound_port = 0;
  std::atomic<bool> stopping{false};

  std::mutex mutex;  // guards what follows
  std::condition_variable changed;
  std::unordered_map<HttpConnection*, std::shared_ptr<HttpConnection>> connections;
  int num_served = 0;  // connections not refused with 503 (the cap counts these)
  bool started = false;
  bool stopped = false;
};

class HttpConnection final : public ResponseSink,
                             public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(HttpServer& server, HttpServer::Core& core, tcp::socket socket, bool refused)
      : server_(server),
        core_(core),
        options_(server.options_),
        socket_(std::move(socket)),
        strand_(socket_.get_executor()),
        read_timer_(strand_),
        write_timer_(strand_),
        parser_({options_.max_body_bytes, options_.max_header_bytes}),
        refused_(refused) {}

  bool refused() const { return refused_; }

  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->begin(); });
  }
  // stop(): an idle connection closes now, a busy one after its response.
  void begin_stop() {
    asio::post(strand_, [self = shared_from_this()] {
      self->close_after_ = true;
      if (self->phase_ == Phase::kReading && self->parser_.stage() == RequestParser::Stage::kIdle)
        self->close();
    });
  }
  // stop() past the drain timeout: the client counts as gone at once (a handler polling
  // client_disconnected() sees it even before the strand runs the close).
  void cut_off() {
    gone_.store(true);
    asio::post(strand_, [self = shared_from_this()] { self->close(); });
  }

  // ResponseSink: any thread.
  void write(std::string bytes) override {
    bool post_flush = false;
    {
      std::lock_guard lock(out_mutex_);
      if (out_closed_) return;
      response_bytes_ = true;
      out_.push_back(std::move(bytes));
      post_flush = !std::exchange(flush_scheduled_, true);
    }
    if (post_flush) asio::post(strand_, [self = shared_from_this()] { self->flush(); });
  }
  void finish(int status, bool keep_alive) override {
    bool post_flush = false;
    {
      std::lock_guard lock(out_mutex_);
      finished_ = Finished{status, keep_alive};
      post_flush = !std::exchange(flush_scheduled_, true);
    }
    if (post_flush) asio::post(strand_, [self = shared_from_this()] { self->flush(); });
  }
  bool disconnected() const override { return gone_.load(); }
  void on_disconnect(std::function<void()> callback) override {
    asio::dispatch(strand_, [self = shared_from_this(), callback = std::move(callback)]() mutable {
      if (self->callbacks_fired_ || self->gone_.load()) {
        run_callback(callback);
      } else if (self->in_flight_) {
        self->on_disconnect_.push_back(std::move(callback));
      }
    });
  }
  void post(std::function<void()> work) override {
    asio::post(strand_,
               [self = shared_from_this(), work = std::move(work)] { run_callback(work); });
  }

 private:
  enum class Phase { kReading, kHandling, kLingering, kClosed };
  struct Finished {
    int status;
    bool keep_alive;
  };

  static void run_callback(const std::function<void()>& callback) {
    try {
      callback();
    } catch (const std::exception& e) {
      log::error("connection callback failed: {}", e.what());
    }
  }

  void begin() {
    error_code ec;
    const tcp::endpoint peer = socket_.remote_endpoint(ec);
    remote_address_ = ec ? "unknown" : format_endpoint(peer);
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.non_blocking(true, ec);
    if (refused_) {
      phase_ = Phase::kHandling;
      linger_after_ = true;
      HttpResponseWriter writer(shared_from_this(), 1, false);
      writer.send_error(
          503, str_cat("too many connections (", options_.max_connections, "); retry later"));
      return;
    }
    enter_reading();
    wait_readable();
  }

  void enter_reading() {
    phase_ = Phase::kReading;
    idle_deadline_ = Clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
    request_started_ = false;
    update_read_deadline();
  }

  // --- reading --------------------------------------------------------------------------

  void wait_readable() {
    if (reading_ || phase_ == Phase::kClosed || peer_closed_) return;
    if (phase_ == Phase::kHandling && parser_.unread_bytes() > kMaxBufferedWhileHandling) return;
    reading_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      self->on_readable(ec);
    });
  }

  void on_readable(const error_code& ec) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    bool reset = static_cast<bool>(ec);  // an error, not EOF
    if (ec) {
      peer_closed_ = true;
    } else {
      thread_local std::array<char, kReadSize> buffer;
      while (true) {
        error_code read_ec;
        const std::size_t n = socket_.read_some(asio::buffer(buffer), read_ec);
        if (read_ec == asio::error::would_block || read_ec == asio::error::try_again) break;
        if (read_ec) {
          peer_closed_ = true;
          reset = read_ec != asio::error::eof;
          break;
        }
        if (phase_ != Phase::kLingering) parser_.feed(std::string_view(buffer.data(), n));
        if (n < buffer.size()) break;
      }
    }
    if (phase_ == Phase::kReading) handle_input();
    if (peer_closed_) {
      if (phase_ != Phase::kHandling) {
        close();
      } else if (reset) {
        client_gone();  // the response goes on, to nobody; the connection closes after it
      } else {
        watch_for_reset();  // EOF: the request in flight is answered
        probe_after_eof();
      }
      return;
    }
    wait_readable();
  }

  // After EOF, which reads as EOF for good, only a reset (an error) is waited for.
  void watch_for_reset() {
    socket_.async_wait(tcp::socket::wait_error,
                       [self = shared_from_this()](const error_code& ec) { self->on_error(ec); });
  }

  // A 100 Continue, unless the response has begun (its own bytes then probe).
  void probe_after_eof() {
    if (minor_version_ < 1 || linger_after_) return;  // no 1xx to HTTP/1.0
    bool post_flush = false;
    {
      std::lock_guard lock(out_mutex_);
      if (out_closed_ || response_bytes_) return;
      out_.push_back(std::string(kContinue));
      post_flush = !std::exchange(flush_scheduled_, true);
    }
    if (post_flush) asio::post(strand_, [self = shared_from_this()] { self->flush(); });
  }

  void on_error(const error_code& ec) {
    if (ec == asio::error::operation_aborted || phase_ == Phase::kClosed) return;
    // A reset is an error or a hang-up (this side has not shut down); urgent data is not.
    // (A read would say EOF: it reports the FIN before the error.)
    pollfd pfd{socket_.native_handle(), 0, 0};
    ::poll(&pfd, 1, 0);
    if (ec || (pfd.revents & (POLLERR | POLLHUP)) != 0) {
      client_gone();
      close();
    }
  }

  // Parses what is buffered; dispatches a whole request.
  void handle_input() {
    std::optional<HttpRequest> request;
    try {
      request = parser_.parse();
      if (parser_.take_continue()) write(std::string(kContinue));
    } catch (const HttpError& e) {
      refuse(e);
      return;
    }
    if (!request) {
      update_read_deadline();
      return;
    }
    dispatch(std::move(*request));
  }

  void update_read_deadline() {
    Clock::time_point deadline = idle_deadline_;
    if (parser_.stage() != RequestParser::Stage::kIdle) {
      if (!request_started_) {
        request_started_ = true;
        request_start_ = Clock::now();
      }
      const int timeout_ms = parser_.stage() == RequestParser::Stage::kHead
                                 ? std::min(options_.header_timeout_ms, options_.read_timeout_ms)
                                 : options_.read_timeout_ms;
      deadline = request_start_ + std::chrono::milliseconds(timeout_ms);
    }
    arm_read_deadline(deadline);
  }

  void arm_read_deadline(Clock::time_point deadline) {
    if (deadline == read_deadline_) return;
    read_deadline_ = deadline;
    if (deadline == Clock::time_point::max()) {
      read_timer_.cancel();
      return;
    }
    read_timer_.expires_at(deadline);
    read_timer_.async_wait(
        [self = shared_from_this()](const error_code& ec) { self->on_read_deadline(ec); });
  }

  void on_read_deadline(const error_code& ec) {
    if (ec || Clock::now() < read_deadline_) return;  // cancelled or moved
    if (phase_ == Phase::kLingering) {
      close();
    } else if (phase_ == Phase::kReading) {
      switch (parser_.stage()) {
        case RequestParser::Stage::kIdle:
          close();  // no request came: close quietly
          break;
        case RequestParser::Stage::kHead:
          refuse(HttpError(408, str_cat("request head not received within ",
                                        options_.header_timeout_ms, " ms")));
          break;
        case RequestParser::Stage::kBody:
          refuse(HttpError(
              408, str_cat("request not received within ", options_.read_timeout_ms, " ms")));
          break;
      }
    }
  }

  // --- requests -------------------------------------------------------------------------

  void dispatch(HttpRequest request) {
    phase_ = Phase::kHandling;
    arm_read_deadline(Clock::time_point::max());
    request.remote_address = remote_address_;
    in_flight_ = true;
    minor_version_ = request.minor_version;
    {
      std::lock_guard lock(out_mutex_);
      response_bytes_ = false;
    }
    route_ = server_.route_name(request.path);
    method_ = request.method;
    dispatched_at_ = Clock::now();
    HttpResponseWriter writer(shared_from_this(), request.minor_version, wants_keep_alive(request));
    if (close_after_ || core_.stopping.load()) writer.close_after_response();
    server_.dispatch(request, writer);
  }

  // A request to refuse: the error response, then the connection lingers and closes.
  void refuse(const HttpError& e) {
    phase_ = Phase::kHandling;
    arm_read_deadline(Clock::time_point::max());
    linger_after_ = true;
    HttpResponseWriter writer(shared_from_this(), 1, false);
    writer.send_error(e.status(), e.what());
  }

  // The response is written (or the connection is gone): the next request, or the close.
  void response_done(const Finished& finished) {
    if (in_flight_) {
      in_flight_ = false;
      if (server_.observer_) {
        const double seconds = std::chrono::duration<double>(Clock::now() - dispatched_at_).count();
        try {
          server_.observer_(route_, method_, finished.status, seconds);
        } catch (const std::exception& e) {
          log::error("request observer failed: {}", e.what());
        }
      }
    }
    on_disconnect_.clear();
    if (phase_ == Phase::kClosed) return;
    if (!finished.keep_alive || close_after_ || core_.stopping.load() || gone_.load()) {
      if (linger_after_ || parser_.unread_bytes() > 0) {
        linger();
      } else {
        close_gracefully();
      }
      return;
    }
    enter_reading();
    handle_input();  // a pipelined request may be buffered already
    // After the client's EOF: once what it sent is answered, nothing more can come.
    if (peer_closed_ && phase_ == Phase::kReading) return close_gracefully();
    wait_readable();
  }

  // The response is all sent: a FIN after it, then the close.
  void close_gracefully() {
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    close();
  }

  // --- writing --------------------------------------------------------------------------

  // Writes what is queued; once the queue is empty, completes a finished response.
  void flush() {
    std::vector<std::string> batch;
    std::optional<Finished> finished;
    {
      std::lock_guard lock(out_mutex_);
      if (out_.empty()) {
        flush_scheduled_ = false;
        finished = std::exchange(finished_, std::nullopt);
      } else {
        batch.swap(out_);
      }
    }
    if (!batch.empty()) {
      writing_ = std::move(batch);
      std::vector<asio::const_buffer> buffers;
      buffers.reserve(writing_.size());
      for (const std::string& bytes : writing_) buffers.push_back(asio::buffer(bytes));
      const std::uint64_t seq = ++write_seq_;
      write_timer_.expires_after(std::chrono::milliseconds(options_.write_timeout_ms));
      write_timer_.async_wait([self = shared_from_this(), seq](const error_code& ec) {
        if (ec || seq != self->write_seq_ || self->writing_.empty()) return;
        log::warn("write to {} timed out after {} ms", self->remote_address_,
                  self->options_.write_timeout_ms);
        self->client_gone();
        self->close();
      });
      asio::async_write(
          socket_, buffers,
          [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_written(ec); });
      return;
    }
    if (finished) response_done(*finished);
  }

  void on_written(const error_code& ec) {
    writing_.clear();
    write_timer_.cancel();
    if (ec) {
      client_gone();
      close();
    }
    flush();
  }

  // --- ending ---------------------------------------------------------------------------

  void client_gone() {
    gone_.store(true);
    if (std::exchange(callbacks_fired_, true)) return;
    for (const auto& callback : std::exchange(on_disconnect_, {})) run_callback(callback);
  }

  void linger() {
    phase_ = Phase::kLingering;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    arm_read_deadline(Clock::now() + kLinger);
    wait_readable();
  }

  void close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    {
      std::lock_guard lock(out_mutex_);
      out_closed_ = true;
      out_.clear();
    }
    read_timer_.cancel();
    write_timer_.cancel();
    error_code ec;
    socket_.close(ec);
    if (in_flight_) client_gone();
    core_.remove(this, !refused_);
  }

  HttpServer& server_;
  HttpServer::Core& core_;
  const HttpServerOptions& options_;
  tcp::socket socket_;
  asio::any_io_executor strand_;  // the socket's: a strand of its own
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  RequestParser parser_;
  const bool refused_;  // over the cap: answered 503 and closed
  std::string remote_address_;

  // Strand only.
  Phase phase_ = Phase::kReading;
  bool reading_ = false;      // an async_wait for readability is pending
  bool peer_closed_ = false;  // EOF or an error reading
  bool close_after_ = false;  // stopping: close after the current response
  bool linger_after_ = false;
  Clock::time_point idle_deadline_;
  Clock::time_point read_deadline_ = Clock::time_point::max();
  bool request_started_ = false;
  Clock::time_point request_start_;
  std::vector<std::string> writing_;  // the buffers of the write in flight
  std::uint64_t write_seq_ = 0;
  bool in_flight_ = false;  // a dispatched request whose response is not done
  int minor_version_ = 1;   // its HTTP/1.x
  std::string route_, method_;
  Clock::time_point dispatched_at_;
  std::vector<std::function<void()>> on_disconnect_;
  bool callbacks_fired_ = false;

  std::atomic<bool> gone_{false};

  std::mutex out_mutex_;  // guards what follows: filled from any thread
  std::vector<std::string> out_;
  bool flush_scheduled_ = false;  // a flush is posted or a write is in flight
  std::optional<Finished> finished_;
  bool out_closed_ = false;
  bool response_bytes_ = false;  // the request in flight's response has queued bytes
};

// ---------------------------------------------------------------------------------------
// HttpServer::Core

void HttpServer::Core::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](const error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Core::on_accept(const error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors: back off instead of spinning on the pending connection.
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
      accept_backoff.expires_after(kAcceptBackoff);
      accept_backoff.async_wait([this](const error_code& wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    accept();
    return;
  }
  std::shared_ptr<HttpConnection> connection;
  {
    std::lock_guard lock(mutex);
    const bool refused = num_served >= server.options_.max_connections;
    connection = std::make_shared<HttpConnection>(server, *this, std::move(socket), refused);
    connections.emplace(connection.get(), connection);
    if (!refused) ++num_served;
  }
  connection->start();
  accept();
}

void HttpServer::Core::remove(HttpConnection* connection, bool counted) {
  std::shared_ptr<HttpConnection> last;  // released outside the lock
  {
    std::lock_guard lock(mutex);
    const auto it = connections.find(connection);
    if (it == connections.end()) return;
    last = std::move(it->second);
    connections.erase(it);
    if (counted) --num_served;
  }
  changed.notify_all();
}

std::vector<std::shared_ptr<HttpConnection>> HttpServer::Core::snapshot() {
  std::lock_guard lock(mutex);
  std::vector<std::shared_ptr<HttpConnection>> out;
  out.reserve(connections.size());
  for (const auto& [raw, connection] : connections) out.push_back(connection);
  return out;
}

// ---------------------------------------------------------------------------------------
// HttpServer

HttpServer::HttpServer(Options options)
    : options_(std::move(options)), core_(std::make_unique<Core>(*this)) {
  CHECK(options_.port >= 0 && options_.port <= 65535, "port out of range: ", options_.port);
  CHECK(options_.max_connections > 0, "max_connections must be positive");
  CHECK(options_.max_header_bytes > 0, "max_header_bytes must be positive");
  CHECK(options_.idle_timeout_ms > 0 && options_.header_timeout_ms > 0 &&
            options_.read_timeout_ms > 0 && options_.write_timeout_ms > 0 &&
            options_.drain_timeout_ms >= 0,
        "timeouts must be positive");
  CHECK(options_.num_io_threads >= 0, "num_io_threads must not be negative");
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::route(std::string method, std::string path, Handler handler) {
  std::lock_guard lock(core_->mutex);
  CHECK(!core_->started, "route() after start(): ", method, " ", path);
  CHECK(handler != nullptr, "null handler for ", method, " ", path);
  auto& methods = routes_[std::move(path)];
  CHECK(methods.find(method) == methods.end(), "route registered twice: ", method);
  methods.emplace(std::move(method), std::move(handler));
}

void HttpServer::use(HttpMiddleware middleware) {
  std::lock_guard lock(core_->mutex);
  CHECK(!core_->started, "use() after start()");
  middleware_ = std::move(middleware);
}

void HttpServer::observe(RequestObserver observer) {
  std::lock_guard lock(core_->mutex);
  CHECK(!core_->started, "observe() after start()");
  observer_ = std::move(observer);
}

int HttpServer::port() const {
  return core_->bound_port;
}

void HttpServer::start() {
  std::lock_guard lock(core_->mutex);
  CHECK(!core_->started, "start() called twice");
  raise_open_file_limit(options_.max_connections);
  const std::string where = str_cat(options_.host, ":", options_.port);

  tcp::resolver resolver(core_->io);
  error_code ec;
  const auto results =
      resolver.resolve(options_.host, std::to_string(options_.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) throw Error(str_cat("cannot listen on ", where, ": ", ec.message()));
  std::vector<tcp::endpoint> candidates;
  for (const auto& entry : results) candidates.push_back(entry.endpoint());
  // "localhost" resolves to ::1 and 127.0.0.1: prefer IPv4, which clients try most.
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const tcp::endpoint& e) { return e.address().is_v4(); });
  std::string failure = "no address";
  tcp::acceptor& acceptor = core_->acceptor;
  for (const tcp::endpoint& endpoint : candidates) {
    error_code bind_ec;
    acceptor.open(endpoint.protocol(), bind_ec);
    if (!bind_ec) acceptor.set_option(tcp::acceptor::reuse_address(true), bind_ec);
    if (!bind_ec) acceptor.bind(endpoint, bind_ec);
    if (!bind_ec) acceptor.listen(asio::socket_base::max_listen_connections, bind_ec);
    if (!bind_ec) break;
    failure = bind_ec.message();
    error_code ignored;
    acceptor.close(ignored);
  }
  if (!acceptor.is_open()) throw Error(str_cat("cannot listen on ", where, ": ", failure));
  core_->bound_port = acceptor.local_endpoint(ec).port();

  core_->started = true;
  core_->work.emplace(core_->io.get_executor());
  asio::post(core_->accept_strand, [core = core_.get()] { core->accept(); });
  const int num_threads = resolve_num_io_threads(options_.num_io_threads);
  for (int i = 0; i < num_threads; ++i) {
    core_->threads.emplace_back([core = core_.get()] {
      while (true) {
        try {
          core->io.run();
          return;
        } catch (const std::exception& e) {
          log::error("HTTP I/O thread: {}", e.what());
        }
      }
    });
  }
}

void HttpServer::stop() {
  Core& core = *core_;
  {
    std::unique_lock lock(core.mutex);
    if (!core.started || core.stopped) return;
    if (core.stopping.exchange(true)) {
      core.changed.wait(lock, [&] { return core.stopped; });
      return;
    }
  }
  // No new connections: once this returns, a connect is refused.
  std::promise<void> acceptor_closed;
  asio::post(core.accept_strand, [&] {
    error_code ec;
    core.acceptor.close(ec);
    core.accept_backoff.cancel();
    acceptor_closed.set_value();
  });
  acceptor_closed.get_future().wait();

  // Idle connections close now, busy ones after their response, up to the drain timeout.
  for (const auto& connection : core.snapshot()) connection->begin_stop();
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
  {
    std::unique_lock lock(core.mutex);
    core.changed.wait_until(lock, deadline, [&] { return core.connections.empty(); });
  }
  // Past it: cut the stragglers off; their handlers see the disconnect.
  for (const auto& connection : core.snapshot()) connection->cut_off();
  {
    std::unique_lock lock(core.mutex);
    core.changed.wait_for(lock, std::chrono::seconds(5), [&] { return core.connections.empty(); });
  }
  core.work.reset();
  core.io.stop();
  for (std::thread& thread : core.threads) thread.join();
  core.threads.clear();

  std::vector<std::shared_ptr<HttpConnection>> left;
  {
    std::lock_guard lock(core.mutex);
    for (auto& [raw, connection] : core.connections) left.push_back(std::move(connection));
    core.connections.clear();
    core.stopped = true;
  }
  core.changed.notify_all();
}

void HttpServer::wait() {
  std::unique_lock lock(core_->mutex);
  core_->changed.wait(lock, [this] { return core_->stopped; });
}

std::string HttpServer::route_name(const std::string& path) const {
  // The route as registered, or "none" for a path no route has (vLLM's instrumentator).
  return routes_.find(path) != routes_.end() ? path : std::string("none");
}

void HttpServer::route_request(const HttpRequest& request, HttpResponseWriter& writer) {
  const auto path = routes_.find(request.path);
  if (path == routes_.end()) {
    writer.send_error(404, str_cat("Not Found: ", request.method, " ", request.path));
    return;
  }
  const auto handler = path->second.find(request.method);
  if (handler == path->second.end()) {
    std::string allow;
    for (const auto& [method, unused] : path->second) allow += (allow.empty() ? "" : ", ") + method;
    writer.send(405, "application/json",
                openai_error_body(405, str_cat("Method ", request.method, " not allowed for ",
                                               request.path, "; allowed: ", allow)),
                {{"Allow", allow}});
    return;
  }
  handler->second(request, writer);
}

void HttpServer::dispatch(const HttpRequest& request, HttpResponseWriter& writer) {
  std::optional<HttpError> error;
  try {
    if (middleware_) middleware_(request, writer);
    if (!writer.responded()) route_request(request, writer);
  } catch (const HttpError& e) {
    error = e;
  } catch (const std::exception& e) {
    log::error("{} {} failed: {}", request.method, request.path, e.what());
    error = HttpError(500, str_cat("Internal server error: ", e.what()));
  } catch (...) {
    log::error("{} {} failed", request.method, request.path);
    error = HttpError(500, "Internal server error");
  }
  if (!error) return;  // answered, or answered later through a copy of the writer
  if (!writer.responded()) {
    writer.send_error(error->status(), error->what());
  } else if (writer.streaming()) {
    // A stream that failed midway is cut short (no last chunk), so the client sees the error.
    writer.abort_stream();
  }
}

}  // namespace hyserve
