// HttpServer streaming over real sockets: chunks in order, a client leaving mid-stream or
// while its handler waits, and hundreds of concurrent streams.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "http_test_client.h"

namespace hyserve {
namespace {

using namespace test;

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

}  // namespace
}  // namespace hyserve
