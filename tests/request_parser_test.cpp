// RequestParser fed piece by piece: framing, pipelining, 100-continue and the limits.
#include <gtest/gtest.h>

#include <string>

#include "server/http_message.h"
#include "server/request_parser.h"

namespace hyserve {
namespace {

RequestParser test_parser() {
  return RequestParser(RequestParserLimits{1000, 4096});
}

TEST(RequestParserTest, ByteByByteFramingAndPipelining) {
  const std::string wire = "\r\nPOST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" +
                           std::string("POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") +
                           "2\r\nxy\r\n1;e=1\r\nz\r\n0\r\nT: 1\r\n\r\n" +
                           "GET /c HTTP/1.0\nX: y\n\n";
  RequestParser parser = test_parser();
  std::vector<HttpRequest> requests;
  std::vector<RequestParser::Stage> stages;
  for (char c : wire) {
    parser.feed(std::string_view(&c, 1));
    if (auto request = parser.parse()) requests.push_back(std::move(*request));
    if (stages.empty() || stages.back() != parser.stage()) stages.push_back(parser.stage());
  }
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].path, "/a");
  EXPECT_EQ(requests[0].body, "abc");
  EXPECT_EQ(requests[1].path, "/b");
  EXPECT_EQ(requests[1].body, "xyz");
  EXPECT_EQ(requests[2].path, "/c");
  EXPECT_EQ(requests[2].minor_version, 0);
  EXPECT_EQ(requests[2].headers.get_or("X", ""), "y");
  EXPECT_EQ(parser.unread_bytes(), 0u);
  using Stage = RequestParser::Stage;
  EXPECT_EQ(stages, (std::vector<Stage>{Stage::kIdle, Stage::kHead, Stage::kBody, Stage::kIdle,
                                        Stage::kHead, Stage::kBody, Stage::kIdle, Stage::kHead,
                                        Stage::kIdle}));

  // All at once: the same requests, one parse() each.
  RequestParser whole = test_parser();
  whole.feed(wire);
  for (const char* path : {"/a", "/b", "/c"}) {
    const auto request = whole.parse();
    ASSERT_TRUE(request.has_value()) << path;
    EXPECT_EQ(request->path, path);
  }
  EXPECT_FALSE(whole.parse().has_value());
}

TEST(RequestParserTest, ContinueAndLimits) {
  RequestParser parser = test_parser();
  parser.feed("POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_FALSE(parser.parse().has_value());
  EXPECT_TRUE(parser.take_continue());
  EXPECT_FALSE(parser.take_continue()) << "100 Continue is sent once";
  parser.feed("ok");
  EXPECT_EQ(parser.parse()->body, "ok");

  const auto status_of = [](const std::string& wire) {
    RequestParser p = test_parser();
    p.feed(wire);
    try {
      p.parse();
    } catch (const HttpError& e) {
      return e.status();
    }
    return 0;
  };
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nContent-Length: 1001\r\n\r\n"), 413);
  EXPECT_EQ(status_of("GET /a HTTP/1.1\r\nX: " + std::string(5000, 'x')), 431);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nExpect: magic\r\n\r\n"), 417);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
  EXPECT_EQ(status_of("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n"), 413);
  EXPECT_EQ(status_of("GET /a HTTP/1.1\r\n\r\n"), 0);
}

}  // namespace
}  // namespace hyserve
