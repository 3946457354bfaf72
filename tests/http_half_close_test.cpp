// A client that half-closes (shutdown(SHUT_WR)) after its request still gets the response
// (issue 49): EOF only means no more requests on the connection. The request in flight runs
// to its end, whole or streamed, then the server closes; only a reset (or a failed write)
// is the client gone. A client that closed entirely is told from one that half-closed by
// the reset its kernel answers data with (a 100 Continue while the response has not begun). Over
// loopback, against the HTTP server core and the real OpenAI server on the bundled model (it
// answered 500 "the handler sent no response" before).
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "http_test_client.h"
#include "tiny_openai_server.h"

namespace hyserve {
namespace {

using nlohmann::json;
using namespace test;

// The final response, past the interim 100 Continue the server sends after a FIN while
// nothing of the response is out (a client that closed entirely answers it with a reset).
TestResponse read_final_response(TestClient& client, int timeout_ms = 5000) {
  TestResponse response = client.read_response(timeout_ms);
  while (response.status == 100) response = client.read_response(timeout_ms);
  return response;
}

// A handler that answers later, from another thread, unless the client goes first; then
// it drops the response, as a generation does (GenerationRun::cancel).
struct LaterServer {
  HttpServer server{test_options()};
  Workers workers;
  std::atomic<int> num_disconnects{0};

  LaterServer() {
    server.route("POST", "/later", [this](const HttpRequest& request, HttpResponseWriter& writer) {
      writer.on_disconnect([this] { ++num_disconnects; });
      workers.spawn([this, writer, body = request.body]() mutable {
        for (int i = 0; i < 20; ++i) {  // 200 ms of work
          if (writer.client_disconnected()) return;
          std::this_thread::sleep_for(milliseconds(10));
        }
        writer.send(200, "text/plain", "done: " + body);
      });
    });
    server.start();
  }
  ~LaterServer() {
    server.stop();
    workers.join();
  }
};

TEST(HttpHalfClose, ResponseIsWrittenAfterTheClientsFin) {
  LaterServer later;
  TestClient client(later.server.port());
  client.send_raw(post_request("/later", "payload"));
  client.shutdown_send();
  const TestResponse response = read_final_response(client);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "done: payload");
  EXPECT_TRUE(client.closed_by_server());  // nothing more can come: the server closes
  EXPECT_EQ(later.num_disconnects.load(), 0);
}

TEST(HttpHalfClose, PipelinedRequestsBeforeTheFinAreAllAnswered) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(post_request("/echo", "first") + post_request("/echo", "second"));
  client.shutdown_send();
  EXPECT_EQ(read_final_response(client).body, "first");
  EXPECT_EQ(read_final_response(client).body, "second");
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpHalfClose, StreamGoesOnAfterTheClientsFin) {
  auto server = start_echo_server();
  TestClient client(server->port());
  client.send_raw(get_request("/stream?n=20&sleep_ms=10"));
  client.shutdown_send();
  const TestResponse response = read_final_response(client);
  ASSERT_EQ(response.status, 200);
  ASSERT_EQ(response.chunks.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(response.chunks[i], str_cat("data: ", i, "\n\n"));
  EXPECT_TRUE(client.closed_by_server());
}

// A client that half-closes and then resets has gone: the handler hears of it without
// writing anything.
TEST(HttpHalfClose, ResetAfterTheFinIsADisconnect) {
  HttpServer server(test_options());
  Workers workers;
  std::promise<bool> seen;
  std::promise<void> callback_ran;
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
  server.start();
  TestClient client(server.port());
  client.send_raw(post_request("/wait", "x"));
  client.shutdown_send();
  std::this_thread::sleep_for(milliseconds(100));  // the server has seen the FIN
  client.reset_now();
  auto result = seen.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_TRUE(result.get());
  EXPECT_EQ(callback_ran.get_future().wait_for(std::chrono::seconds(2)), std::future_status::ready);
  server.stop();
}

std::string completion_request(bool stream) {
  return json{{"model", TinyOpenAIServer::kModelName},
              {"prompt", "The quick brown fox"},
              {"max_tokens", 16},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", stream}}
      .dump();
}

TEST(HttpHalfClose, CompletionIsAnsweredAfterTheClientsFin) {
  TinyOpenAIServer server;
  TestClient client(server.port());
  client.send_raw(json_post("/v1/completions", completion_request(false)));
  client.shutdown_send();
  const TestResponse response = read_final_response(client, 30000);
  ASSERT_EQ(response.status, 200) << response.body;
  const json body = json::parse(response.body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << response.body;
  EXPECT_EQ(body.at("object"), "text_completion");
  ASSERT_EQ(body.at("choices").size(), 1u);
  EXPECT_EQ(body.at("choices")[0].at("finish_reason"), "length");
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 16);
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpHalfClose, StreamedCompletionRunsToDoneAfterTheClientsFin) {
  TinyOpenAIServer server;
  TestClient client(server.port());
  client.send_raw(json_post("/v1/completions", completion_request(true)));
  client.shutdown_send();
  const TestResponse response = read_final_response(client, 30000);
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(response.headers.get_or("Content-Type", ""), "text/event-stream");
  // Every event through [DONE]: each a JSON chunk, 16 tokens, the last one finished.
  const std::string done(kSseDone);
  ASSERT_GE(response.body.size(), done.size());
  EXPECT_EQ(response.body.substr(response.body.size() - done.size()), done) << response.body;
  int num_events = 0;
  std::string text, finish_reason;
  std::size_t at = 0;
  while (at < response.body.size() - done.size()) {
    ASSERT_EQ(response.body.compare(at, 6, "data: "), 0) << response.body.substr(at);
    const std::size_t end = response.body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    const json chunk = json::parse(response.body.substr(at + 6, end - at - 6), nullptr, false);
    ASSERT_FALSE(chunk.is_discarded()) << response.body.substr(at, end - at);
    ASSERT_EQ(chunk.at("choices").size(), 1u);
    text += chunk.at("choices")[0].at("text").get<std::string>();
    if (!chunk.at("choices")[0].at("finish_reason").is_null())
      finish_reason = chunk.at("choices")[0].at("finish_reason").get<std::string>();
    ++num_events;
    at = end + 2;
  }
  EXPECT_GE(num_events, 1);
  EXPECT_EQ(finish_reason, "length");
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(client.closed_by_server());
}

}  // namespace
}  // namespace hyserve
