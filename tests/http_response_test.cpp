// HttpResponseWriter over a sink that records the bytes: framing and the handle's lifetime.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "server/http_response.h"

namespace hyserve {
namespace {

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

}  // namespace
}  // namespace hyserve
