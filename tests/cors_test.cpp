// CORS middleware (server/cors.h): preflight and simple requests, defaults and lists.
#include <gtest/gtest.h>

#include <string>

#include "server/cors.h"
#include "server/http_message.h"

namespace hyserve {
namespace {

HttpRequest cors_request(std::string method, HttpHeaders headers) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = "/v1/chat/completions";
  r.headers = std::move(headers);
  return r;
}

TEST(CorsTest, DefaultsAllowEverything) {
  const CorsPolicy cors;
  const HttpRequest pre = cors_request("OPTIONS", {{"Origin", "https://a.example"},
                                                   {"Access-Control-Request-Method", "POST"},
                                                   {"Access-Control-Request-Headers", "X-Any"}});
  ASSERT_TRUE(CorsPolicy::is_preflight(pre));
  const CorsPreflight p = cors.preflight(pre);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "OK");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Origin", ""), "*");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Methods", ""),
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(p.headers.get_or("Access-Control-Allow-Headers", ""), "X-Any");
  EXPECT_EQ(p.headers.get_or("Access-Control-Max-Age", ""), "600");
  EXPECT_FALSE(p.headers.has("Access-Control-Allow-Credentials"));
  EXPECT_FALSE(p.headers.has("Vary"));
  // Not preflights: no Origin, or no requested method.
  EXPECT_FALSE(CorsPolicy::is_preflight(cors_request("OPTIONS", {})));
  EXPECT_FALSE(CorsPolicy::is_preflight(cors_request("OPTIONS", {{"Origin", "x"}})));
  EXPECT_FALSE(CorsPolicy::is_preflight(
      cors_request("GET", {{"Origin", "x"}, {"Access-Control-Request-Method", "GET"}})));

  const HttpHeaders simple = cors.response_headers(cors_request("GET", {{"Origin", "https://a"}}));
  EXPECT_EQ(simple.get_or("Access-Control-Allow-Origin", ""), "*");
  EXPECT_TRUE(cors.response_headers(cors_request("GET", {})).empty());
  // With cookies the origin itself is named ("*" does not cover credentialed requests).
  const HttpHeaders cookie =
      cors.response_headers(cors_request("GET", {{"Origin", "https://a"}, {"Cookie", "c=1"}}));
  EXPECT_EQ(cookie.get_or("Access-Control-Allow-Origin", ""), "https://a");
  EXPECT_EQ(cookie.get_or("Vary", ""), "Origin");
}

TEST(CorsTest, ListedOriginsMethodsHeadersAndCredentials) {
  CorsOptions options;
  options.allowed_origins = {"https://good.example"};
  options.allowed_methods = {"GET", "POST"};
  options.allowed_headers = {"Authorization"};
  options.allow_credentials = true;
  const CorsPolicy cors(options);
  const auto preflight = [&](std::string origin, std::string method, std::string headers) {
    HttpHeaders h{{"Origin", std::move(origin)}, {"Access-Control-Request-Method", method}};
    if (!headers.empty()) h.add("Access-Control-Request-Headers", std::move(headers));
    return cors.preflight(cors_request("OPTIONS", std::move(h)));
  };
  const CorsPreflight ok = preflight("https://good.example", "POST", "authorization, Content-Type");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Origin", ""), "https://good.example");
  EXPECT_EQ(ok.headers.get_or("Vary", ""), "Origin");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Methods", ""), "GET, POST");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Headers", ""),
            "accept, accept-language, authorization, content-language, content-type");
  EXPECT_EQ(ok.headers.get_or("Access-Control-Allow-Credentials", ""), "true");

  EXPECT_EQ(preflight("https://evil.example", "POST", "").body, "Disallowed CORS origin");
  EXPECT_FALSE(
      preflight("https://evil.example", "POST", "").headers.has("Access-Control-Allow-Origin"));
  EXPECT_EQ(preflight("https://good.example", "DELETE", "").body, "Disallowed CORS method");
  const CorsPreflight bad = preflight("https://evil.example", "PUT", "X-Secret");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body, "Disallowed CORS origin, method, headers");

  const HttpHeaders good =
      cors.response_headers(cors_request("POST", {{"Origin", "https://good.example"}}));
  EXPECT_EQ(good.get_or("Access-Control-Allow-Origin", ""), "https://good.example");
  EXPECT_EQ(good.get_or("Access-Control-Allow-Credentials", ""), "true");
  EXPECT_TRUE(
      cors.response_headers(cors_request("POST", {{"Origin", "https://evil.example"}})).empty());
}

}  // namespace
}  // namespace hyserve
