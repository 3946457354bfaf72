// HTTP/1.1 wire format: request-head parsing (RFC 9112 section 3-5), chunk sizes,
// response heads and the OpenAI error JSON.
#include "server/http_message.h"

#include <nlohmann/json.hpp>

namespace hyserve {
namespace {

char to_lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// tchar from RFC 9110 section 5.6.2: the characters of a method or header name.
bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_token_char(c)) return false;
  return true;
}

// Field values: visible characters, space, tab and obs-text; no CR, LF or other controls.
bool is_field_value(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

[[noreturn]] void bad_request(const std::string& message) {
  throw HttpError(400, message);
}

// Splits off the next line (without its CRLF / LF) from `text`.
std::string_view next_line(std::string_view& text) {
  const auto eol = text.find('\n');
  std::string_view line = text.substr(0, eol);
  text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

void parse_query(std::string_view query, HttpRequest& request) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    std::string name = percent_decode(pair.substr(0, eq), true);
    std::string value =
        eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1), true);
    request.query.emplace_back(std::move(name), std::move(value));
  }
}

}  // namespace

void HttpHeaders::add(std::string name, std::string value) {
  fields_.emplace_back(std::move(name), std::move(value));
}

std::optional<std::string_view> HttpHeaders::get(std::string_view name) const {
  for (const auto& [field_name, value] : fields_)
    if (iequals(field_name, name)) return std::string_view(value);
  return std::nullopt;
}

std::string HttpHeaders::get_or(std::string_view name, std::string_view fallback) const {
  return std::string(get(name).value_or(fallback));
}

std::vector<std::string_view> HttpHeaders::get_all(std::string_view name) const {
  std::vector<std::string_view> values;
  for (const auto& [field_name, value] : fields_)
    if (iequals(field_name, name)) values.emplace_back(value);
  return values;
}

std::optional<std::string> HttpRequest::query_param(std::string_view name) const {
  for (const auto& [key, value] : query)
    if (key == name) return value;
  return std::nullopt;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (to_lower(a[i]) != to_lower(b[i])) return false;
  return true;
}

bool header_has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const auto comma = value.find(',');
    if (iequals(trim_ows(value.substr(0, comma)), token)) return true;
    value.remove_prefix(comma == std::string_view::npos ? value.size() : comma + 1);
  }
  return false;
}

std::string percent_decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%') {
      const int hi = i + 1 < text.size() ? hex_value(text[i + 1]) : -1;
      const int low = i + 2 < text.size() ? hex_value(text[i + 2]) : -1;
      if (hi < 0 || low < 0) bad_request(str_cat("bad percent escape in '", text, "'"));
      out.push_back(static_cast<char>(hi * 16 + low));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

HttpRequest parse_request_head(std::string_view head) {
  HttpRequest request;
  const std::string_view request_line = next_line(head);

  // request-line = method SP request-target SP HTTP-version
  const auto sp1 = request_line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || request_line.find(' ', sp2 + 1) != std::string_view::npos)
    bad_request("malformed request line");
  const std::string_view method = request_line.substr(0, sp1);
  const std::string_view target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = request_line.substr(sp2 + 1);
  if (!is_token(method)) bad_request("malformed request method");
  // The absolute form ("http://host/path", as sent to proxies) routes like its path.
  std::string_view origin = target;
  if (const auto scheme_end = target.find("://");
      scheme_end != std::string_view::npos && (iequals(target.substr(0, scheme_end), "http") ||
                                               iequals(target.substr(0, scheme_end), "https"))) {
    const auto slash = target.find('/', scheme_end + 3);
    origin = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (origin.empty() || origin.front() != '/') bad_request("request target must be a path");
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) bad_request("bad request target");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' ||
      version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9')
    bad_request("malformed HTTP version");
  if (version[5] != '1') throw HttpError(505, str_cat("unsupported version ", version));

  request.method = std::string(method);
  request.target = std::string(target);
  request.minor_version = version[7] - '0';
  const auto question = origin.find('?');
  request.path = percent_decode(origin.substr(0, question), false);
  if (question != std::string_view::npos) parse_query(origin.substr(question + 1), request);

  // field-line = field-name ":" OWS field-value OWS; no obs-fold, no space before ':'.
  while (!head.empty()) {
    const std::string_view line = next_line(head);
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') bad_request("obsolete header line folding");
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) bad_request("header line without ':'");
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim_ows(line.substr(colon + 1));
    if (!is_token(name)) bad_request(str_cat("malformed header name '", name, "'"));
    if (!is_field_value(value)) bad_request(str_cat("bad characters in header '", name, "'"));
    request.headers.add(std::string(name), std::string(value));
  }
  return request;
}

std::uint64_t parse_chunk_size(std::string_view line) {
  const std::string_view digits = trim_ows(line.substr(0, line.find(';')));
  if (digits.empty() || digits.size() > 15) bad_request("malformed chunk size");
  std::uint64_t size = 0;
  for (char c : digits) {
    const int v = hex_value(c);
    if (v < 0) bad_request("malformed chunk size");
    size = size * 16 + static_cast<std::uint64_t>(v);
  }
  return size;
}

std::string_view status_reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string_view error_type_for_status(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 408:
      return "RequestTimeoutError";
    case 409:
      return "ConflictError";
    case 413:
      return "RequestTooLargeError";
    case 417:
      return "ExpectationFailedError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 431:
      return "RequestHeaderFieldsTooLargeError";
    case 501:
      return "NotImplementedError";
    case 503:
      return "ServiceUnavailableError";
    case 505:
      return "HTTPVersionNotSupportedError";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string openai_error_body(int status, std::string_view message, std::string_view type) {
  const nlohmann::json body = {{"error",
                                {{"message", message},
                                 {"type", type.empty() ? error_type_for_status(status) : type},
                                 {"param", nullptr},
                                 {"code", status}}}};
  // Replace, not throw, on invalid UTF-8: messages may quote client bytes.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string format_response_head(int status, const HttpHeaders& headers) {
  std::string head = str_cat("HTTP/1.1 ", status, " ", status_reason(status), "\r\n");
  for (const auto& [name, value] : headers.fields()) {
    CHECK(is_token(name), "bad response header name '", name, "'");
    CHECK(is_field_value(value), "bad characters in response header '", name, "'");
    head += name;
    head += ": ";
    head += value;
    head += "\r\n";
  }
  head += "\r\n";
  return head;
}

std::string format_chunk(std::string_view data) {
  CHECK(!data.empty(), "an empty chunk would end the body");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string size_hex;
  for (std::size_t n = data.size(); n > 0; n /= 16) size_hex.insert(size_hex.begin(), kHex[n % 16]);
  std::string chunk;
  chunk.reserve(size_hex.size() + data.size() + 4);
  chunk += size_hex;
  chunk += "\r\n";
  chunk += data;
  chunk += "\r\n";
  return chunk;
}

}  // namespace hyserve
