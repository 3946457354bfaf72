#include "parallel/step_channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <cstring>
#include <map>

namespace hyserve::parallel {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

enum class Kind : uint8_t { kHello = 1, kPlan = 2, kAck = 3, kError = 4 };
constexpr size_t kHeaderBytes = 9;
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 32;

void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Writes all of data before the deadline; false (errno-style text in `error`) otherwise.
bool write_all(int fd, const uint8_t* data, size_t n, Clock::time_point deadline,
               std::string& error) {
  while (n > 0) {
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      data += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      error = std::strerror(errno);
      return false;
    }
    pollfd p{fd, POLLOUT, 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) == 0) {
      error = "timed out (the peer does not read)";
      return false;
    }
  }
  return true;
}

bool write_frame(int fd, Kind kind, const uint8_t* payload, size_t n, Clock::time_point deadline,
                 std::string& error) {
  uint8_t header[kHeaderBytes];
  header[0] = static_cast<uint8_t>(kind);
  put_le(header + 1, n, 8);
  return write_all(fd, header, kHeaderBytes, deadline, error) &&
         write_all(fd, payload, n, deadline, error);
}

// Blocking read of exactly n bytes; false at end of stream or on an error.
bool read_all(int fd, uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got > 0) {
      data += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return false;
  }
  return true;
}

// The next frame; none at end of stream. CommError on a frame that is not one.
std::optional<std::pair<Kind, Bytes>> read_frame(int fd, const std::string& from) {
  uint8_t header[kHeaderBytes];
  if (!read_all(fd, header, kHeaderBytes)) return std::nullopt;
  const auto kind = static_cast<Kind>(header[0]);
  const uint64_t n = get_le(header + 1, 8);
  if (header[0] < 1 || header[0] > 4 || n > kMaxFrameBytes)
    throw CommError(str_cat("step channel: malformed frame from ", from, " (kind ", int{header[0]},
                            ", ", n, " bytes)"));
  Bytes payload(static_cast<size_t>(n));
  if (!read_all(fd, payload.data(), payload.size())) return std::nullopt;
  return std::make_pair(kind, std::move(payload));
}

}  // namespace

// ---- LeaderChannel ---------------------------------------------------------------------

struct LeaderChannel::Impl {
  struct Worker {
    int rank = 0;
    tcp::socket socket;
    std::thread reader;
    explicit Worker(asio::io_context& io) : socket(io) {}
  };

  std::chrono::milliseconds timeout;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::unique_ptr<Worker>> pending;  // accepted, hello not yet read

  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::map<int, Worker*> by_rank;  // said hello
  std::map<int, uint64_t> acked;
  std::optional<std::string> failure;
  bool closing = false;
  int size = 0;
  int readers_done = 0;

  void fail(const std::string& message) {
    std::lock_guard lock(mu);
    if (!failure && !closing) failure = message;
    changed.notify_all();
  }

  void read_loop(Worker* w) {
    read_frames(w);
    std::lock_guard lock(mu);
    ++readers_done;
    changed.notify_all();
  }

  // The frames of one connection: its hello, then acks until it closes or errs.
  void read_frames(Worker* w) {
    const int fd = w->socket.native_handle();
    int rank = -1;
    try {
      for (;;) {
        const auto frame = read_frame(fd, rank < 0 ? "a worker" : str_cat("rank ", rank));
        if (!frame) {
          if (rank >= 0) {
            fail(str_cat("rank ", rank,
                         ": the connection to the worker closed (it exited or was killed)"));
          }
          return;
        }
        const auto& [kind, payload] = *frame;
        if (kind == Kind::kHello) {
          const int r = payload.size() == 4 ? static_cast<int>(get_le(payload.data(), 4)) : -1;
          std::lock_guard lock(mu);
          if (rank >= 0 || r < 1 || r >= size || by_rank.contains(r)) {
            if (!failure) {
              failure = str_cat("step channel: a worker said hello as rank ", r, " (group of ",
                                size, ", ranks seen: ", by_rank.size(), ")");
            }
            changed.notify_all();
            return;
          }
          rank = r;
          w->rank = r;
          by_rank[r] = w;
          acked[r] = 0;
          changed.notify_all();
        } else if (kind == Kind::kAck && rank >= 0 && payload.size() == 8) {
          std::lock_guard lock(mu);
          acked[rank] = std::max(acked[rank], get_le(payload.data(), 8));
          changed.notify_all();
        } else if (kind == Kind::kError && rank >= 0) {
          fail(str_cat("rank ", rank, ": ", std::string(payload.begin(), payload.end())));
          return;
        } else {
          fail(str_cat("step channel: unexpected frame ", static_cast<int>(kind), " from ",
                       rank < 0 ? std::string("a worker") : str_cat("rank ", rank)));
          return;
        }
      }
    } catch (const CommError& e) {
      fail(e.what());
    }
  }
};

LeaderChannel::LeaderChannel(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->timeout = timeout;
  try {
    const tcp::endpoint endpoint = tcp::resolver(impl_->io)
                                       .resolve(host, std::to_string(port), tcp::resolver::passive)
                                       .begin()
                                       ->endpoint();
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
    impl_->acceptor.non_blocking(true);
  } catch (const boost::system::system_error& e) {
    throw CommError(str_cat("step channel: cannot listen on ", host, ":", port, ": ", e.what()));
  }
}

LeaderChannel::~LeaderChannel() {
  close();
}

int LeaderChannel::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void LeaderChannel::accept_workers(int size) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    m.size = size;
  }
  const auto deadline = Clock::now() + m.timeout;
  for (;;) {
    {
      std::lock_guard lock(m.mu);
      if (m.failure) throw CommError(*m.failure);
      if (static_cast<int>(m.by_rank.size()) == size - 1) return;
    }
    if (Clock::now() >= deadline) break;
    auto w = std::make_unique<Impl::Worker>(m.io);
    error_code ec;
    m.acceptor.accept(w->socket, ec);
    if (!ec) {
      w->socket.non_blocking(false, ec);
      w->socket.set_option(tcp::no_delay(true), ec);
      Impl::Worker* raw = w.get();
      w->reader = std::thread([&m, raw] { m.read_loop(raw); });
      m.pending.push_back(std::move(w));
      continue;
    }
    std::unique_lock lock(m.mu);
    m.changed.wait_for(lock, std::chrono::milliseconds(5));
  }
  std::string missing;
  {
    std::lock_guard lock(m.mu);
    for (int r = 1; r < size; ++r) {
      if (!m.by_rank.contains(r)) missing += str_cat(missing.empty() ? "" : ", ", r);
    }
  }
  throw CommError(str_cat("step channel: rank(s) ", missing, " did not connect within ",
                          m.timeout.count(), " ms"));
}

void LeaderChannel::send(const Bytes& payload) {
  Impl& m = *impl_;
  std::vector<std::pair<int, int>> targets;  // rank, fd
  {
    std::lock_guard lock(m.mu);
    if (m.failure) throw CommError(*m.failure);
    for (const auto& [rank, w] : m.by_rank) targets.emplace_back(rank, w->socket.native_handle());
  }
  const auto deadline = Clock::now() + m.timeout;
  for (const auto& [rank, fd] : targets) {
    std::string error;
    if (!write_frame(fd, Kind::kPlan, payload.data(), payload.size(), deadline, error)) {
      // A closed connection is usually the worker's exit, which its reader reports better.
      std::unique_lock lock(m.mu);
      m.changed.wait_for(lock, std::chrono::milliseconds(100),
                         [&] { return m.failure.has_value(); });
      if (m.failure) throw CommError(*m.failure);
      throw CommError(str_cat("rank ", rank, ": sending the step plan failed: ", error));
    }
  }
}

std::optional<std::string> LeaderChannel::failure() const {
  std::lock_guard lock(impl_->mu);
  return impl_->failure;
}

std::vector<uint64_t> LeaderChannel::acked() const {
  std::lock_guard lock(impl_->mu);
  std::vector<uint64_t> out;
  for (int r = 1; r < impl_->size; ++r) {
    const auto it = impl_->acked.find(r);
    out.push_back(it == impl_->acked.end() ? 0 : it->second);
  }
  return out;
}

std::vector<int> LeaderChannel::wait_acked(uint64_t step, std::chrono::milliseconds timeout) const {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  const auto behind = [&] {
    std::vector<int> ranks;
    for (int r = 1; r < m.size; ++r) {
      const auto it = m.acked.find(r);
      if (it == m.acked.end() || it->second < step) ranks.push_back(r);
    }
    return ranks;
  };
  m.changed.wait_for(lock, timeout, [&] { return m.failure.has_value() || behind().empty(); });
  return behind();
}

void LeaderChannel::close(std::chrono::milliseconds grace) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    m.closing = true;
  }
  error_code ec;
  m.acceptor.close(ec);
  if (grace.count() > 0) {
    for (auto& w : m.pending) w->socket.shutdown(tcp::socket::shutdown_send, ec);
    std::unique_lock lock(m.mu);
    m.changed.wait_for(lock, grace,
                       [&] { return m.readers_done == static_cast<int>(m.pending.size()); });
  }
  for (auto& w : m.pending) {
    w->socket.shutdown(tcp::socket::shutdown_both, ec);
  }
  for (auto& w : m.pending) {
    if (w->reader.joinable()) w->reader.join();
    w->socket.close(ec);
  }
  m.pending.clear();
  std::lock_guard lock(m.mu);
  m.by_rank.clear();
}

// ---- WorkerChannel ---------------------------------------------------------------------

struct WorkerChannel::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  int rank = 0;
  std::chrono::milliseconds timeout;
};

WorkerChannel::WorkerChannel(const std::string& host, int port, int rank,
                             std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = rank;
  m.timeout = connect_timeout;
  const auto deadline = Clock::now() + connect_timeout;
  std::string last_error = "timed out";
  for (;;) {
    error_code ec;
    const auto endpoints = tcp::resolver(m.io).resolve(host, std::to_string(port), ec);
    if (!ec) {
      asio::connect(m.socket, endpoints, ec);
      if (!ec) break;
    }
    last_error = ec.message();
    m.socket.close(ec);
    if (Clock::now() >= deadline) {
      throw CommError(str_cat("rank ", rank, ": could not connect to the leader's step channel ",
                              host, ":", port, " within ", connect_timeout.count(), " ms (",
                              last_error, ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_code ec;
  m.socket.set_option(tcp::no_delay(true), ec);
  uint8_t hello[4];
  put_le(hello, static_cast<uint64_t>(rank), 4);
  std::string error;
  if (!write_frame(m.socket.native_handle(), Kind::kHello, hello, 4, Clock::now() + m.timeout,
                   error)) {
    throw CommError(str_cat("rank ", rank, ": saying hello to the leader failed: ", error));
  }
}

WorkerChannel::~WorkerChannel() = default;

std::optional<Bytes> WorkerChannel::receive() {
  Impl& m = *impl_;
  const auto frame = read_frame(m.socket.native_handle(), "the leader");
  if (!frame) return std::nullopt;
  if (frame->first != Kind::kPlan) {
    throw CommError(str_cat("rank ", m.rank, ": the leader sent frame ",
                            static_cast<int>(frame->first), ", not a plan"));
  }
  return frame->second;
}

void WorkerChannel::ack(uint64_t step) {
  Impl& m = *impl_;
  uint8_t payload[8];
  put_le(payload, step, 8);
  std::string error;
  if (!write_frame(m.socket.native_handle(), Kind::kAck, payload, 8, Clock::now() + m.timeout,
                   error)) {
    throw CommError(str_cat("rank ", m.rank, ": acknowledging step ", step, " failed: ", error));
  }
}

void WorkerChannel::report_error(const std::string& message) noexcept {
  try {
    std::string error;
    write_frame(impl_->socket.native_handle(), Kind::kError,
                reinterpret_cast<const uint8_t*>(message.data()), message.size(),
                Clock::now() + std::chrono::seconds(2), error);
  } catch (...) {
  }
}

}  // namespace hyserve::parallel
