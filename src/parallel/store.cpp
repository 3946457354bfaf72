// TcpStore's wire protocol, one request at a time per connection (integers little-endian):
//   request   op u8 | key_len u32 | key | set: value_len u64, value | add: delta i64
//   response  status u8 (0 ok, 1 error) | len u64 | payload
// The payload is the value for get, the new value as decimal text for add, empty for set
// and the message for an error. A get of a missing key is answered when the key is set;
// the client gives up (and closes the connection) at its deadline, the server never waits.
#include "parallel/store.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <thread>

namespace hyserve::parallel {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum class Status : uint8_t { kOk = 0, kError = 1 };

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;
constexpr size_t kResponseHeaderBytes = 9;

void put_le(Bytes& out, uint64_t v, int num_bytes) {
  for (int i = 0; i < num_bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t get_le(const uint8_t* p, int num_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < num_bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

Bytes to_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::string timeout_text(std::chrono::milliseconds timeout) {
  return std::to_string(timeout.count()) + " ms";
}

}  // namespace

Bytes encode_counter(int64_t value) {
  return to_bytes(std::to_string(value));
}

int64_t decode_counter(const std::string& key, const Bytes& value) {
  int64_t v = 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const auto [end, ec] = std::from_chars(begin, begin + value.size(), v);
  if (ec != std::errc() || end != begin + value.size() || value.empty())
    throw CommError(str_cat("store: add() on key '", key, "', whose value is not an integer"));
  return v;
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    get(key, std::max(left, std::chrono::milliseconds(0)));
  }
}

// ---- HashStore ------------------------------------------------------------------------

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; }))
    throw CommError(
        str_cat("HashStore: key '", key, "' was not set within ", timeout_text(timeout)));
  return values_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    v = (it == values_.end() ? 0 : decode_counter(key, it->second)) + delta;
    values_[key] = encode_counter(v);
  }
  changed_.notify_all();
  return v;
}

// ---- StoreServer: the values and the connections, all on one thread -------------------

class StoreServer {
 public:
  StoreServer(const std::string& host, int port) : acceptor_(io_, listen_endpoint(host, port)) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~StoreServer() {
    io_.stop();
    thread_.join();
  }

  tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }

 private:
  tcp::endpoint listen_endpoint(const std::string& host, int port) {
    return tcp::resolver(io_)
        .resolve(host, std::to_string(port), tcp::resolver::passive)
        .begin()
        ->endpoint();
  }

  struct Session {
    explicit Session(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    uint8_t header[8];
    Op op = Op::kGet;
    std::string key;
    Bytes value;
    Bytes out;
  };
  using SessionPtr = std::shared_ptr<Session>;

  void accept() {
    auto s = std::make_shared<Session>(io_);
    acceptor_.async_accept(s->socket, [this, s](error_code ec) {
      if (ec) return;  // the acceptor was closed
      s->socket.set_option(tcp::no_delay(true), ec);
      read_request(s);
      accept();
    });
  }

  // op and key_len, then the key, then what the op carries.
  void read_request(const SessionPtr& s) {
    asio::async_read(s->socket, asio::buffer(s->header, 5), [this, s](error_code ec, size_t) {
      if (ec) return;  // the client left
      s->op = static_cast<Op>(s->header[0]);
      const auto key_len = static_cast<uint32_t>(get_le(s->header + 1, 4));
      if (key_len > kMaxKeyBytes) return;
      s->key.resize(key_len);
      asio::async_read(s->socket, asio::buffer(s->key), [this, s](error_code ec2, size_t) {
        if (ec2) return;
        if (s->op == Op::kGet) return handle(s);
        read_operand(s);
      });
    });
  }

  void read_operand(const SessionPtr& s) {
    asio::async_read(s->socket, asio::buffer(s->header, 8), [this, s](error_code ec, size_t) {
      if (ec) return;
      const uint64_t n = get_le(s->header, 8);
      if (s->op == Op::kAdd) return handle(s);
      if (s->op != Op::kSet || n > kMaxValueBytes) return;  // not our protocol: drop it
      s->value.resize(n);
      asio::async_read(s->socket, asio::buffer(s->value), [this, s](error_code ec2, size_t) {
        if (!ec2) handle(s);
      });
    });
  }

  void handle(const SessionPtr& s) {
    switch (s->op) {
      case Op::kSet: {
        values_[s->key] = std::move(s->value);
        respond(s, Status::kOk, {});
        auto waiting = waiters_.extract(s->key);
        if (!waiting.empty())
          for (auto& w : waiting.mapped()) respond(w, Status::kOk, values_[s->key]);
        return;
      }
      case Op::kGet: {
        auto it = values_.find(s->key);
        if (it == values_.end()) return waiters_[s->key].push_back(s);
        return respond(s, Status::kOk, it->second);
      }
      case Op::kAdd: {
        const auto delta = static_cast<int64_t>(get_le(s->header, 8));
        auto it = values_.find(s->key);
        try {
          const int64_t v = (it == values_.end() ? 0 : decode_counter(s->key, it->second)) + delta;
          values_[s->key] = encode_counter(v);
          respond(s, Status::kOk, values_[s->key]);
        } catch (const CommError& e) {
          respond(s, Status::kError, to_bytes(e.what()));
        }
        return;
      }
    }
  }

  // One response at a time per session; once written, the session reads its next request.
  void respond(const SessionPtr& s, Status status, const Bytes& payload) {
    s->out.clear();
    s->out.push_back(static_cast<uint8_t>(status));
    put_le(s->out, payload.size(), 8);
    s->out.insert(s->out.end(), payload.begin(), payload.end());
    asio::async_write(s->socket, asio::buffer(s->out), [this, s](error_code ec, size_t) {
      if (!ec) read_request(s);
    });
  }

  asio::io_context io_;  // first: destroyed last
  tcp::acceptor acceptor_;
  std::map<std::string, Bytes> values_;
  std::map<std::string, std::vector<SessionPtr>> waiters_;  // gets of keys not set yet
  std::thread thread_;
};

// ---- StoreClient: one connection, blocking calls with deadlines -----------------------

class StoreClient {
 public:
  StoreClient(std::string host, int port, std::chrono::milliseconds connect_timeout)
      : host_(std::move(host)), port_(port), connect_timeout_(connect_timeout), socket_(io_) {
    connect();
  }

  // Sends one request and returns the payload of its answer. On a timeout, throws CommError
  // with timeout_message; the connection is closed after any failure (the next call opens
  // a new one).
  Bytes call(Op op, const std::string& key, const Bytes& operand, std::chrono::milliseconds timeout,
             const std::string& timeout_message) {
    std::lock_guard lock(mutex_);
    if (!socket_.is_open()) connect();
    Bytes request;
    request.push_back(static_cast<uint8_t>(op));
    put_le(request, key.size(), 4);
    request.insert(request.end(), key.begin(), key.end());
    request.insert(request.end(), operand.begin(), operand.end());
    const auto deadline = Clock::now() + timeout;
    Bytes header(kResponseHeaderBytes);
    Bytes payload;
    try {
      transfer(deadline, timeout_message,
               [&](auto done) { asio::async_write(socket_, asio::buffer(request), done); });
      transfer(deadline, timeout_message,
               [&](auto done) { asio::async_read(socket_, asio::buffer(header), done); });
      payload.resize(get_le(header.data() + 1, 8));
      transfer(deadline, timeout_message,
               [&](auto done) { asio::async_read(socket_, asio::buffer(payload), done); });
    } catch (...) {
      error_code ignored;
      socket_.close(ignored);
      throw;
    }
    if (header[0] != static_cast<uint8_t>(Status::kOk))
      throw CommError(std::string(payload.begin(), payload.end()));
    return payload;
  }

  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  // Starts one async operation (start(handler)) and runs it to completion or the deadline.
  template <typename Start>
  void transfer(Clock::time_point deadline, const std::string& timeout_message, Start start) {
    error_code result = asio::error::would_block;
    start([&](error_code ec, size_t) { result = ec; });
    run_until(deadline, result);
    if (result == asio::error::would_block)
      throw CommError(str_cat("TcpStore (server ", address(), "): ", timeout_message));
    if (result)
      throw CommError(str_cat("TcpStore: lost the connection to the server ", address(), ": ",
                              result.message()));
  }

  // Runs the io_context until result is set or the deadline passes; then the pending
  // operation is cancelled (the socket closed) and its handler drained.
  void run_until(Clock::time_point deadline, error_code& result) {
    io_.restart();
    if (Clock::now() < deadline) {
      io_.run_until(deadline);
    } else {
      io_.poll();  // a deadline already past still takes what is ready now
    }
    if (result == asio::error::would_block) {
      error_code ignored;
      socket_.close(ignored);
      io_.restart();
      io_.run();
      result = asio::error::would_block;
    }
  }

  // Retries until connect_timeout_: the server may not be listening yet.
  void connect() {
    const auto deadline = Clock::now() + connect_timeout_;
    std::string last_error = "timed out";
    while (Clock::now() < deadline) {
      error_code ec;
      const auto endpoints = tcp::resolver(io_).resolve(host_, std::to_string(port_), ec);
      if (!ec) {
        error_code result = asio::error::would_block;
        asio::async_connect(socket_, endpoints,
                            [&](error_code e, const tcp::endpoint&) { result = e; });
        run_until(deadline, result);
        if (!result) {
          socket_.set_option(tcp::no_delay(true), ec);
          return;
        }
        if (result != asio::error::would_block) last_error = result.message();
        socket_.close(ec);
      } else {
        last_error = ec.message();
      }
      std::this_thread::sleep_for(
          std::min<Clock::duration>(std::chrono::milliseconds(20), deadline - Clock::now()));
    }
    throw CommError(str_cat("TcpStore: could not connect to the server ", address(), " within ",
                            timeout_text(connect_timeout_), " (", last_error, ")"));
  }

  std::string host_;
  int port_;
  std::chrono::milliseconds connect_timeout_;
  std::mutex mutex_;  // one call at a time
  asio::io_context io_;
  tcp::socket socket_;
};

// ---- TcpStore -------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options), port_(options.port) {
  std::string connect_host = options.host;
  if (options.is_server) {
    try {
      server_ = std::make_unique<StoreServer>(options.host, options.port);
    } catch (const boost::system::system_error& e) {
      throw CommError(
          str_cat("TcpStore: cannot listen on ", options.host, ":", options.port, ": ", e.what()));
    }
    const auto endpoint = server_->endpoint();
    port_ = endpoint.port();
    if (endpoint.address().is_unspecified())
      connect_host = endpoint.address().is_v6() ? "::1" : "127.0.0.1";
  }
  client_ = std::make_unique<StoreClient>(connect_host, port_, options.connect_timeout);
}

// The client first: it is connected to the server.
TcpStore::~TcpStore() {
  client_.reset();
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  Bytes operand;
  put_le(operand, value.size(), 8);
  operand.insert(operand.end(), value.begin(), value.end());
  client_->call(Op::kSet, key, operand, options_.timeout,
                str_cat("set('", key, "') not answered within ", timeout_text(options_.timeout)));
}

Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return client_->call(Op::kGet, key, {}, timeout,
                       str_cat("key '", key, "' was not set within ", timeout_text(timeout)));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Bytes operand;
  put_le(operand, static_cast<uint64_t>(delta), 8);
  const Bytes v = client_->call(
      Op::kAdd, key, operand, options_.timeout,
      str_cat("add('", key, "') not answered within ", timeout_text(options_.timeout)));
  return decode_counter(key, v);
}

}  // namespace hyserve::parallel
