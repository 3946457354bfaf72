// RequestParser: the framing of HTTP/1.1 requests on one connection, fed the bytes as they
// arrive (no sockets, no waiting): the head found and parsed (parse_request_head), the
// body by Content-Length or chunked, the limits (413, 431) and the framing errors (400,
// 501, 417). The connection (http_server.cpp) feeds it, asks for the next whole request,
// and times the stages it reports (idle, head, body). Bytes past a request stay buffered
// (pipelining).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_message.h"

namespace hyserve {

struct RequestParserLimits {
  std::size_t max_body_bytes = std::size_t{32} << 20;    // larger: 413
  std::size_t max_header_bytes = std::size_t{64} << 10;  // request line + headers; larger: 431
};

class RequestParser {
 public:
  // Where the request being received is.
  enum class Stage {
    kIdle,  // between requests (empty lines before a request line are skipped)
    kHead,  // the request line and headers
    kBody,  // the body (Content-Length or chunked, trailers included)
  };

  explicit RequestParser(RequestParserLimits limits) : limits_(limits) {}

  // Appends received bytes.
  void feed(std::string_view bytes);
  // The next whole request once it is buffered, else nullopt (feed more). Throws HttpError
  // for a request to refuse; the connection then answers and closes (the parser is not
  // usable afterwards).
  std::optional<HttpRequest> parse();

  Stage stage() const { return stage_; }
  // True once after a head with `Expect: 100-continue` whose body has not started yet: the
  // connection sends the interim "100 Continue" (HTTP/1.1 only).
  bool take_continue();
  // Buffered bytes not yet part of a returned request.
  std::size_t unread_bytes() const { return buffer_.size() - pos_; }

 private:
  // [head end, body start) once the empty line ending the head is buffered.
  std::optional<std::pair<std::size_t, std::size_t>> find_head_end();
  // Validates the framing headers and moves to the body.
  void start_body();
  // The next line (without CR LF) or nullopt; throws HttpError(status_if_longer) when more
  // than max_bytes are buffered without one.
  std::optional<std::string> take_line(std::size_t max_bytes, int status_if_longer);
  // Consumes chunked-body bytes; true when the body (trailers included) is complete.
  bool parse_chunked();
  void compact();

  enum class ChunkStage { kSize, kData, kTrailers };

  RequestParserLimits limits_;
  std::string buffer_;
  std::size_t pos_ = 0;        // start of the unread bytes in buffer_
  std::size_t scan_from_ = 0;  // kHead: where the search for the head's end goes on
  Stage stage_ = Stage::kIdle;
  HttpRequest request_;  // kBody: the head parsed, the body being gathered
  bool chunked_ = false;
  std::uint64_t content_length_ = 0;
  ChunkStage chunk_stage_ = ChunkStage::kSize;
  std::uint64_t chunk_left_ = 0;
  std::size_t trailer_bytes_ = 0;
  bool continue_ = false;
};

}  // namespace hyserve
