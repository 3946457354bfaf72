// The client's side of HTTP/1.1 framing, incrementally: the status line and headers, then
// the body as Content-Length bytes, as chunked transfer coding, or up to the end of the
// connection. Bytes are fed as they are read from the socket, cut anywhere; the body comes
// out decoded (chunk sizes and trailers removed) so an SSE parser can read it directly.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace hyserve::client {

class HttpResponseReader {
 public:
  // Consumes `bytes`; appends the body bytes they complete to `body`. Returns false on a
  // malformed response (see error()); nothing is read after that.
  bool feed(std::string_view bytes, std::string& body);

  // The connection ended: true when that completes the response (a body delimited by the
  // end of the connection); false when the response was cut short.
  bool finish_at_eof();

  bool has_head() const { return status_ != 0; }
  int status() const { return status_; }
  // A header's value by its lowercase name, or nullopt.
  std::optional<std::string> header(const std::string& lowercase_name) const;
  bool done() const { return state_ == State::kDone; }
  const std::string& error() const { return error_; }

 private:
  enum class State {
    kHead,
    kBodyLength,
    kChunkSize,
    kChunkData,
    kChunkDataEnd,
    kTrailers,
    kBodyToEof,
    kDone,
    kFailed
  };
  bool fail(std::string message);
  bool parse_head(std::string_view head);
  // Takes one CRLF-terminated line from pending_ into `line`; false when none is complete.
  bool take_line(std::string& line);

  State state_ = State::kHead;
  std::string pending_;  // bytes not yet consumed (head, chunk-size lines)
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  uint64_t remaining_ = 0;  // bytes left of the body (kBodyLength) or of the chunk
  std::string error_;
};

}  // namespace hyserve::client
