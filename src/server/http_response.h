// HttpResponseWriter: the one response to one request, whole (send) or streamed
// (start_stream, write_chunk..., end_stream), framed as HTTP/1.1 bytes and handed to a
// ResponseSink, which writes them asynchronously (the server's connection) or collects
// them (a test). Nothing here waits for the network: every call returns at once.
//
// A writer is a handle: copies share the response, any thread may use one (calls are
// serialized), and a handler keeps a copy to answer later, from a callback or another
// thread. When the last copy goes away the response is completed for the handler: one
// that never responded gets 500, an open stream is ended.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "server/http_message.h"

namespace hyserve {

// Where a response's bytes go: one connection. Methods may be called from any thread.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Queues bytes for the client, in call order.
  virtual void write(std::string bytes) = 0;
  // The response is complete: `status` as sent; `keep_alive`: the connection may carry
  // another request.
  virtual void finish(int status, bool keep_alive) = 0;
  // Whether the client has gone (closed, reset, a write failed or timed out).
  virtual bool disconnected() const = 0;
  // Runs `callback` once, on the connection's executor, when the client goes away before
  // the response is complete (at once, there, if it already has). Dropped unrun otherwise.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  // Runs `work` on the connection's executor (serialized with its I/O and callbacks).
  virtual void post(std::function<void()> work) = 0;
};

class HttpResponseWriter {
 public:
  // `keep_alive`: the request allows another request on this connection afterwards.
  HttpResponseWriter(std::shared_ptr<ResponseSink> sink, int request_minor_version,
                     bool keep_alive);

  // A whole response with Content-Length. Returns false if the client is gone.
  bool send(int status, std::string_view content_type, std::string_view body,
            const HttpHeaders& extra_headers = {});
  // send() with openai_error_body(status, message) as an application/json body.
  bool send_error(int status, std::string_view message);

  // Starts a Transfer-Encoding: chunked response (for an HTTP/1.0 client: a body that ends
  // when the connection closes). A text/event-stream response also gets
  // Cache-Control: no-cache unless extra_headers set it.
  bool start_stream(int status, std::string_view content_type,
                    const HttpHeaders& extra_headers = {});
  // Queues `data` as one chunk (empty data sends nothing). Returns false once the client
  // has disconnected or a write failed or timed out: the caller then cancels its work.
  bool write_chunk(std::string_view data);
  // Ends the chunked body. Done for the handler when the last copy of the writer goes.
  bool end_stream();
  // Ends a stream as failed: no last chunk and the connection closes, so the client sees a
  // truncated body. The server calls it when a handler throws after start_stream().
  void abort_stream();

  // Whether the client has gone (peer closed or reset, a write failed or timed out).
  bool client_disconnected() const;
  // Runs `callback` once, on the connection's executor, as soon as the client goes away
  // before the response is complete (a handler cancels its work there).
  void on_disconnect(std::function<void()> callback);
  // Runs `work` on the connection's executor: where a handler's callbacks continue the
  // response (serialized with on_disconnect callbacks).
  void post(std::function<void()> work);

  // A header every response of this writer carries, whole or streamed, error responses
  // included (CORS, X-Request-Id). Before the response starts.
  void add_header(std::string name, std::string value);

  // The status sent (0 before the response starts).
  int status() const;
  // Whether send() or start_stream() was called.
  bool responded() const;
  bool streaming() const;
  // Whether the connection may carry another request after this response.
  bool keeps_alive() const;
  // Forces Connection: close on the response not yet started (the server uses this while
  // stopping).
  void close_after_response();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace hyserve
