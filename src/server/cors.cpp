// CORS preflights and response headers; see cors.h.
#include "server/cors.h"

#include <algorithm>
#include <optional>
#include <string_view>

namespace hyserve {
namespace {

// Starlette's ALL_METHODS and the CORS-safelisted request headers (always allowed).
const std::vector<std::string> kAllMethods = {"DELETE", "GET",  "HEAD", "OPTIONS",
                                              "PATCH",  "POST", "PUT"};
const std::vector<std::string> kSafelistedHeaders = {"accept", "accept-language",
                                                     "content-language", "content-type"};
constexpr const char* kMaxAgeSeconds = "600";

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string join(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& item : list) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

CorsPolicy::CorsPolicy(CorsOptions options)
    : options_(std::move(options)),
      all_origins_(contains(options_.allowed_origins, "*")),
      all_headers_(contains(options_.allowed_headers, "*")),
      methods_(contains(options_.allowed_methods, "*") ? kAllMethods : options_.allowed_methods),
      headers_(kSafelistedHeaders) {
  for (const std::string& h : options_.allowed_headers)
    if (h != "*" && !contains(headers_, lower(h))) headers_.push_back(lower(h));
  std::sort(headers_.begin(), headers_.end());
}

bool CorsPolicy::is_preflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && request.headers.has("Origin") &&
         request.headers.has("Access-Control-Request-Method");
}

bool CorsPolicy::origin_allowed(std::string_view origin) const {
  return all_origins_ || contains(options_.allowed_origins, origin);
}

bool CorsPolicy::echoes_origin(const HttpRequest& request) const {
  return !all_origins_ || options_.allow_credentials || request.headers.has("Cookie");
}

CorsPreflight CorsPolicy::preflight(const HttpRequest& request) const {
  const std::string origin(*request.headers.get("Origin"));
  const std::string_view method = *request.headers.get("Access-Control-Request-Method");
  const std::optional<std::string_view> requested =
      request.headers.get("Access-Control-Request-Headers");

  CorsPreflight out;
  std::vector<std::string> failures;
  const bool explicit_origin = !all_origins_ || options_.allow_credentials;
  if (!origin_allowed(origin)) {
    failures.push_back("origin");
  } else {
    out.headers.add("Access-Control-Allow-Origin", explicit_origin ? origin : "*");
  }
  if (explicit_origin) out.headers.add("Vary", "Origin");
  if (!contains(methods_, method)) failures.push_back("method");
  out.headers.add("Access-Control-Allow-Methods", join(methods_));
  out.headers.add("Access-Control-Max-Age", kMaxAgeSeconds);
  if (all_headers_) {
    if (requested) out.headers.add("Access-Control-Allow-Headers", std::string(*requested));
  } else {
    out.headers.add("Access-Control-Allow-Headers", join(headers_));
    std::string_view rest = requested.value_or("");
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string header = lower(trim(rest.substr(0, comma)));
      rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
      if (!header.empty() && !contains(headers_, header)) {
        failures.push_back("headers");
        break;
      }
    }
  }
  if (options_.allow_credentials) out.headers.add("Access-Control-Allow-Credentials", "true");
  if (failures.empty()) {
    out.body = "OK";
  } else {
    out.status = 400;
    out.body = "Disallowed CORS " + join(failures);
  }
  return out;
}

HttpHeaders CorsPolicy::response_headers(const HttpRequest& request) const {
  HttpHeaders headers;
  const auto origin = request.headers.get("Origin");
  if (!origin || !origin_allowed(*origin)) return headers;
  if (echoes_origin(request)) {
    headers.add("Access-Control-Allow-Origin", std::string(*origin));
    headers.add("Vary", "Origin");
  } else {
    headers.add("Access-Control-Allow-Origin", "*");
  }
  if (options_.allow_credentials) headers.add("Access-Control-Allow-Credentials", "true");
  return headers;
}

}  // namespace hyserve
