// HTTP/1.1 messages as bytes: the request the server hands to a handler, the header list,
// and the pure functions that parse a request head / chunk-size line and format a response
// head, a body chunk and the OpenAI error JSON. No sockets here, so every rule about the
// wire format can be tested on strings (the socket side lives in http_server.{h,cpp}).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/error.h"

namespace hyserve {

// An error with an HTTP status. The parser throws it for bad requests (400, 413, 431, ...);
// a handler may throw it to answer with that status and an OpenAI error body.
class HttpError : public Error {
 public:
  HttpError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// Ordered header fields; names compare case-insensitively, duplicates are kept in order.
class HttpHeaders {
 public:
  using Field = std::pair<std::string, std::string>;

  HttpHeaders() = default;
  HttpHeaders(std::initializer_list<Field> fields) : fields_(fields) {}

  void add(std::string name, std::string value);
  // The first field named `name`, or nullopt.
  std::optional<std::string_view> get(std::string_view name) const;
  std::string get_or(std::string_view name, std::string_view fallback) const;
  bool has(std::string_view name) const { return get(name).has_value(); }
  // Every value of the fields named `name`, in order.
  std::vector<std::string_view> get_all(std::string_view name) const;

  const std::vector<Field>& fields() const { return fields_; }
  bool empty() const { return fields_.empty(); }

 private:
  std::vector<Field> fields_;
};

struct HttpRequest {
  std::string method;  // as sent, case-sensitive: "GET", "POST"
  std::string target;  // raw request-target: "/v1/models?x=1"
  std::string path;    // target before '?', percent-decoded: "/v1/models"
  std::vector<std::pair<std::string, std::string>> query;  // decoded, in order
  int minor_version = 1;                                   // HTTP/1.<minor_version>
  HttpHeaders headers;
  std::string body;            // de-chunked
  std::string remote_address;  // "127.0.0.1:51234", "[::1]:51234"

  // The first query parameter named `name` (exact match), or nullopt.
  std::optional<std::string> query_param(std::string_view name) const;
};

// Case-insensitive ASCII equality.
bool iequals(std::string_view a, std::string_view b);

// Whether a comma-separated header value (e.g. Connection) contains `token`, ignoring case.
bool header_has_token(std::string_view value, std::string_view token);

// Parses a request head: request line and header lines, without the terminating empty
// line. Lines end in CRLF or a bare LF. Fills method, target, path, query, minor_version
// and headers; throws HttpError 400 (malformed), 505 (not HTTP/1.x).
HttpRequest parse_request_head(std::string_view head);

// Parses "%xx" escapes (and '+' as space when `plus_is_space`); throws HttpError 400 on a
// bad escape.
std::string percent_decode(std::string_view text, bool plus_is_space);

// The size in a chunked-body size line ("1a;ext=1", without CRLF); throws HttpError 400.
std::uint64_t parse_chunk_size(std::string_view line);

// "OK", "Not Found", ...; "Unknown" for codes we never send.
std::string_view status_reason(int status);

// The error type name clients see in `error.type` for a status: 400 BadRequestError,
// 404 NotFoundError, 500 InternalServerError, ...
std::string_view error_type_for_status(int status);

// {"error": {"message": message, "type": type, "param": null, "code": status}}; `type`
// defaults to error_type_for_status(status).
std::string openai_error_body(int status, std::string_view message, std::string_view type = {});

// "HTTP/1.1 <status> <reason>\r\n<name>: <value>\r\n...\r\n" (ends with the empty line).
// Throws InvalidArgument for a name or value holding CR or LF (response splitting).
std::string format_response_head(int status, const HttpHeaders& headers);

// One chunk of a chunked body: "<hex size>\r\n<data>\r\n". `data` must not be empty (an
// empty chunk ends the body: write kLastChunk for that).
std::string format_chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace hyserve
