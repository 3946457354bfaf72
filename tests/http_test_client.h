// The HTTP server tests' tools: a blocking plain-socket client (TestClient) that reads
// whole responses with deadlines, request builders, the OpenAI error-shape check, and an
// HttpServer with echo routes (start_echo_server). Used by http_server_test.cpp and
// http_server_streaming_test.cpp.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/http_message.h"
#include "server/http_server.h"

namespace hyserve::test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct TestResponse {
  int status = 0;
  HttpHeaders headers;
  std::string body;                 // de-chunked
  std::vector<std::string> chunks;  // the chunks of a chunked body, as framed
};

// A blocking HTTP client on one connection; every read has a deadline.
class TestClient {
 public:
  explicit TestClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~TestClient() { close_now(); }
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool connected() const { return connected_; }
  void close_now() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // A half-close: a FIN, the client sends no more and still reads.
  void shutdown_send() { ::shutdown(fd_, SHUT_WR); }
  // An abortive close: a reset instead of a FIN (SO_LINGER 0).
  void reset_now() {
    if (fd_ < 0) return;
    const linger abort_on_close{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
    close_now();
  }

  void send_raw(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << "send failed: " << std::strerror(errno);
      data.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Reads bytes until `buffer_` holds `count` bytes; false on EOF or timeout.
  bool fill_to(std::size_t count, Clock::time_point deadline) {
    while (buffer_.size() < count) {
      if (!read_some(deadline)) return false;
    }
    return true;
  }

  // Reads until `marker` is buffered; returns its position or npos on EOF / timeout.
  std::size_t fill_until(std::string_view marker, Clock::time_point deadline) {
    while (true) {
      const auto at = buffer_.find(marker);
      if (at != std::string::npos) return at;
      if (!read_some(deadline)) return std::string::npos;
    }
  }

  // One whole response; status 0 when none arrived within `timeout_ms`.
  TestResponse read_response(int timeout_ms = 5000) {
    const auto deadline = Clock::now() + milliseconds(timeout_ms);
    TestResponse response;
    const auto head_end = fill_until("\r\n\r\n", deadline);
    if (head_end == std::string::npos) return response;
    const std::string head = buffer_.substr(0, head_end);
    buffer_.erase(0, head_end + 4);
    std::size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.1 ", 0) != 0) return response;
    response.status = std::stoi(status_line.substr(9, 3));
    while (line_end != std::string::npos) {
      const std::size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end - start);
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      response.headers.add(line.substr(0, colon),
                           line.substr(line.find_first_not_of(' ', colon + 1)));
    }
    if (response.status == 100) return response;
    if (response.headers.get_or("Transfer-Encoding", "") == "chunked") {
      while (true) {
        const auto eol = fill_until("\r\n", deadline);
        if (eol == std::string::npos) return TestResponse{};
        const std::size_t size = std::stoul(buffer_.substr(0, eol), nullptr, 16);
        buffer_.erase(0, eol + 2);
        if (!fill_to(size + 2, deadline)) return TestResponse{};
        if (size == 0) {
          buffer_.erase(0, 2);
          break;
        }
        response.chunks.push_back(buffer_.substr(0, size));
        response.body += response.chunks.back();
        buffer_.erase(0, size + 2);
      }
    } else if (const auto length = response.headers.get("Content-Length")) {
      const std::size_t size = std::stoul(std::string(*length));
      if (!fill_to(size, deadline)) return TestResponse{};
      response.body = buffer_.substr(0, size);
      buffer_.erase(0, size);
    } else {
      while (read_some(deadline)) {
      }
      response.body = std::move(buffer_);
      buffer_.clear();
    }
    return response;
  }

  // Whether the server closes the connection (EOF or reset) within `timeout_ms`, with no
  // more bytes arriving first.
  bool closed_by_server(int timeout_ms = 2000) {
    const auto deadline = Clock::now() + milliseconds(timeout_ms);
    const std::size_t before = buffer_.size();
    while (read_some(deadline)) {
    }
    return eof_ && buffer_.size() == before;
  }

  const std::string& buffered() const { return buffer_; }

 private:
  bool read_some(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || fd_ < 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) return false;
    char data[16384];
    const ssize_t n = recv(fd_, data, sizeof(data), 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(data, static_cast<std::size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buffer_;
};

inline std::string get_request(std::string_view path, std::string_view extra_headers = "") {
  return str_cat("GET ", path, " HTTP/1.1\r\nHost: test\r\n", extra_headers, "\r\n");
}

inline std::string post_request(std::string_view path, std::string_view body,
                                std::string_view extra_headers = "") {
  return str_cat("POST ", path, " HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\n",
                 "Content-Length: ", body.size(), "\r\n", extra_headers, "\r\n", body);
}

// Checks the OpenAI error shape and returns the message.
inline std::string expect_openai_error(const TestResponse& response, int status,
                                       std::string_view type) {
  EXPECT_EQ(response.status, status);
  EXPECT_EQ(response.headers.get_or("Content-Type", ""), "application/json");
  const auto json = nlohmann::json::parse(response.body, nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << response.body;
  if (json.is_discarded()) return {};
  const auto& error = json.at("error");
  EXPECT_EQ(error.size(), 4u) << response.body;
  EXPECT_EQ(error.at("type"), type) << response.body;
  EXPECT_TRUE(error.at("param").is_null()) << response.body;
  EXPECT_EQ(error.at("code"), status) << response.body;
  EXPECT_TRUE(error.at("message").is_string()) << response.body;
  return error.at("message").get<std::string>();
}

// Threads a handler hands its slow work to (a handler must not block its I/O thread).
// Joined on destruction: declare it after the server it serves, so it goes first.
class Workers {
 public:
  ~Workers() { join(); }
  void spawn(std::function<void()> work) {
    std::lock_guard lock(mutex_);
    threads_.emplace_back(std::move(work));
  }
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

inline HttpServer::Options test_options() {
  HttpServer::Options options;
  options.port = 0;
  return options;
}

// A server with echo routes: GET /hello (path, query, header), POST /echo (body),
// GET /throw, GET /stream?n=N (N SSE chunks; with sleep_ms, written from a worker thread
// with that pause between chunks). Stops the server, then joins the workers, then goes.
struct EchoServer {
  std::unique_ptr<HttpServer> server;
  std::shared_ptr<Workers> workers = std::make_shared<Workers>();

  EchoServer() = default;
  EchoServer(EchoServer&&) = default;
  ~EchoServer() {
    if (server) server->stop();
    if (workers) workers->join();
  }
  HttpServer* operator->() const { return server.get(); }
};

inline EchoServer start_echo_server(HttpServer::Options options = test_options()) {
  EchoServer echo;
  echo.server = std::make_unique<HttpServer>(std::move(options));
  HttpServer* server = echo.server.get();
  Workers* workers = echo.workers.get();
  server->route("GET", "/hello", [](const HttpRequest& request, HttpResponseWriter& writer) {
    const nlohmann::json reply = {{"path", request.path},
                                  {"name", request.query_param("name").value_or("?")},
                                  {"agent", request.headers.get_or("x-test-agent", "")},
                                  {"remote", request.remote_address}};
    writer.send(200, "application/json", reply.dump(), {{"X-Reply", "yes"}});
  });
  server->route("POST", "/echo", [](const HttpRequest& request, HttpResponseWriter& writer) {
    writer.send(200, "text/plain", request.body);
  });
  server->route("GET", "/throw",
                [](const HttpRequest&, HttpResponseWriter&) { throw std::runtime_error("boom"); });
  server->route("GET", "/bad",
                [](const HttpRequest&, HttpResponseWriter&) { throw HttpError(400, "bad thing"); });
  server->route("GET", "/stream",
                [workers](const HttpRequest& request, HttpResponseWriter& writer) {
                  const int n = std::stoi(request.query_param("n").value_or("1"));
                  writer.start_stream(200, "text/event-stream");
                  const auto sleep_ms = request.query_param("sleep_ms");
                  if (!sleep_ms) {
                    for (int i = 0; i < n; ++i) writer.write_chunk(str_cat("data: ", i, "\n\n"));
                    writer.end_stream();
                    return;
                  }
                  workers->spawn([writer, n, pause = milliseconds(std::stoi(*sleep_ms))]() mutable {
                    for (int i = 0; i < n; ++i) {
                      if (!writer.write_chunk(str_cat("data: ", i, "\n\n"))) return;
                      std::this_thread::sleep_for(pause);
                    }
                    writer.end_stream();
                  });
                });
  server->start();
  return echo;
}

}  // namespace hyserve::test
