// Runs a serving benchmark against a server over HTTP/1.1: every request streamed on its own
// connection (Connection: close), sent at its arrival time (arrival_schedule.h) once fewer
// than max_concurrency requests are in flight, all on one thread and one Boost.Asio
// io_context (Asio is kept out of this header). A request that fails (cannot connect, times
// out, a status other than 200, an error event, malformed framing or SSE) becomes a failed
// RequestOutcome with its reason; nothing a server sends stops the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/arrival_schedule.h"
#include "client/bench_dataset.h"
#include "client/bench_metrics.h"
#include "client/openai_stream.h"

namespace hyserve::client {

// "http://host:port[/prefix]": https is refused (InvalidArgument), the port defaults to 80.
struct BaseUrl {
  std::string host;
  std::string port;
  std::string path_prefix;  // without a trailing '/', may be empty
};
BaseUrl parse_base_url(const std::string& url);

struct BenchRunOptions {
  BaseUrl base_url;
  std::string endpoint = "/v1/completions";
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  OpenAIRequestOptions request;
  ArrivalOptions arrivals;
  std::optional<int64_t> max_concurrency;
  double request_timeout_s = 6 * 3600.0;  // a request's connect-to-end limit (vLLM's 6 h)
  bool show_progress = false;             // a progress line on stderr
};

struct BenchRunResult {
  std::vector<RequestOutcome> outcomes;  // in the order of the requests
  double duration_s = 0;                 // first send to last completion
};

BenchRunResult run_benchmark(const std::vector<BenchRequest>& requests,
                             const BenchRunOptions& options);

// GET base_url + path; the body of a 200 response, else nullopt (any failure).
std::optional<std::string> http_get(const BaseUrl& base_url, const std::string& path,
                                    double timeout_s);

// A whole HTTP exchange's result: the status and body, or error (empty when it arrived).
struct HttpReply {
  int status = 0;
  std::string body;
  std::string error;
};
// POST base_url + path with a JSON body (blocking, up to timeout_s).
HttpReply http_post_json(const BaseUrl& base_url, const std::string& path, const std::string& body,
                         double timeout_s);

}  // namespace hyserve::client
