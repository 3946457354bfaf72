// HttpServer over real sockets on 127.0.0.1 (ephemeral ports), driven by the plain-socket
// client of http_test_client.h: routing, keep-alive and pipelining, the limits and timeouts,
// middleware, errors, stop and the connection cap. Handlers run on the server's I/O threads
// and must not block: the slow ones here hand their writer to a Workers thread. Streaming is
// in http_server_streaming_test.cpp; the wire format, parser and writer have their own tests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http_test_client.h"
#include "server/http_message.h"
#include "server/http_server.h"

namespace hyserve {
namespace {

using namespace test;

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

}  // namespace
}  // namespace hyserve
