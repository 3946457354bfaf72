// HttpServer over real sockets on 127.0.0.1 (ephemeral ports), driven by a small
// plain-socket client written here, plus the pure wire-format functions of http_message.h,
// RequestParser fed piece by piece and HttpResponseWriter over a sink that records bytes.
// Handlers run on the server's I/O threads and must not block: the slow ones here hand
// their writer to a Workers thread.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/cors.h"
#include "server/http_message.h"
#include "server/http_server.h"
#include "server/request_parser.h"

namespace hyserve {
namespace {

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

std::string get_request(std::string_view path, std::string_view extra_headers = "") {
  return str_cat("GET ", path, " HTTP/1.1\r\nHost: test\r\n", extra_headers, "\r\n");
}

std::string post_request(std::string_view path, std::string_view body,
                         std::string_view extra_headers = "") {
  return str_cat("POST ", path, " HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\n",
                 "Content-Length: ", body.size(), "\r\n", extra_headers, "\r\n", body);
}

// Checks the OpenAI error shape and returns the message.
std::string expect_openai_error(const TestResponse& response, int status, std::string_view type) {
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

HttpServer::Options test_options() {
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

EchoServer start_echo_server(HttpServer::Options options = test_options()) {
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

TEST(HttpServerTest, GetAndPostRoundTrip) {
  auto server = start_echo_server();
  ASSERT_GT(server->port(), 0);
  TestClient client(server->port());
  ASSERT_TRUE(client.connected());

  client.send_raw(get_request("/hello?name=a%20b+c&x=1", "X-Test-Agent: probe\r\n"));
  const TestResponse get = client.read_response();
  ASSERT_EQ(get.status, 200);
  EXPECT_EQ(get.headers.get_or("x-reply", ""), "yes");
  const auto json = nlohmann::json::parse(get.body);
  EXPECT_EQ(json["path"], "/hello");
  EXPECT_EQ(json["name"], "a b c");
  EXPECT_EQ(json["agent"], "probe");
  EXPECT_TRUE(json["remote"].get<std::string>().starts_with("127.0.0.1:")) << json["remote"];

  const std::string body = "{\"prompt\": \"hello\"}\n\xe4\xb8\xad";
  client.send_raw(post_request("/echo", body));
  const TestResponse post = client.read_response();
  ASSERT_EQ(post.status, 200);
  EXPECT_EQ(post.body, body);
  EXPECT_EQ(post.headers.get_or("Content-Type", ""), "text/plain");
}

TEST(HttpServerTest, KeepAliveServesSeveralRequestsThenHonoursConnectionClose) {
  auto server = start_echo_server();
  TestClient client(server->port());
  for (int i = 0; i < 5; ++i) {
    client.send_raw(post_request("/echo", str_cat("request ", i)));
    const TestResponse response = client.read_response();
    ASSERT_EQ(response.status, 200) << "request " << i;
    EXPECT_EQ(response.body, str_cat("request ", i));
    EXPECT_FALSE(response.headers.has("Connection"));
  }
  client.send_raw(post_request("/echo", "last", "Connection: close\r\n"));
  const TestResponse last = client.read_response();
  EXPECT_EQ(last.body, "last");
  EXPECT_EQ(last.headers.get_or("Connection", ""), "close");
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpServerTest, Http10ClosesUnlessKeepAliveAsked) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw("POST /echo HTTP/1.0\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhi");
  const TestResponse kept = client.read_response();
  EXPECT_EQ(kept.body, "hi");
  EXPECT_EQ(kept.headers.get_or("Connection", ""), "keep-alive");
  client.send_raw("POST /echo HTTP/1.0\r\nContent-Length: 3\r\n\r\nbye");
  const TestResponse closing = client.read_response();
  EXPECT_EQ(closing.body, "bye");
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpServerTest, PipelinedRequestsAnsweredInOrder) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(post_request("/echo", "first") + get_request("/hello?name=second") + "\r\n" +
                  post_request("/echo", "third") + get_request("/missing"));
  EXPECT_EQ(client.read_response().body, "first");
  EXPECT_EQ(nlohmann::json::parse(client.read_response().body)["name"], "second");
  EXPECT_EQ(client.read_response().body, "third");
  EXPECT_EQ(client.read_response().status, 404);
}

TEST(HttpServerTest, ChunkedRequestBodyIsDecoded) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  std::this_thread::sleep_for(milliseconds(20));
  client.send_raw("1;ext=1\r\n,\r\n");
  std::this_thread::sleep_for(milliseconds(20));
  client.send_raw("A\r\n chunked!\n\r\n0\r\nX-Trailer: t\r\n\r\n");
  const TestResponse response = client.read_response();
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "hello, chunked!\n");
  // The connection stays usable after a chunked body.
  client.send_raw(post_request("/echo", "again"));
  EXPECT_EQ(client.read_response().body, "again");
}

TEST(HttpServerTest, ExpectContinueGetsInterimResponse) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(client.read_response(2000).status, 100);
  client.send_raw("body");
  const TestResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "body");
}

TEST(HttpServerTest, OversizedBodyGets413) {
  HttpServer::Options options = test_options();
  options.max_body_bytes = 1000;
  auto server = start_echo_server(options);
  {
    TestClient client(server->port());
    client.send_raw(post_request("/echo", std::string(1000, 'a')));
    EXPECT_EQ(client.read_response().status, 200) << "exactly the limit is allowed";
    client.send_raw(post_request("/echo", std::string(1001, 'a')));
    expect_openai_error(client.read_response(), 413, "RequestTooLargeError");
    EXPECT_TRUE(client.closed_by_server());
  }
  {
    TestClient client(server->port());
    client.send_raw("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; ++i) client.send_raw(str_cat("190\r\n", std::string(400, 'b'), "\r\n"));
    expect_openai_error(client.read_response(), 413, "RequestTooLargeError");
    EXPECT_TRUE(client.closed_by_server());
  }
}

TEST(HttpServerTest, HugeHeadersGet431) {
  HttpServer::Options options = test_options();
  options.max_header_bytes = 4096;
  auto server = start_echo_server(options);
  TestClient client(server->port());
  client.send_raw(get_request("/hello", str_cat("X-Big: ", std::string(5000, 'x'), "\r\n")));
  expect_openai_error(client.read_response(), 431, "RequestHeaderFieldsTooLargeError");
  EXPECT_TRUE(client.closed_by_server());

  TestClient endless(server->port());  // never ends its head
  endless.send_raw(str_cat("GET /hello HTTP/1.1\r\nX-Big: ", std::string(8000, 'x')));
  EXPECT_EQ(endless.read_response().status, 431);
}

TEST(HttpServerTest, MalformedRequestsGet400AndClose) {
  auto server = start_echo_server();
  const std::vector<std::string> bad = {
      "GARBAGE\r\n\r\n",
      "GET /hello HTTP/1.1 extra\r\n\r\n",
      "GET hello HTTP/1.1\r\n\r\n",
      "G(T /hello HTTP/1.1\r\n\r\n",
      "GET /hello HTTX/1.1\r\n\r\n",
      "GET /hello HTTP/1.1\r\nNo colon here\r\n\r\n",
      "GET /hello HTTP/1.1\r\nBad Name: x\r\n\r\n",
      "GET /hello HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
      "GET /hello%zz HTTP/1.1\r\n\r\n",
      "POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
      "POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
      "POST /echo HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
  };
  for (const std::string& request : bad) {
    TestClient client(server->port());
    client.send_raw(request);
    expect_openai_error(client.read_response(), 400, "BadRequestError");
    EXPECT_TRUE(client.closed_by_server()) << request;
  }
  TestClient http2(server->port());
  http2.send_raw("GET /hello HTTP/2.0\r\n\r\n");
  EXPECT_EQ(http2.read_response().status, 505);
  TestClient gzip(server->port());
  gzip.send_raw("POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n");
  EXPECT_EQ(gzip.read_response().status, 501);
}

TEST(HttpServerTest, UnknownRouteGets404AndWrongMethodGets405) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(get_request("/v1/nothing"));
  const std::string message = expect_openai_error(client.read_response(), 404, "NotFoundError");
  EXPECT_NE(message.find("/v1/nothing"), std::string::npos) << message;

  client.send_raw(post_request("/hello", "x"));
  const TestResponse wrong = client.read_response();
  expect_openai_error(wrong, 405, "MethodNotAllowedError");
  EXPECT_EQ(wrong.headers.get_or("Allow", ""), "GET");
  client.send_raw(get_request("/hello"));
  EXPECT_EQ(client.read_response().status, 200) << "errors keep the connection open";
}

TEST(HttpServerTest, MiddlewareAddsHeadersOrAnswersBeforeRouting) {
  auto server = std::make_unique<HttpServer>(test_options());
  server->route("GET", "/hello",
                [](const HttpRequest&, HttpResponseWriter& w) { w.send(200, "text/plain", "hi"); });
  server->route("GET", "/stream", [](const HttpRequest&, HttpResponseWriter& w) {
    w.start_stream(200, "text/event-stream");
    w.write_chunk("data: 1\n\n");
  });
  server->use([](const HttpRequest& request, HttpResponseWriter& w) {
    w.add_header("X-Seen", request.path);
    if (request.method == "OPTIONS") w.send(200, "text/plain", "preflight");
  });
  server->start();
  TestClient client(server->port());
  // Every response carries the header: a route's, a stream's, the 404 and the 405.
  for (const auto& [request, status] :
       std::vector<std::pair<std::string, int>>{{get_request("/hello"), 200},
                                                {get_request("/stream"), 200},
                                                {get_request("/nothing"), 404},
                                                {post_request("/hello", "x"), 405}}) {
    client.send_raw(request);
    const TestResponse r = client.read_response();
    EXPECT_EQ(r.status, status) << request;
    EXPECT_NE(r.headers.get_or("X-Seen", ""), "") << request;
  }
  // The middleware answers an OPTIONS to a path no route has.
  client.send_raw("OPTIONS /anywhere HTTP/1.1\r\nHost: test\r\n\r\n");
  const TestResponse options = client.read_response();
  EXPECT_EQ(options.status, 200);
  EXPECT_EQ(options.body, "preflight");
  EXPECT_EQ(options.headers.get_or("X-Seen", ""), "/anywhere");
}

HttpRequest cors_request(std::string method, HttpHeaders headers) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = "/v1/chat/completions";
  r.headers = std::move(headers);
  return r;
}

TEST(CorsTest, DefaultsAllowEverything) {
  const CorsPolicy cors;
  const HttpRequest pre = cors_request("OPTIONS", {{"Origin", "https://a.example"},
                                                   {"Access-Control-Request-Method", "POST"},
                                                   {"Access-Control-Request-Headers", "X-Any"}});
  ASSERT_TRUE(CorsPolicy::is_preflight(pre));
  const CorsPreflight p = cors.preflight(pre);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "OK");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Origin", ""), "*");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Methods", ""),
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Headers", ""), "X-Any");
  EXPECT_EQ(p.headers.get_or("Access-Control-Max-Age", ""), "600");
  EXPECT_FALSE(p.headers.has("Access-Control-Allow-Credentials"));
  EXPECT_FALSE(p.headers.has("Vary"));
  // Not preflights: no Origin, or no requested method.
  EXPECT_FALSE(CorsPolicy::is_preflight(cors_request("OPTIONS", {})));
  EXPECT_FALSE(CorsPolicy::is_preflight(cors_request("OPTIONS", {{"Origin", "x"}})));
  EXPECT_FALSE(CorsPolicy::is_preflight(
      cors_request("GET", {{"Origin", "x"}, {"Access-Control-Request-Method", "GET"}})));

  const HttpHeaders simple = cors.response_headers(cors_request("GET", {{"Origin", "https://a"}}));
  EXPECT_EQ(simple.get_or("Access-Control-Allow-Origin", ""), "*");
  EXPECT_TRUE(cors.response_headers(cors_request("GET", {})).empty());
  // With cookies the origin itself is named ("*" does not cover credentialed requests).
  const HttpHeaders cookie =
      cors.response_headers(cors_request("GET", {{"Origin", "https://a"}, {"Cookie", "c=1"}}));
  EXPECT_EQ(cookie.get_or("Access-Control-Allow-Origin", ""), "https://a");
  EXPECT_EQ(cookie.get_or("Vary", ""), "Origin");
}

TEST(CorsTest, ListedOriginsMethodsHeadersAndCredentials) {
  CorsOptions options;
  options.allowed_origins = {"https://good.example"};
  options.allowed_methods = {"GET", "POST"};
  options.allowed_headers = {"Authorization"};
  options.allow_credentials = true;
  const CorsPolicy cors(options);
  const auto preflight = [&](std::string origin, std::string method, std::string headers) {
    HttpHeaders h{{"Origin", std::move(origin)}, {"Access-Control-Request-Method", method}};
    if (!headers.empty()) h.add("Access-Control-Request-Headers", std::move(headers));
    return cors.preflight(cors_request("OPTIONS", std::move(h)));
  };
  const CorsPreflight ok = preflight("https://good.example", "POST", "authorization, Content-Type");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Origin", ""), "https://good.example");
  EXPECT_EQ(ok.headers.get_or("Vary", ""), "Origin");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Methods", ""), "GET, POST");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Headers", ""),
            "accept, accept-language, authorization, content-language, content-type");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Credentials", ""), "true");

  EXPECT_EQ(preflight("https://evil.example", "POST", "").body, "Disallowed CORS origin");
  EXPECT_FALSE(
      preflight("https://evil.example", "POST", "").headers.has("Access-Control-Allow-Origin"));
  EXPECT_EQ(preflight("https://good.example", "DELETE", "").body, "Disallowed CORS method");
  const CorsPreflight bad = preflight("https://evil.example", "PUT", "X-Secret");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body, "Disallowed CORS origin, method, headers");

  const HttpHeaders good =
      cors.response_headers(cors_request("POST", {{"Origin", "https://good.example"}}));
  EXPECT_EQ(good.get_or("Access-Control-Allow-Origin", ""), "https://good.example");
  EXPECT_EQ(good.get_or("Access-Control-Allow-Credentials", ""), "true");
  EXPECT_TRUE(
      cors.response_headers(cors_request("POST", {{"Origin", "https://evil.example"}})).empty());
}

TEST(HttpServerTest, HandlerExceptionGets500AndServerKeepsServing) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(get_request("/throw"));
  const std::string message =
      expect_openai_error(client.read_response(), 500, "InternalServerError");
  EXPECT_NE(message.find("boom"), std::string::npos) << message;
  client.send_raw(get_request("/bad"));
  EXPECT_EQ(expect_openai_error(client.read_response(), 400, "BadRequestError"), "bad thing");
  client.send_raw(get_request("/hello"));
  EXPECT_EQ(client.read_response().status, 200);
  TestClient other(server->port());
  other.send_raw(get_request("/hello"));
  EXPECT_EQ(other.read_response().status, 200);
}

TEST(HttpServerTest, StreamsHundredChunksInOrder) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(get_request("/stream?n=100"));
  const TestResponse response = client.read_response();
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(response.headers.get_or("Content-Type", ""), "text/event-stream");
  EXPECT_EQ(response.headers.get_or("Cache-Control", ""), "no-cache");
  EXPECT_FALSE(response.headers.has("Content-Length"));
  ASSERT_EQ(response.chunks.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(response.chunks[i], str_cat("data: ", i, "\n\n"));
  client.send_raw(get_request("/stream?n=3"));
  EXPECT_EQ(client.read_response().body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST(HttpServerTest, ClientDisconnectMidStreamFailsWriteChunk) {
  HttpServer server(test_options());
  Workers workers;
  std::promise<std::pair<int, bool>> seen;  // chunks written, client_disconnected()
  server.route("GET", "/stream", [&](const HttpRequest&, HttpResponseWriter& writer) {
    writer.start_stream(200, "text/event-stream");
    workers.spawn([&, writer]() mutable {
      int written = 0;
      for (; written < 2000; ++written) {  // 2000 * 5 ms: a bound, never reached
        if (!writer.write_chunk("data: token\n\n")) break;
        std::this_thread::sleep_for(milliseconds(5));
      }
      seen.set_value({written, writer.client_disconnected()});
    });
  });
  server.start();
  TestClient client(server.port());
  client.send_raw(get_request("/stream"));
  ASSERT_NE(client.fill_until("data: token", Clock::now() + milliseconds(2000)), std::string::npos);
  const auto closed_at = Clock::now();
  client.close_now();
  auto result = seen.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(2)), std::future_status::ready)
      << "write_chunk kept succeeding after the client closed";
  const auto [written, disconnected] = result.get();
  EXPECT_LT(written, 2000);
  EXPECT_TRUE(disconnected);
  EXPECT_LT(Clock::now() - closed_at, std::chrono::seconds(2));
}

TEST(HttpServerTest, ClientDisconnectedSeenWhileHandlerWaits) {
  HttpServer server(test_options());
  Workers workers;
  std::promise<bool> seen;
  std::promise<void> callback_ran;  // on_disconnect's
  server.route("POST", "/wait", [&](const HttpRequest&, HttpResponseWriter& writer) {
    writer.on_disconnect([&] { callback_ran.set_value(); });
    workers.spawn([&, writer] {
      bool disconnected = false;
      for (int i = 0; i < 1000 && !disconnected; ++i) {  // up to 5 s
        disconnected = writer.client_disconnected();
        std::this_thread::sleep_for(milliseconds(5));
      }
      seen.set_value(disconnected);
    });
  });
  server.route("GET", "/hello", [](const HttpRequest&, HttpResponseWriter& writer) {
    writer.send(200, "text/plain", "hi");
  });
  server.start();
  {
    // A pipelined request behind the waiting one is data, not a disconnect.
    TestClient client(server.port());
    client.send_raw(post_request("/wait", "x") + get_request("/hello"));
    std::this_thread::sleep_for(milliseconds(100));
    client.close_now();
  }
  auto result = seen.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_TRUE(result.get());
  EXPECT_EQ(callback_ran.get_future().wait_for(std::chrono::seconds(2)), std::future_status::ready);
}

TEST(HttpServerTest, ClientDisconnectedIgnoresPipelinedDataInTheSocket) {
  HttpServer server(test_options());
  Workers workers;
  std::atomic<int> false_alarms{0};
  server.route("GET", "/wait", [&](const HttpRequest&, HttpResponseWriter& writer) {
    writer.on_disconnect([&] { ++false_alarms; });
    workers.spawn([&, writer]() mutable {
      for (int i = 0; i < 30; ++i) {  // 300 ms while the next request sits unread
        if (writer.client_disconnected()) ++false_alarms;
        std::this_thread::sleep_for(milliseconds(10));
      }
      writer.send(200, "text/plain", "waited");
    });
  });
  server.route("GET", "/hello", [](const HttpRequest&, HttpResponseWriter& writer) {
    writer.send(200, "text/plain", "hi");
  });
  server.start();
  TestClient client(server.port());
  client.send_raw(get_request("/wait"));
  std::this_thread::sleep_for(milliseconds(50));  // the server has read the first request
  client.send_raw(get_request("/hello"));
  EXPECT_EQ(client.read_response().body, "waited");
  EXPECT_EQ(client.read_response().body, "hi") << "the pipelined request was lost";
  EXPECT_EQ(false_alarms.load(), 0);
}

TEST(HttpServerTest, ThreeHundredConcurrentStreamsAllComplete) {
  auto server = start_echo_server();
  constexpr int kClients = 300;
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TestClient>(server->port()));
    ASSERT_TRUE(clients.back()->connected()) << "client " << i;
    clients.back()->send_raw(get_request("/stream?n=20&sleep_ms=10"));
  }
  for (int i = 0; i < kClients; ++i) {
    const TestResponse response = clients[i]->read_response(10000);
    ASSERT_EQ(response.status, 200) << "client " << i;
    ASSERT_EQ(response.chunks.size(), 20u) << "client " << i;
    EXPECT_EQ(response.chunks.back(), "data: 19\n\n");
  }
}

TEST(HttpServerTest, SlowClientGets408AndIdleConnectionCloses) {
  HttpServer::Options options = test_options();
  options.read_timeout_ms = 300;
  options.idle_timeout_ms = 300;
  auto server = start_echo_server(options);

  TestClient slow(server->port());
  const auto start = Clock::now();
  slow.send_raw("POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
  expect_openai_error(slow.read_response(3000), 408, "RequestTimeoutError");
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_TRUE(slow.closed_by_server());

  TestClient idle(server->port());
  idle.send_raw(get_request("/hello"));
  EXPECT_EQ(idle.read_response().status, 200);
  EXPECT_TRUE(idle.closed_by_server(2000)) << "idle keep-alive connection left open";
}

TEST(HttpServerTest, StopDrainsInFlightRequestThenRefusesConnections) {
  HttpServer server(test_options());
  Workers workers;
  std::atomic<bool> handler_started{false};
  server.route("GET", "/slow", [&](const HttpRequest&, HttpResponseWriter& writer) {
    handler_started = true;
    workers.spawn([writer]() mutable {
      std::this_thread::sleep_for(milliseconds(300));
      writer.send(200, "text/plain", "finished");
    });
  });
  server.start();
  const int port = server.port();

  TestClient idle(port);  // an idle keep-alive connection does not hold stop() up
  TestClient busy(port);
  busy.send_raw(get_request("/slow"));
  for (int i = 0; i < 200 && !handler_started; ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(handler_started);

  std::thread waiter([&] { server.wait(); });
  const auto stop_start = Clock::now();
  std::thread stopper([&] { server.stop(); });
  const TestResponse response = busy.read_response(3000);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "finished");
  stopper.join();
  waiter.join();
  EXPECT_LT(Clock::now() - stop_start, milliseconds(2000));
  EXPECT_TRUE(idle.closed_by_server(500));
  TestClient late(port);
  EXPECT_FALSE(late.connected()) << "connection accepted after stop()";
}

TEST(HttpServerTest, StopCutsOffHandlersPastDrainTimeout) {
  HttpServer::Options options = test_options();
  options.drain_timeout_ms = 100;
  HttpServer server(options);
  Workers workers;
  std::atomic<bool> streaming{false};
  std::atomic<bool> cancelled{false};  // the on_disconnect callback ran
  server.route("GET", "/forever", [&](const HttpRequest&, HttpResponseWriter& writer) {
    writer.start_stream(200, "text/event-stream");
    writer.on_disconnect([&] { cancelled = true; });
    streaming = true;
    workers.spawn([writer]() mutable {
      for (int i = 0; i < 1000 && writer.write_chunk("data: x\n\n"); ++i)  // up to 10 s
        std::this_thread::sleep_for(milliseconds(10));
    });
  });
  server.start();
  TestClient client(server.port());
  client.send_raw(get_request("/forever"));
  for (int i = 0; i < 200 && !streaming; ++i) std::this_thread::sleep_for(milliseconds(5));
  const auto start = Clock::now();
  server.stop();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_TRUE(cancelled);
  workers.join();  // the worker saw write_chunk fail
}

TEST(HttpServerTest, StartFailsNamingAddressInUse) {
  auto first = start_echo_server();
  HttpServer::Options options;
  options.port = first->port();
  HttpServer second(options);
  try {
    second.start();
    FAIL() << "second server bound a port in use";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(str_cat("127.0.0.1:", first->port())), std::string::npos)
        << e.what();
  }
  HttpServer::Options bad_host = test_options();
  bad_host.host = "256.1.1.1";
  EXPECT_THROW(HttpServer(bad_host).start(), Error);
}

TEST(HttpServerTest, ConnectionsBeyondTheCapGet503) {
  HttpServer::Options options = test_options();
  options.max_connections = 2;
  auto server = start_echo_server(options);
  TestClient a(server->port());
  TestClient b(server->port());
  a.send_raw(get_request("/hello"));
  b.send_raw(get_request("/hello"));
  ASSERT_EQ(a.read_response().status, 200);
  ASSERT_EQ(b.read_response().status, 200);
  TestClient c(server->port());
  expect_openai_error(c.read_response(), 503, "ServiceUnavailableError");
  EXPECT_TRUE(c.closed_by_server());
  a.close_now();
  // Once a's close is seen (bounded wait), a new connection is served again.
  bool served = false;
  for (int i = 0; i < 40 && !served; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    TestClient d(server->port());
    d.send_raw(get_request("/hello"));
    served = d.read_response().status == 200;
  }
  EXPECT_TRUE(served);
}

// Records what a writer hands its sink; disconnect() plays the client going away.
class RecordingSink : public ResponseSink {
 public:
  void write(std::string bytes) override { bytes_ += bytes; }
  void finish(int status, bool keep_alive) override {
    ++num_finished_;
    status_ = status;
    keep_alive_ = keep_alive;
  }
  bool disconnected() const override { return gone_; }
  void on_disconnect(std::function<void()> callback) override {
    callbacks_.push_back(std::move(callback));
  }
  void post(std::function<void()> work) override { work(); }
  void disconnect() {
    gone_ = true;
    for (auto& callback : callbacks_) callback();
  }

  std::string bytes_;
  int num_finished_ = 0;
  int status_ = 0;
  bool keep_alive_ = false;

 private:
  bool gone_ = false;
  std::vector<std::function<void()>> callbacks_;
};

TEST(HttpResponseWriterTest, FramesAStreamIntoItsSink) {
  auto sink = std::make_shared<RecordingSink>();
  {
    HttpResponseWriter writer(sink, 1, true);
    EXPECT_FALSE(writer.client_disconnected());
    EXPECT_TRUE(writer.start_stream(201, "text/event-stream", {{"Cache-Control", "no-store"}}));
    EXPECT_THROW(writer.send(200, "text/plain", "x"), InvalidArgument);
    EXPECT_TRUE(writer.write_chunk("abc"));
    EXPECT_TRUE(writer.write_chunk(""));
    EXPECT_EQ(sink->num_finished_, 0);
    EXPECT_TRUE(writer.end_stream());
  }
  const std::string& received = sink->bytes_;
  EXPECT_TRUE(received.starts_with("HTTP/1.1 201 Created\r\n")) << received;
  EXPECT_NE(received.find("Cache-Control: no-store\r\n"), std::string::npos) << received;
  EXPECT_EQ(received.find("no-cache"), std::string::npos) << received;
  EXPECT_TRUE(received.ends_with("\r\n\r\n3\r\nabc\r\n0\r\n\r\n")) << received;
  EXPECT_EQ(sink->num_finished_, 1);
  EXPECT_EQ(sink->status_, 201);
  EXPECT_TRUE(sink->keep_alive_);

  auto gone = std::make_shared<RecordingSink>();
  HttpResponseWriter orphan(gone, 1, true);
  bool cancelled = false;
  orphan.on_disconnect([&] { cancelled = true; });
  gone->disconnect();
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE(orphan.client_disconnected());
  EXPECT_FALSE(orphan.send(200, "text/plain", "lost"));
  EXPECT_FALSE(gone->keep_alive_);
}

TEST(HttpResponseWriterTest, LastCopyCompletesTheResponse) {
  // A handler that never answered: 500, once the last copy is gone.
  auto idle = std::make_shared<RecordingSink>();
  std::optional<HttpResponseWriter> kept;
  {
    HttpResponseWriter writer(idle, 1, true);
    kept = writer;  // a handler's copy, for answering later
  }
  EXPECT_EQ(idle->num_finished_, 0) << "completed while a copy was still held";
  kept.reset();
  EXPECT_EQ(idle->num_finished_, 1);
  EXPECT_EQ(idle->status_, 500);
  EXPECT_TRUE(idle->bytes_.starts_with("HTTP/1.1 500 ")) << idle->bytes_;

  // An open stream is ended; an HTTP/1.0 stream ends with the connection.
  auto stream = std::make_shared<RecordingSink>();
  HttpResponseWriter(stream, 1, true).start_stream(200, "text/event-stream");
  EXPECT_TRUE(stream->bytes_.ends_with("\r\n\r\n0\r\n\r\n")) << stream->bytes_;
  EXPECT_TRUE(stream->keep_alive_);
  auto http10 = std::make_shared<RecordingSink>();
  {
    HttpResponseWriter writer(http10, 0, true);
    writer.start_stream(200, "text/event-stream");
    writer.write_chunk("data: 1\n\n");
  }
  EXPECT_TRUE(http10->bytes_.ends_with("\r\n\r\ndata: 1\n\n")) << http10->bytes_;
  EXPECT_NE(http10->bytes_.find("Connection: close\r\n"), std::string::npos) << http10->bytes_;
  EXPECT_FALSE(http10->keep_alive_);
}

TEST(HttpServerTest, HandlerAnswersLaterFromAPostedCallback) {
  HttpServer server(test_options());
  Workers workers;
  server.route("GET", "/later", [&](const HttpRequest& request, HttpResponseWriter& writer) {
    // As the engine's outputs do: another thread posts the work onto the connection.
    workers.spawn([writer, name = request.query_param("name").value_or("")]() mutable {
      std::this_thread::sleep_for(milliseconds(50));
      writer.post([writer, name]() mutable { writer.send(200, "text/plain", "later " + name); });
    });
  });
  server.route("GET", "/hello", [](const HttpRequest&, HttpResponseWriter& writer) {
    writer.send(200, "text/plain", "hi");
  });
  server.start();
  TestClient client(server.port());
  // Pipelined behind the deferred answer, /hello still comes second.
  client.send_raw(get_request("/later?name=a") + get_request("/hello"));
  EXPECT_EQ(client.read_response().body, "later a");
  EXPECT_EQ(client.read_response().body, "hi");
}

// The threads of this process (Linux: /proc/self/status).
int num_threads() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  int threads = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "Threads: %d", &threads) == 1) break;
  }
  std::fclose(status);
  return threads;
}

TEST(HttpServerTest, ThousandsOfConnectionsNeedNoThreads) {
  auto server = start_echo_server();
  const int threads_before = num_threads();
  constexpr int kIdle = 1500, kHalfSent = 1500;
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < kIdle + kHalfSent; ++i) {
    clients.push_back(std::make_unique<TestClient>(server->port()));
    ASSERT_TRUE(clients.back()->connected()) << "client " << i;
    if (i >= kIdle) clients.back()->send_raw("GET /hello HTTP/1.1\r\nHost: t\r\n");
  }
  const auto start = Clock::now();
  TestClient probe(server->port());
  probe.send_raw(get_request("/hello"));
  EXPECT_EQ(probe.read_response().status, 200);
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_EQ(num_threads(), threads_before) << "threads grew with the connections";
  // Every connection is still open and served: finish the half-sent heads.
  for (int i = kIdle; i < kIdle + kHalfSent; i += 100) {
    clients[i]->send_raw("\r\n");
    EXPECT_EQ(clients[i]->read_response().status, 200) << "client " << i;
  }
}

TEST(HttpServerTest, UnfinishedHeadGets408AfterTheHeaderTimeout) {
  HttpServer::Options options = test_options();
  options.header_timeout_ms = 300;
  auto server = start_echo_server(options);
  constexpr int kHalfSent = 200;
  std::vector<std::unique_ptr<TestClient>> half_sent;
  const auto start = Clock::now();
  for (int i = 0; i < kHalfSent; ++i) {
    half_sent.push_back(std::make_unique<TestClient>(server->port()));
    half_sent.back()->send_raw("POST /echo HTTP/1.1\r\nContent-Length: 3\r\nX-Slow: ");
  }
  TestClient probe(server->port());  // not locked out meanwhile
  probe.send_raw(get_request("/hello"));
  EXPECT_EQ(probe.read_response().status, 200);
  for (auto& client : half_sent) {
    const std::string message =
        expect_openai_error(client->read_response(3000), 408, "RequestTimeoutError");
    EXPECT_NE(message.find("request head not received within 300 ms"), std::string::npos)
        << message;
    EXPECT_TRUE(client->closed_by_server());
  }
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
}

RequestParser test_parser() {
  return RequestParser(RequestParserLimits{1000, 4096});
}

TEST(RequestParserTest, ByteByByteFramingAndPipelining) {
  const std::string wire = "\r\nPOST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" +
                           std::string("POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") +
                           "2\r\nxy\r\n1;e=1\r\nz\r\n0\r\nT: 1\r\n\r\n" +
                           "GET /c HTTP/1.0\nX: y\n\n";
  RequestParser parser = test_parser();
  std::vector<HttpRequest> requests;
  std::vector<RequestParser::Stage> stages;
  for (char c : wire) {
    parser.feed(std::string_view(&c, 1));
    if (auto request = parser.parse()) requests.push_back(std::move(*request));
    if (stages.empty() || stages.back() != parser.stage()) stages.push_back(parser.stage());
  }
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].path, "/a");
  EXPECT_EQ(requests[0].body, "abc");
  EXPECT_EQ(requests[1].path, "/b");
  EXPECT_EQ(requests[1].body, "xyz");
  EXPECT_EQ(requests[2].path, "/c");
  EXPECT_EQ(requests[2].minor_version, 0);
  EXPECT_EQ(requests[2].headers.get_or("X", ""), "y");
  EXPECT_EQ(parser.unread_bytes(), 0u);
  using Stage = RequestParser::Stage;
  EXPECT_EQ(stages, (std::vector<Stage>{Stage::kIdle, Stage::kHead, Stage::kBody, Stage::kIdle,
                                        Stage::kHead, Stage::kBody, Stage::kIdle, Stage::kHead,
                                        Stage::kIdle}));

  // All at once: the same requests, one parse() each.
  RequestParser whole = test_parser();
  whole.feed(wire);
  for (const char* path : {"/a", "/b", "/c"}) {
    const auto request = whole.parse();
    ASSERT_TRUE(request.has_value()) << path;
    EXPECT_EQ(request->path, path);
  }
  EXPECT_FALSE(whole.parse().has_value());
}

TEST(RequestParserTest, ContinueAndLimits) {
  RequestParser parser = test_parser();
  parser.feed("POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_FALSE(parser.parse().has_value());
  EXPECT_TRUE(parser.take_continue());
  EXPECT_FALSE(parser.take_continue()) << "100 Continue is sent once";
  parser.feed("ok");
  EXPECT_EQ(parser.parse()->body, "ok");

  const auto status_of = [](const std::string& wire) {
    RequestParser p = test_parser();
    p.feed(wire);
    try {
      p.parse();
    } catch (const HttpError& e) {
      return e.status();
    }
    return 0;
  };
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nContent-Length: 1001\r\n\r\n"), 413);
  EXPECT_EQ(status_of("GET /a HTTP/1.1\r\nX: " + std::string(5000, 'x')), 431);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nExpect: magic\r\n\r\n"), 417);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n"), 413);
  EXPECT_EQ(status_of("GET /a HTTP/1.1\r\n\r\n"), 0);
}

TEST(HttpMessageTest, ParsesRequestHead) {
  const HttpRequest request = parse_request_head(
      "POST /v1/chat%2Fx?stream=true&q=a+b%26&flag HTTP/1.1\r\n"
      "Host: localhost\r\ncontent-TYPE:  application/json \r\nX-Dup: 1\nX-Dup: 2\r\n");
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.target, "/v1/chat%2Fx?stream=true&q=a+b%26&flag");
  EXPECT_EQ(request.path, "/v1/chat/x");
  EXPECT_EQ(request.minor_version, 1);
  EXPECT_EQ(request.query_param("stream"), "true");
  EXPECT_EQ(request.query_param("q"), "a b&");
  EXPECT_EQ(request.query_param("flag"), "");
  EXPECT_EQ(request.query_param("missing"), std::nullopt);
  EXPECT_EQ(request.headers.get("Content-Type"), "application/json");
  EXPECT_EQ(request.headers.get("x-dup"), "1");
  EXPECT_EQ(request.headers.get_all("X-DUP"), (std::vector<std::string_view>{"1", "2"}));
  EXPECT_FALSE(request.headers.has("Accept"));

  const HttpRequest absolute = parse_request_head("GET HTTP://host:8000/v1/models?x=1 HTTP/1.0\n");
  EXPECT_EQ(absolute.path, "/v1/models");
  EXPECT_EQ(absolute.query_param("x"), "1");
  EXPECT_EQ(absolute.minor_version, 0);
}

TEST(HttpMessageTest, RejectsMalformedHeads) {
  for (const char* head : {"", "GET\r\n", "GET / HTTP/1.1 x\r\n", "GET  / HTTP/1.1\r\n",
                           "GET / HTTP/11\r\n", "GET /\x01 HTTP/1.1\r\n",
                           "GET / HTTP/1.1\r\n: empty-name\r\n", "GET / HTTP/1.1\r\nA\x7f: b\r\n",
                           "GET / HTTP/1.1\r\nA: b\x01\r\n", "GET /%4 HTTP/1.1\r\n"}) {
    try {
      parse_request_head(head);
      ADD_FAILURE() << "accepted: " << head;
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status(), 400) << head;
    }
  }
}

TEST(HttpMessageTest, ChunkSizesAndChunks) {
  EXPECT_EQ(parse_chunk_size("0"), 0u);
  EXPECT_EQ(parse_chunk_size("1a"), 26u);
  EXPECT_EQ(parse_chunk_size("FF;name=value"), 255u);
  EXPECT_THROW(parse_chunk_size(""), HttpError);
  EXPECT_THROW(parse_chunk_size("g"), HttpError);
  EXPECT_THROW(parse_chunk_size("1234567890abcdef0"), HttpError);
  EXPECT_EQ(format_chunk("x"), "1\r\nx\r\n");
  EXPECT_EQ(format_chunk(std::string(300, 'y')), "12c\r\n" + std::string(300, 'y') + "\r\n");
  EXPECT_THROW(format_chunk(""), InvalidArgument);
}

TEST(HttpMessageTest, ResponseHeadAndErrorBody) {
  EXPECT_EQ(format_response_head(404, {{"A", "1"}}), "HTTP/1.1 404 Not Found\r\nA: 1\r\n\r\n");
  EXPECT_THROW(format_response_head(200, {{"A", "1\r\nInjected: 1"}}), InvalidArgument);
  EXPECT_EQ(nlohmann::json::parse(openai_error_body(400, "bad \"x\"")),
            nlohmann::json::parse(R"({"error": {"message": "bad \"x\"", "type": "BadRequestError",
                                                "param": null, "code": 400}})"));
  EXPECT_EQ(nlohmann::json::parse(openai_error_body(404, "m", "Custom"))["error"]["type"],
            "Custom");
  EXPECT_TRUE(header_has_token("keep-alive, Close", "close"));
  EXPECT_FALSE(header_has_token("closed", "close"));
}

}  // namespace
}  // namespace hyserve
