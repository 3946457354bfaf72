// The HTTP/1.1 server core the OpenAI layer plugs into: exact-path routing to handlers,
// keep-alive and pipelining, Content-Length and chunked request bodies, whole and chunked
// (SSE) responses, limits and timeouts, a connection cap, and a graceful stop. Event-driven
// on Boost.Asio (header-only; kept out of this header): every socket is non-blocking and
// served by a small fixed pool of I/O threads, so an idle keep-alive connection or an open
// stream costs a socket and a few hundred bytes, not a thread.
//
// Threading: `num_io_threads` threads run one io_context. Each connection's work (reading,
// parsing, dispatching, writing, its timers, the callbacks its handlers post) runs on the
// connection's strand, so a connection is single-threaded while connections run in
// parallel. A handler runs there and must not block: it answers at once, or keeps a copy of
// its writer and answers later (a callback posted through HttpResponseWriter::post, or any
// other thread). Requests on one connection are answered in order, one at a time.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "server/http_message.h"
#include "server/http_response.h"

namespace hyserve {

// Answers one request through the writer. A handler that throws HttpError gets that status
// and message as an OpenAI error; any other exception gets 500 (and a log line on stderr).
// A throw after start_stream() cuts the stream short. A handler that returns without
// responding and keeps no copy of the writer gets 500; one that keeps a copy answers
// through it later (the response completes when the last copy goes, see
// HttpResponseWriter).
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
  int max_connections = 65536;    // open connections; one more gets 503 and is closed
  int idle_timeout_ms = 5000;     // keep-alive wait for the next request, then close (as vLLM)
  int header_timeout_ms = 10000;  // first byte to the end of the head; slower: 408 and close
  int read_timeout_ms = 60000;    // first byte to the whole request (body included); 408
  int write_timeout_ms = 60000;   // one pending write; longer: the client counts as gone
  int drain_timeout_ms = 30000;   // stop(): how long in-flight requests may still run
  int num_io_threads = 0;         // 0: hardware_concurrency, clamped to [2, 4]
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
  // Called once per answered request, on its connection's strand, after the last byte (or
  // once the connection is gone): the route's path ("none" when no route has it), the
  // method, the status, the seconds from dispatch to the end. Before start() only.
  using RequestObserver = std::function<void(const std::string& handler, const std::string& method,
                                             int status, double seconds)>;
  void observe(RequestObserver observer);

  // Raises the open-file soft limit to the hard limit (a log line when that is still below
  // max_connections), binds, listens and starts the I/O threads. Throws hyserve::Error
  // naming host:port when the address cannot be used (in use, not local, no permission).
  void start();
  // The bound port (the ephemeral one when Options::port was 0); valid after start().
  int port() const;

  // Stops accepting (new connections are refused), closes idle keep-alive connections,
  // lets in-flight requests finish for up to drain_timeout_ms, then closes the remaining
  // connections (their handlers' on_disconnect callbacks run, client_disconnected() turns
  // true) and joins the I/O threads. Idempotent; safe from any thread except an I/O
  // thread. Writers that handlers still hold afterwards write nowhere.
  void stop();
  // Blocks until stop() has finished.
  void wait();

 private:
  struct Core;  // the Asio side (http_server.cpp)
  friend class HttpConnection;

  // Middleware, route, errors: answers `request` through `writer` (on the strand).
  void dispatch(const HttpRequest& request, HttpResponseWriter& writer);
  // The route's handler, or the 404 / 405 answer.
  void route_request(const HttpRequest& request, HttpResponseWriter& writer);
  // The observer's name for the route `path`: itself when registered, else "none".
  std::string route_name(const std::string& path) const;

  Options options_;
  // path -> method -> handler
  std::map<std::string, std::map<std::string, Handler, std::less<>>, std::less<>> routes_;
  HttpMiddleware middleware_;
  RequestObserver observer_;
  std::unique_ptr<Core> core_;
};

}  // namespace hyserve
