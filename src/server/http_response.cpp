#include "server/http_response.h"

#include <ctime>
#include <mutex>
#include <utility>

#include "util/log.h"

namespace hyserve {
namespace {

std::string http_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[64];
  const std::size_t n = std::strftime(text, sizeof(text), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(text, n);
}

}  // namespace

// The response shared by a writer's copies; every method runs under `mutex`.
struct HttpResponseWriter::State {
  enum class Stage { kIdle, kStreaming, kDone };

  State(std::shared_ptr<ResponseSink> s, int minor, bool keep)
      : sink(std::move(s)), minor_version(minor), keep_alive(keep) {}
  // The last copy is gone: complete the response the handler left open.
  ~State() {
    try {
      if (stage == Stage::kIdle) {
        send_locked(500, "application/json",
                    openai_error_body(500, "Internal server error: the handler sent no response"),
                    {});
      } else if (stage == Stage::kStreaming) {
        end_locked();
      }
    } catch (const std::exception& e) {
      log::error("completing a response failed: {}", e.what());
    }
  }

  HttpHeaders base_headers(std::string_view content_type) const {
    HttpHeaders headers{{"Date", http_date()}, {"Server", "hyserve"}};
    if (!content_type.empty()) headers.add("Content-Type", std::string(content_type));
    if (!keep_alive) {
      headers.add("Connection", "close");
    } else if (minor_version == 0) {
      headers.add("Connection", "keep-alive");
    }
    for (const auto& [name, value] : added_headers.fields()) headers.add(name, value);
    return headers;
  }

  bool ok() const { return !failed && !sink->disconnected(); }

  bool send_locked(int s, std::string_view content_type, std::string_view body,
                   const HttpHeaders& extra_headers) {
    CHECK(stage == Stage::kIdle, "a response was already started for this request");
    stage = Stage::kDone;
    status = s;
    HttpHeaders headers = base_headers(content_type);
    headers.add("Content-Length", std::to_string(body.size()));
    for (const auto& [name, value] : extra_headers.fields()) headers.add(name, value);
    std::string message = format_response_head(s, headers);
    message += body;
    const bool sent = ok();
    sink->write(std::move(message));
    sink->finish(status, keep_alive && sent);
    return sent;
  }

  bool end_locked() {
    CHECK(stage == Stage::kStreaming, "end_stream without start_stream");
    stage = Stage::kDone;
    if (minor_version >= 1) sink->write(std::string(kLastChunk));
    const bool sent = ok();
    sink->finish(status, keep_alive && sent);
    return sent;
  }

  std::mutex mutex;
  std::shared_ptr<ResponseSink> sink;
  int minor_version;
  bool keep_alive;
  HttpHeaders added_headers;
  Stage stage = Stage::kIdle;
  int status = 0;
  bool failed = false;  // aborted, or a write found the client gone
};

HttpResponseWriter::HttpResponseWriter(std::shared_ptr<ResponseSink> sink,
                                       int request_minor_version, bool keep_alive)
    : state_(std::make_shared<State>(std::move(sink), request_minor_version, keep_alive)) {}

void HttpResponseWriter::add_header(std::string name, std::string value) {
  std::lock_guard lock(state_->mutex);
  CHECK(state_->stage == State::Stage::kIdle, "add_header after the response started: ", name);
  state_->added_headers.add(std::move(name), std::move(value));
}

bool HttpResponseWriter::send(int status, std::string_view content_type, std::string_view body,
                              const HttpHeaders& extra_headers) {
  std::lock_guard lock(state_->mutex);
  return state_->send_locked(status, content_type, body, extra_headers);
}

bool HttpResponseWriter::send_error(int status, std::string_view message) {
  return send(status, "application/json", openai_error_body(status, message));
}

bool HttpResponseWriter::start_stream(int status, std::string_view content_type,
                                      const HttpHeaders& extra_headers) {
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  CHECK(s.stage == State::Stage::kIdle, "a response was already started for this request");
  s.stage = State::Stage::kStreaming;
  s.status = status;
  if (s.minor_version == 0) s.keep_alive = false;  // HTTP/1.0: the body ends at close
  HttpHeaders headers = s.base_headers(content_type);
  if (s.minor_version >= 1) headers.add("Transfer-Encoding", "chunked");
  if (content_type.starts_with("text/event-stream") && !extra_headers.has("Cache-Control"))
    headers.add("Cache-Control", "no-cache");
  for (const auto& [name, value] : extra_headers.fields()) headers.add(name, value);
  s.sink->write(format_response_head(status, headers));
  return s.ok();
}

bool HttpResponseWriter::write_chunk(std::string_view data) {
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  CHECK(s.stage == State::Stage::kStreaming, "write_chunk outside start_stream .. end_stream");
  if (!s.ok()) {
    s.failed = true;
    return false;
  }
  if (data.empty()) return true;
  s.sink->write(s.minor_version >= 1 ? format_chunk(data) : std::string(data));
  return true;
}

bool HttpResponseWriter::end_stream() {
  std::lock_guard lock(state_->mutex);
  return state_->end_locked();
}

void HttpResponseWriter::abort_stream() {
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  CHECK(s.stage == State::Stage::kStreaming, "abort_stream without start_stream");
  s.stage = State::Stage::kDone;
  s.failed = true;
  s.sink->finish(s.status, false);
}

bool HttpResponseWriter::client_disconnected() const {
  std::lock_guard lock(state_->mutex);
  return !state_->ok();
}

void HttpResponseWriter::on_disconnect(std::function<void()> callback) {
  state_->sink->on_disconnect(std::move(callback));
}

void HttpResponseWriter::post(std::function<void()> work) {
  state_->sink->post(std::move(work));
}

int HttpResponseWriter::status() const {
  std::lock_guard lock(state_->mutex);
  return state_->status;
}

bool HttpResponseWriter::responded() const {
  std::lock_guard lock(state_->mutex);
  return state_->stage != State::Stage::kIdle;
}

bool HttpResponseWriter::streaming() const {
  std::lock_guard lock(state_->mutex);
  return state_->stage == State::Stage::kStreaming;
}

bool HttpResponseWriter::keeps_alive() const {
  std::lock_guard lock(state_->mutex);
  return state_->keep_alive && state_->ok();
}

void HttpResponseWriter::close_after_response() {
  std::lock_guard lock(state_->mutex);
  state_->keep_alive = false;
}

}  // namespace hyserve
