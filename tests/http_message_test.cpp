// The wire-format functions of http_message.h: request heads, chunks, response heads.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/http_message.h"

namespace hyserve {
namespace {

TEST(HttpMessageTest, ParsesRequestHead) {
  const HttpRequest request = parse_request_head(
      "POST /v1/chat%2Fx?stream=true&q=a+b%26&flag HTTP/1.1\r\n"
      "Host: localhost\r\ncontent-TYPE:  application/json \r\nX-Dup: 1\nX-Dup: 2\r\n");
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.target, "/v1/chat%2Fx?stream=true&q=a+b%26&flag");
  EXPECT_EQ(request.path, "/v1/chat/x");
  EXPECT_EQ(request.minor_version, 1);
  EXPECT_EQ(request.query_param("stream"), "true");
  EXPECT_EQ(request.query_param("q"), "a b&");
  EXPECT_EQ(request.query_param("flag"), "");
  EXPECT_EQ(request.query_param("missing"), std::nullopt);
  EXPECT_EQ(request.headers.get("Content-Type"), "application/json");
  EXPECT_EQ(request.headers.get("x-dup"), "1");
  EXPECT_EQ(request.headers.get_all("X-DUP"), (std::vector<std::string_view>{"1", "2"}));
  EXPECT_FALSE(request.headers.has("Accept"));

  const HttpRequest absolute = parse_request_head("GET HTTP://host:8000/v1/models?x=1 HTTP/1.0\n");
  EXPECT_EQ(absolute.path, "/v1/models");
  EXPECT_EQ(absolute.query_param("x"), "1");
  EXPECT_EQ(absolute.minor_version, 0);
}

TEST(HttpMessageTest, RejectsMalformedHeads) {
  for (const char* head : {"", "GET\r\n", "GET / HTTP/1.1 x\r\n", "GET  / HTTP/1.1\r\n",
                           "GET / HTTP/11\r\n", "GET /\x01 HTTP/1.1\r\n",
                           "GET / HTTP/1.1\r\n: empty-name\r\n", "GET / HTTP/1.1\r\nA\x7f: b\r\n",
                           "GET / HTTP/1.1\r\nA: b\x01\r\n", "GET /%4 HTTP/1.1\r\n"}) {
    try {
      parse_request_head(head);
      ADD_FAILURE() << "accepted: " << head;
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status(), 400) << head;
    }
  }
}

TEST(HttpMessageTest, ChunkSizesAndChunks) {
  EXPECT_EQ(parse_chunk_size("0"), 0u);
  EXPECT_EQ(parse_chunk_size("1a"), 26u);
  EXPECT_EQ(parse_chunk_size("FF;name=value"), 255u);
  EXPECT_THROW(parse_chunk_size(""), HttpError);
  EXPECT_THROW(parse_chunk_size("g"), HttpError);
  EXPECT_THROW(parse_chunk_size("1234567890abcdef0"), HttpError);
  EXPECT_EQ(format_chunk("x"), "1\r\nx\r\n");
  EXPECT_EQ(format_chunk(std::string(300, 'y')), "12c\r\n" + std::string(300, 'y') + "\r\n");
  EXPECT_THROW(format_chunk(""), InvalidArgument);
}

TEST(HttpMessageTest, ResponseHeadAndErrorBody) {
  EXPECT_EQ(format_response_head(404, {{"A", "1"}}), "HTTP/1.1 404 Not Found\r\nA: 1\r\n\r\n");
  EXPECT_THROW(format_response_head(200, {{"A", "1\r\nInjected: 1"}}), InvalidArgument);
  EXPECT_EQ(nlohmann::json::parse(openai_error_body(400, "bad \"x\"")),
            nlohmann::json::parse(R"({"error": {"message": "bad \"x\"", "type": "BadRequestError",
                                                "param": null, "code": 400}})"));
  EXPECT_EQ(nlohmann::json::parse(openai_error_body(404, "m", "Custom"))["error"]["type"],
            "Custom");
  EXPECT_TRUE(header_has_token("keep-alive, Close", "close"));
  EXPECT_FALSE(header_has_token("closed", "close"));
}

}  // namespace
}  // namespace hyserve
