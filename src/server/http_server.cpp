// HttpServer: the acceptor, the per-connection request loop (RequestReader: framing, limits,
// timeouts) and HttpResponseWriter. Every socket write uses MSG_NOSIGNAL, so a client that
// disconnects never raises SIGPIPE.
#include "server/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <system_error>
#include <utility>

#include "util/log.h"

namespace hyserve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadSize = 64 << 10;
constexpr std::size_t kMaxChunkLineBytes = 4096;
constexpr std::size_t kCompactBytes = 1 << 20;
constexpr int kLingerMs = 500;

// The peer closed (or reset) the connection in the middle of a request: nobody to answer.
struct PeerClosed {};

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

std::string http_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[64];
  const std::size_t n = std::strftime(text, sizeof(text), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(text, n);
}

std::string format_address(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "unknown";
  if (address.ss_family == AF_INET6) return str_cat("[", host, "]:", port);
  return str_cat(host, ":", port);
}

bool wants_keep_alive(const HttpRequest& request) {
  const std::string connection = request.headers.get_or("Connection", "");
  if (request.minor_version >= 1) return !header_has_token(connection, "close");
  return header_has_token(connection, "keep-alive");
}

// Ends our side, then reads and drops what the client still sends for a short while, so
// that closing with unread bytes does not reset the connection before the client has read
// our (error) response.
void shutdown_lingering(int fd) {
  shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
  char sink[16 << 10];
  pollfd pfd{fd, POLLIN, 0};
  while (poll(&pfd, 1, ms_until(deadline)) > 0) {
    if (recv(fd, sink, sizeof(sink), 0) <= 0) break;
  }
}

// Reads requests off one connection: finds the head, enforces the limits and timeouts,
// de-frames the body. Bytes past the current request stay buffered (pipelining).
class RequestReader {
 public:
  RequestReader(int fd, int stop_fd, const HttpServerOptions& options)
      : fd_(fd), stop_fd_(stop_fd), options_(options) {}

  // The next request, or nullopt when the connection should close quietly (the peer closed,
  // the idle timeout passed, the server is stopping). Throws HttpError for a request to
  // refuse (the connection then closes) and PeerClosed for a request cut short.
  std::optional<HttpRequest> read_request();

  bool has_unread_bytes() const { return pos_ < buffer_.size(); }

 private:
  enum class Wait { kReady, kClosed, kTimeout, kStopped };

  Wait wait_readable(Clock::time_point deadline, bool watch_stop);
  Wait read_more(Clock::time_point deadline, bool watch_stop);
  void fill(Clock::time_point deadline);
  std::optional<std::pair<std::size_t, std::size_t>> find_head_end(std::size_t& scan_from) const;
  std::string read_line(Clock::time_point deadline, std::size_t max_bytes, int status_if_longer);
  std::string read_chunked_body(Clock::time_point deadline);

  int fd_;
  int stop_fd_;
  const HttpServerOptions& options_;
  std::string buffer_;
  std::size_t pos_ = 0;  // start of the unread bytes in buffer_
};

RequestReader::Wait RequestReader::wait_readable(Clock::time_point deadline, bool watch_stop) {
  while (true) {
    const int timeout_ms = ms_until(deadline);
    if (timeout_ms <= 0) return Wait::kTimeout;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = poll(fds, watch_stop ? 2 : 1, timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Wait::kClosed;
    if (watch_stop && fds[1].revents != 0) return Wait::kStopped;
    if (fds[0].revents != 0) return Wait::kReady;
  }
}

RequestReader::Wait RequestReader::read_more(Clock::time_point deadline, bool watch_stop) {
  const Wait wait = wait_readable(deadline, watch_stop);
  if (wait != Wait::kReady) return wait;
  const std::size_t old_size = buffer_.size();
  buffer_.resize(old_size + kReadSize);
  ssize_t n;
  do {
    n = recv(fd_, buffer_.data() + old_size, kReadSize, 0);
  } while (n < 0 && errno == EINTR);
  buffer_.resize(old_size + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) return Wait::kReady;
  return Wait::kClosed;
}

void RequestReader::fill(Clock::time_point deadline) {
  switch (read_more(deadline, false)) {
    case Wait::kReady:
      return;
    case Wait::kTimeout:
      throw HttpError(408,
                      str_cat("request not received within ", options_.read_timeout_ms, " ms"));
    default:
      throw PeerClosed{};
  }
}

// [head start, first byte past the head's last line) and the body start, once the empty
// line ending the head (CRLF or bare LF) is buffered. `scan_from` remembers where to go on.
std::optional<std::pair<std::size_t, std::size_t>> RequestReader::find_head_end(
    std::size_t& scan_from) const {
  for (std::size_t i = buffer_.find('\n', scan_from); i != std::string::npos;
       i = buffer_.find('\n', i + 1)) {
    scan_from = i;
    if (i + 1 >= buffer_.size()) return std::nullopt;
    if (buffer_[i + 1] == '\n') return std::pair(i + 1, i + 2);
    if (buffer_[i + 1] == '\r') {
      if (i + 2 >= buffer_.size()) return std::nullopt;
      if (buffer_[i + 2] == '\n') return std::pair(i + 1, i + 3);
    }
  }
  scan_from = buffer_.size();
  return std::nullopt;
}

std::string RequestReader::read_line(Clock::time_point deadline, std::size_t max_bytes,
                                     int status_if_longer) {
  std::size_t scan_from = pos_;
  while (true) {
    const std::size_t eol = buffer_.find('\n', scan_from);
    if (eol != std::string::npos) {
      std::string line = buffer_.substr(pos_, eol - pos_);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      pos_ = eol + 1;
      return line;
    }
    if (buffer_.size() - pos_ > max_bytes) throw HttpError(status_if_longer, "line too long");
    scan_from = buffer_.size();
    fill(deadline);
  }
}

std::string RequestReader::read_chunked_body(Clock::time_point deadline) {
  std::string body;
  while (true) {
    if (pos_ > kCompactBytes) {
      buffer_.erase(0, pos_);
      pos_ = 0;
    }
    const std::uint64_t size = parse_chunk_size(read_line(deadline, kMaxChunkLineBytes, 400));
    if (size == 0) break;
    if (size > options_.max_body_bytes - body.size())
      throw HttpError(413, str_cat("request body larger than ", options_.max_body_bytes, " bytes"));
    while (buffer_.size() - pos_ < size + 2) fill(deadline);
    body.append(buffer_, pos_, size);
    if (buffer_.compare(pos_ + size, 2, "\r\n") != 0)
      throw HttpError(400, "chunk data not followed by CRLF");
    pos_ += size + 2;
  }
  std::size_t trailer_bytes = 0;
  while (true) {
    const std::string line = read_line(deadline, options_.max_header_bytes, 431);
    if (line.empty()) break;
    trailer_bytes += line.size();
    if (trailer_bytes > options_.max_header_bytes) throw HttpError(431, "trailers too large");
  }
  return body;
}

std::optional<HttpRequest> RequestReader::read_request() {
  buffer_.erase(0, pos_);
  pos_ = 0;

  // Wait for the request's first byte; empty lines before a request line are ignored.
  const auto idle_deadline = Clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
  while (true) {
    while (pos_ < buffer_.size() && (buffer_[pos_] == '\r' || buffer_[pos_] == '\n')) ++pos_;
    if (pos_ < buffer_.size()) break;
    if (read_more(idle_deadline, true) != Wait::kReady) return std::nullopt;
  }

  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  const std::string too_large =
      str_cat("request line and headers larger than ", options_.max_header_bytes, " bytes");
  std::size_t scan_from = pos_;
  std::optional<std::pair<std::size_t, std::size_t>> head_end;
  while (!(head_end = find_head_end(scan_from))) {
    if (buffer_.size() - pos_ > options_.max_header_bytes) throw HttpError(431, too_large);
    fill(deadline);
  }
  const auto [head_stop, body_start] = *head_end;
  if (body_start - pos_ > options_.max_header_bytes) throw HttpError(431, too_large);
  HttpRequest request =
      parse_request_head(std::string_view(buffer_).substr(pos_, head_stop - pos_));
  pos_ = body_start;

  const auto transfer_encodings = request.headers.get_all("Transfer-Encoding");
  const auto content_lengths = request.headers.get_all("Content-Length");
  bool chunked = false;
  std::uint64_t content_length = 0;
  if (!transfer_encodings.empty()) {
    if (!content_lengths.empty())
      throw HttpError(400, "both Transfer-Encoding and Content-Length are set");
    if (request.minor_version == 0)
      throw HttpError(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (transfer_encodings.size() != 1 || !iequals(transfer_encodings[0], "chunked"))
      throw HttpError(501, "only Transfer-Encoding: chunked is supported");
    chunked = true;
  } else if (!content_lengths.empty()) {
    for (std::string_view text : content_lengths) {
      if (text.empty() || text.size() > 18 ||
          !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        throw HttpError(400, "malformed Content-Length");
      const std::uint64_t value = std::stoull(std::string(text));
      if (text != content_lengths[0]) throw HttpError(400, "conflicting Content-Length headers");
      content_length = value;
    }
    if (content_length > options_.max_body_bytes)
      throw HttpError(413, str_cat("request body of ", content_length, " bytes is larger than ",
                                   options_.max_body_bytes, " bytes"));
  }

  if (const auto expect = request.headers.get("Expect")) {
    if (!iequals(*expect, "100-continue"))
      throw HttpError(417, str_cat("unsupported Expect: ", *expect));
    const bool body_expected = chunked || content_length > 0;
    if (request.minor_version >= 1 && body_expected && pos_ == buffer_.size()) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      if (send(fd_, kContinue.data(), kContinue.size(), MSG_NOSIGNAL) < 0) throw PeerClosed{};
    }
  }

  if (chunked) {
    request.body = read_chunked_body(deadline);
  } else {
    while (buffer_.size() - pos_ < content_length) fill(deadline);
    request.body = buffer_.substr(pos_, content_length);
    pos_ += content_length;
  }
  return request;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// HttpResponseWriter

HttpResponseWriter::HttpResponseWriter(int socket_fd, int request_minor_version, bool keep_alive)
    : fd_(socket_fd), minor_version_(request_minor_version), keep_alive_(keep_alive) {}

HttpHeaders HttpResponseWriter::base_headers(std::string_view content_type) const {
  HttpHeaders headers{{"Date", http_date()}, {"Server", "hyserve"}};
  if (!content_type.empty()) headers.add("Content-Type", std::string(content_type));
  if (!keep_alive_) {
    headers.add("Connection", "close");
  } else if (minor_version_ == 0) {
    headers.add("Connection", "keep-alive");
  }
  for (const auto& [name, value] : added_headers_.fields()) headers.add(name, value);
  return headers;
}

void HttpResponseWriter::add_header(std::string name, std::string value) {
  CHECK(state_ == State::kIdle, "add_header after the response started: ", name);
  added_headers_.add(std::move(name), std::move(value));
}

bool HttpResponseWriter::write_all(std::string_view data) {
  while (!data.empty() && !failed_.load()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed_.store(true);
      break;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return !failed_.load();
}

bool HttpResponseWriter::send(int status, std::string_view content_type, std::string_view body,
                              const HttpHeaders& extra_headers) {
  CHECK(state_ == State::kIdle, "a response was already started for this request");
  state_ = State::kDone;
  status_ = status;
  HttpHeaders headers = base_headers(content_type);
  headers.add("Content-Length", std::to_string(body.size()));
  for (const auto& [name, value] : extra_headers.fields()) headers.add(name, value);
  std::string message = format_response_head(status, headers);
  message += body;
  return write_all(message);
}

bool HttpResponseWriter::send_error(int status, std::string_view message) {
  return send(status, "application/json", openai_error_body(status, message));
}

bool HttpResponseWriter::start_stream(int status, std::string_view content_type,
                                      const HttpHeaders& extra_headers) {
  CHECK(state_ == State::kIdle, "a response was already started for this request");
  state_ = State::kStreaming;
  status_ = status;
  if (minor_version_ == 0) keep_alive_ = false;  // HTTP/1.0: the body ends at close
  HttpHeaders headers = base_headers(content_type);
  if (minor_version_ >= 1) headers.add("Transfer-Encoding", "chunked");
  if (content_type.starts_with("text/event-stream") && !extra_headers.has("Cache-Control"))
    headers.add("Cache-Control", "no-cache");
  for (const auto& [name, value] : extra_headers.fields()) headers.add(name, value);
  return write_all(format_response_head(status, headers));
}

bool HttpResponseWriter::write_chunk(std::string_view data) {
  CHECK(state_ == State::kStreaming, "write_chunk outside start_stream .. end_stream");
  if (client_disconnected()) {
    failed_.store(true);
    return false;
  }
  if (data.empty()) return true;
  return write_all(minor_version_ >= 1 ? format_chunk(data) : std::string(data));
}

bool HttpResponseWriter::end_stream() {
  CHECK(state_ == State::kStreaming, "end_stream without start_stream");
  state_ = State::kDone;
  if (minor_version_ == 0) return !failed_.load();
  return write_all(kLastChunk);
}

void HttpResponseWriter::abort_stream() {
  CHECK(state_ == State::kStreaming, "abort_stream without start_stream");
  state_ = State::kDone;
  failed_.store(true);
}

bool HttpResponseWriter::client_disconnected() const {
  if (failed_.load()) return true;
  pollfd pfd{fd_, POLLRDHUP, 0};
  if (poll(&pfd, 1, 0) <= 0) return false;
  return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// ---------------------------------------------------------------------------------------
// HttpServer

struct HttpServer::Connection {
  int fd = -1;  // closed and set to -1 (under mutex_) when the thread is done
  std::string remote_address;
  std::thread thread;
  bool done = false;  // under mutex_
};

HttpServer::HttpServer(Options options) : options_(std::move(options)) {
  CHECK(options_.port >= 0 && options_.port <= 65535, "port out of range: ", options_.port);
  CHECK(options_.max_connections > 0, "max_connections must be positive");
  CHECK(options_.max_header_bytes > 0, "max_header_bytes must be positive");
  CHECK(options_.idle_timeout_ms > 0 && options_.read_timeout_ms > 0 &&
            options_.write_timeout_ms > 0 && options_.drain_timeout_ms >= 0,
        "timeouts must be positive");
}

HttpServer::~HttpServer() {
  stop();
  if (stop_event_fd_ >= 0) close(stop_event_fd_);
}

void HttpServer::route(std::string method, std::string path, Handler handler) {
  std::lock_guard lock(mutex_);
  CHECK(!started_, "route() after start(): ", method, " ", path);
  CHECK(handler != nullptr, "null handler for ", method, " ", path);
  auto& methods = routes_[std::move(path)];
  CHECK(methods.find(method) == methods.end(), "route registered twice: ", method);
  methods.emplace(std::move(method), std::move(handler));
}

void HttpServer::use(HttpMiddleware middleware) {
  std::lock_guard lock(mutex_);
  CHECK(!started_, "use() after start()");
  middleware_ = std::move(middleware);
}

void HttpServer::start() {
  std::lock_guard lock(mutex_);
  CHECK(!started_, "start() called twice");
  const std::string where = str_cat(options_.host, ":", options_.port);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options_.port);
  if (const int rc = getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &found); rc != 0)
    throw Error(str_cat("cannot listen on ", where, ": ", gai_strerror(rc)));
  std::vector<addrinfo*> candidates;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) candidates.push_back(a);
  // "localhost" resolves to ::1 and 127.0.0.1: prefer IPv4, which clients try most.
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const addrinfo* a) { return a->ai_family == AF_INET; });
  std::string failure = "no address";
  for (const addrinfo* a : candidates) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      failure = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
      break;
    }
    failure = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw Error(str_cat("cannot listen on ", where, ": ", failure));

  sockaddr_storage bound{};
  socklen_t bound_length = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  bound_port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  stop_event_fd_ = eventfd(0, EFD_CLOEXEC);
  if (stop_event_fd_ < 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    throw Error(str_cat("cannot listen on ", where, ": eventfd: ", std::strerror(errno)));
  }
  started_ = true;
  acceptor_ = std::thread([this] { accept_loop(); });
}

void HttpServer::accept_loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_event_fd_, POLLIN, 0}};
    const int ready = poll(fds, 2, 1000);
    if (fds[1].revents != 0) return;
    reap_finished_connections(false);
    if (ready <= 0 || fds[0].revents == 0) continue;

    sockaddr_storage peer{};
    socklen_t peer_length = sizeof(peer);
    const int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: back off instead of spinning on the pending connection.
      if (errno == EMFILE || errno == ENFILE)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const timeval send_timeout{options_.write_timeout_ms / 1000,
                               (options_.write_timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));

    std::unique_lock lock(mutex_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      lock.unlock();
      HttpResponseWriter writer(fd, 1, false);
      writer.send_error(
          503, str_cat("too many connections (", options_.max_connections, "); retry later"));
      shutdown(fd, SHUT_WR);
      close(fd);
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->remote_address = format_address(peer, peer_length);
    Connection* raw = connection.get();
    connections_.push_back(std::move(connection));
    try {
      raw->thread = std::thread([this, raw] { run_connection(*raw); });
    } catch (const std::system_error& e) {
      connections_.pop_back();
      lock.unlock();
      HttpResponseWriter writer(fd, 1, false);
      writer.send_error(503, str_cat("cannot start a connection thread: ", e.what()));
      shutdown(fd, SHUT_WR);
      close(fd);
    }
  }
}

void HttpServer::run_connection(Connection& connection) {
  try {
    serve_connection(connection);
  } catch (const std::exception& e) {
    log::error("connection {} failed: {}", connection.remote_address, e.what());
  }
  {
    std::lock_guard lock(mutex_);
    close(connection.fd);
    connection.fd = -1;
    connection.done = true;
  }
  changed_.notify_all();
}

void HttpServer::reap_finished_connections(bool all) {
  std::vector<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard lock(mutex_);
    auto keep = std::stable_partition(connections_.begin(), connections_.end(),
                                      [all](const auto& c) { return !all && !c->done; });
    std::move(keep, connections_.end(), std::back_inserter(finished));
    connections_.erase(keep, connections_.end());
  }
  for (auto& connection : finished) connection->thread.join();
}

void HttpServer::serve_connection(Connection& connection) {
  RequestReader reader(connection.fd, stop_event_fd_, options_);
  bool linger = false;
  while (!stopping_.load()) {
    std::optional<HttpRequest> request;
    try {
      request = reader.read_request();
    } catch (const HttpError& e) {
      HttpResponseWriter writer(connection.fd, 1, false);
      writer.send_error(e.status(), e.what());
      linger = true;
      break;
    } catch (const PeerClosed&) {
      break;
    }
    if (!request) break;
    request->remote_address = connection.remote_address;
    HttpResponseWriter writer(connection.fd, request->minor_version, wants_keep_alive(*request));
    if (stopping_.load()) writer.close_after_response();
    dispatch(*request, writer);
    if (!writer.keeps_alive()) {
      linger = reader.has_unread_bytes();
      break;
    }
  }
  if (linger) {
    shutdown_lingering(connection.fd);
  } else {
    shutdown(connection.fd, SHUT_WR);
  }
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
  const auto start = std::chrono::steady_clock::now();
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

  if (!writer.responded()) {
    if (!error) error = HttpError(500, "Internal server error: the handler sent no response");
    writer.send_error(error->status(), error->what());
  } else if (writer.streaming()) {
    // A stream that failed midway is cut short (no last chunk), so the client sees the error.
    if (error) {
      writer.abort_stream();
    } else {
      writer.end_stream();
    }
  }
  if (observer_) {
    // The route as registered, or "none" for a path no route has (vLLM's instrumentator).
    const bool known = routes_.find(request.path) != routes_.end();
    observer_(known ? request.path : std::string("none"), request.method, writer.status(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

void HttpServer::observe(RequestObserver observer) {
  observer_ = std::move(observer);
}

void HttpServer::stop() {
  {
    std::unique_lock lock(mutex_);
    if (!started_ || stopped_) return;
    if (stopping_.exchange(true)) {
      changed_.wait(lock, [this] { return stopped_; });
      return;
    }
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = write(stop_event_fd_, &one, sizeof(one));
  acceptor_.join();
  close(listen_fd_);
  listen_fd_ = -1;

  {
    std::unique_lock lock(mutex_);
    const auto deadline = Clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
    changed_.wait_until(lock, deadline, [this] {
      return std::all_of(connections_.begin(), connections_.end(),
                         [](const auto& c) { return c->done; });
    });
    // Past the drain timeout: cut the stragglers off; their handlers see the disconnect.
    for (const auto& connection : connections_)
      if (!connection->done) shutdown(connection->fd, SHUT_RDWR);
  }
  reap_finished_connections(true);

  std::lock_guard lock(mutex_);
  stopped_ = true;
  changed_.notify_all();
}

void HttpServer::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return stopped_; });
}

}  // namespace hyserve
