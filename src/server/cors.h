// CORS as vLLM's server applies it (Starlette's CORSMiddleware with --allowed-origins,
// --allowed-methods, --allowed-headers, --allow-credentials, each defaulting to ["*"]):
// a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, on
// any path, before routing; an ordinary request with an Origin gets
// Access-Control-Allow-Origin (and -Credentials) on its response. A request without an
// Origin header is not a CORS request and gets nothing. Pure: tested on requests.
#pragma once

#include <string>
#include <vector>

#include "server/http_message.h"

namespace hyserve {

struct CorsOptions {
  std::vector<std::string> allowed_origins = {"*"};  // exact origins, or "*"
  std::vector<std::string> allowed_methods = {"*"};  // "*": every method
  std::vector<std::string> allowed_headers = {"*"};  // case-insensitive; "*": any
  bool allow_credentials = false;
};

// The answer to a preflight: 200 "OK" when the origin, the method and every requested header
// are allowed, else 400 "Disallowed CORS origin, method, headers" (the failing parts).
struct CorsPreflight {
  int status = 200;
  std::string body;
  HttpHeaders headers;
};

class CorsPolicy {
 public:
  explicit CorsPolicy(CorsOptions options = {});

  // OPTIONS with Origin and Access-Control-Request-Method.
  static bool is_preflight(const HttpRequest& request);
  CorsPreflight preflight(const HttpRequest& request) const;
  // The headers a response to `request` carries: none without an Origin header;
  // Access-Control-Allow-Origin "*", or the origin itself (with Vary: Origin) when origins
  // are listed, credentials are allowed or the request sends cookies.
  HttpHeaders response_headers(const HttpRequest& request) const;

 private:
  bool origin_allowed(std::string_view origin) const;
  // The origin echoed back instead of "*" (a browser refuses "*" with credentials).
  bool echoes_origin(const HttpRequest& request) const;

  CorsOptions options_;
  bool all_origins_ = false;
  bool all_headers_ = false;
  std::vector<std::string> methods_;  // "*" expanded
  std::vector<std::string> headers_;  // lower case, with the CORS-safelisted ones
};

}  // namespace hyserve
