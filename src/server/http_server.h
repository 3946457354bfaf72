// The HTTP/1.1 server core the OpenAI layer plugs into: exact-path routing to handlers,
// keep-alive and pipelining, Content-Length and chunked request bodies, whole and chunked
// (SSE) responses, limits and timeouts, and a graceful stop. Written on POSIX sockets.
//
// Threading: one acceptor thread and one thread per connection, up to max_connections
// (beyond that a new connection gets 503 and is closed). A handler runs on its
// connection's thread and may block it for as long as it streams (minutes), which keeps a
// streaming handler a plain loop: wait for a token, write_chunk, repeat. Requests on one
// connection are answered in order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/http_message.h"

namespace hyserve {

// Writes the one response to one request, whole (send) or streamed (start_stream,
// write_chunk..., end_stream). Methods are called from the handler's thread, except
// client_disconnected(), which any thread may call while the handler runs. Made by the
// server; a test may make one on one end of a socketpair.
class HttpResponseWriter {
 public:
  // `keep_alive`: the request allows another request on this connection afterwards.
  HttpResponseWriter(int socket_fd, int request_minor_version, bool keep_alive);
  HttpResponseWriter(const HttpResponseWriter&) = delete;
  HttpResponseWriter& operator=(const HttpResponseWriter&) = delete;

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
  // Sends `data` as one chunk at once (empty data sends nothing). Returns false once the
  // client has disconnected or a write failed or timed out: the caller then cancels its
  // work and returns.
  bool write_chunk(std::string_view data);
  // Ends the chunked body. The server calls it if a handler returns without doing so.
  bool end_stream();
  // Ends a stream as failed: no last chunk and the connection closes, so the client sees a
  // truncated body. The server calls it when a handler throws after start_stream().
  void abort_stream();

  // Whether the peer has closed or reset the connection. Polls the socket without
  // consuming anything, so pipelined requests stay queued.
  bool client_disconnected() const;

  // A header every response of this writer carries, whole or streamed, error responses
  // included (CORS, X-Request-Id). Before the response starts.
  void add_header(std::string name, std::string value);

  // The status sent (0 before the response starts).
  int status() const { return status_; }
  // Whether send() or start_stream() was called.
  bool responded() const { return state_ != State::kIdle; }
  bool streaming() const { return state_ == State::kStreaming; }
  // Whether the connection may carry another request after this response.
  bool keeps_alive() const { return keep_alive_ && !failed_.load(); }
  // Forces Connection: close on the response not yet started (the server uses this while
  // stopping).
  void close_after_response() { keep_alive_ = false; }

 private:
  enum class State { kIdle, kStreaming, kDone };

  HttpHeaders base_headers(std::string_view content_type) const;
  bool write_all(std::string_view data);

  int fd_;
  int minor_version_;
  bool keep_alive_;
  HttpHeaders added_headers_;
  State state_ = State::kIdle;
  int status_ = 0;
  std::atomic<bool> failed_{false};  // a write failed: the peer is gone or stuck
};

// Answers one request through the writer. A handler that throws HttpError gets that status
// and message as an OpenAI error; any other exception gets 500 (and a log line on stderr);
// one that returns without responding gets 500. A throw after start_stream() cuts the stream
// short. A streaming handler must return soon after write_chunk() fails or
// client_disconnected() turns true: stop() joins its thread.
using HttpHandler = std::function<void(const HttpRequest&, HttpResponseWriter&)>;

// Runs on every request before routing, unknown paths included: it may add headers to the
// writer, or answer the request itself (then no route runs). Thrown errors are handled as a
// handler's.
using HttpMiddleware = HttpHandler;

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // a numeric address or a name: "0.0.0.0", "::", "localhost"
  int port = 8000;                 // 0: an ephemeral port, see HttpServer::port()
  std::size_t max_body_bytes = std::size_t{32} << 20;    // larger: 413
  std::size_t max_header_bytes = std::size_t{64} << 10;  // request line + headers; larger: 431
  int max_connections = 1024;    // connection threads; one more connection gets 503
  int idle_timeout_ms = 5000;    // keep-alive wait for the next request, then close (as vLLM)
  int read_timeout_ms = 60000;   // first byte to whole request; slower: 408 and close
  int write_timeout_ms = 60000;  // one blocked send; longer: the client counts as gone
  int drain_timeout_ms = 30000;  // stop(): how long in-flight requests may still run
};

class HttpServer {
 public:
  using Options = HttpServerOptions;
  using Handler = HttpHandler;

  explicit HttpServer(Options options = {});
  // Calls stop().
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers `handler` for exact `method` and `path` (no query). Before start() only.
  void route(std::string method, std::string path, Handler handler);
  // Sets the middleware (one; a later call replaces it). Before start() only.
  void use(HttpMiddleware middleware);
  // Called once per answered request, on its connection's thread, after the last byte:
  // the route's path ("none" when no route has it), the method, the status, the seconds
  // from dispatch to the end. Before start() only.
  using RequestObserver = std::function<void(const std::string& handler, const std::string& method,
                                             int status, double seconds)>;
  void observe(RequestObserver observer);

  // Binds, listens and starts accepting. Throws hyserve::Error naming host:port when the
  // address cannot be used (in use, not local, no permission).
  void start();
  // The bound port (the ephemeral one when Options::port was 0); valid after start().
  int port() const { return bound_port_; }

  // Stops accepting (new connections are refused), closes idle keep-alive connections,
  // lets in-flight requests finish for up to drain_timeout_ms, then shuts the remaining
  // sockets down (their handlers see client_disconnected()) and joins every thread.
  // Idempotent; safe from any thread except a handler's.
  void stop();
  // Blocks until stop() has finished.
  void wait();

 private:
  struct Connection;

  void accept_loop();
  // The connection thread: serve_connection, then close the socket and mark it done.
  void run_connection(Connection& connection);
  void serve_connection(Connection& connection);
  void dispatch(const HttpRequest& request, HttpResponseWriter& writer);
  // The route's handler, or the 404 / 405 answer.
  void route_request(const HttpRequest& request, HttpResponseWriter& writer);
  void reap_finished_connections(bool all);

  Options options_;
  // path -> method -> handler
  std::map<std::string, std::map<std::string, Handler, std::less<>>, std::less<>> routes_;
  HttpMiddleware middleware_;
  RequestObserver observer_;
  int listen_fd_ = -1;
  int stop_event_fd_ = -1;  // readable once stop() begins; wakes every poll
  int bound_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  std::mutex mutex_;  // guards connections_, the state flags below
  std::condition_variable changed_;
  std::vector<std::unique_ptr<Connection>> connections_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace hyserve
