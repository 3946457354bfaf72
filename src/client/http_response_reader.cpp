#include "client/http_response_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>

namespace hyserve::client {
namespace {

constexpr size_t kMaxHeadBytes = size_t{64} << 10;
constexpr size_t kMaxLineBytes = 4096;

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool HttpResponseReader::fail(std::string message) {
  state_ = State::kFailed;
  error_ = std::move(message);
  return false;
}

std::optional<std::string> HttpResponseReader::header(const std::string& lowercase_name) const {
  const auto it = headers_.find(lowercase_name);
  if (it == headers_.end()) return std::nullopt;
  return it->second;
}

bool HttpResponseReader::parse_head(std::string_view head) {
  // "HTTP/1.1 200 OK"
  const size_t eol = head.find("\r\n");
  const std::string_view status_line = head.substr(0, eol);
  if (status_line.substr(0, 5) != "HTTP/" || status_line.size() < 12 || status_line[8] != ' ')
    return fail("malformed HTTP status line: " + std::string(status_line.substr(0, 80)));
  int status = 0;
  const auto [end, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, status);
  if (ec != std::errc() || end != status_line.data() + 12 || status < 100 || status > 599 ||
      (status_line.size() > 12 && status_line[12] != ' '))
    return fail("malformed HTTP status line: " + std::string(status_line.substr(0, 80)));
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t next = head.find("\r\n", pos);
    if (next == std::string_view::npos) next = head.size();
    const std::string_view line = head.substr(pos, next - pos);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return fail("malformed HTTP header line: " + std::string(line.substr(0, 80)));
    headers_[lowercase(line.substr(0, colon))] = std::string(trim(line.substr(colon + 1)));
    pos = next + 2;
  }
  status_ = status;
  const auto te = header("transfer-encoding");
  const auto length = header("content-length");
  if (te && lowercase(*te).find("chunked") != std::string::npos) {
    state_ = State::kChunkSize;
  } else if (length) {
    const auto [p, lec] =
        std::from_chars(length->data(), length->data() + length->size(), remaining_);
    if (lec != std::errc() || p != length->data() + length->size())
      return fail("malformed Content-Length: " + *length);
    state_ = remaining_ == 0 ? State::kDone : State::kBodyLength;
  } else {
    state_ = (status_ == 204 || status_ == 304) ? State::kDone : State::kBodyToEof;
  }
  return true;
}

bool HttpResponseReader::take_line(std::string& line) {
  const size_t eol = pending_.find("\r\n");
  if (eol == std::string::npos) return false;
  line = pending_.substr(0, eol);
  pending_.erase(0, eol + 2);
  return true;
}

bool HttpResponseReader::feed(std::string_view bytes, std::string& body) {
  if (state_ == State::kFailed) return false;
  pending_.append(bytes);
  while (true) {
    switch (state_) {
      case State::kHead: {
        const size_t end = pending_.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (pending_.size() > kMaxHeadBytes) return fail("HTTP response head too large");
          return true;
        }
        const std::string head = pending_.substr(0, end);
        pending_.erase(0, end + 4);
        if (!parse_head(head)) return false;
        break;
      }
      case State::kBodyLength:
      case State::kChunkData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, pending_.size()));
        body.append(pending_, 0, n);
        pending_.erase(0, n);
        remaining_ -= n;
        if (remaining_ > 0) return true;
        state_ = state_ == State::kBodyLength ? State::kDone : State::kChunkDataEnd;
        break;
      }
      case State::kChunkSize: {
        std::string line;
        if (!take_line(line)) {
          if (pending_.size() > kMaxLineBytes) return fail("chunk size line too long");
          return true;
        }
        const std::string_view size_text = trim(std::string_view(line).substr(0, line.find(';')));
        uint64_t size = 0;
        const auto [p, ec] =
            std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
        if (size_text.empty() || ec != std::errc() || p != size_text.data() + size_text.size())
          return fail("malformed chunk size: " + line.substr(0, 40));
        remaining_ = size;
        state_ = size == 0 ? State::kTrailers : State::kChunkData;
        break;
      }
      case State::kChunkDataEnd: {
        if (pending_.size() < 2) return true;
        if (pending_.compare(0, 2, "\r\n") != 0) return fail("chunk data not followed by CRLF");
        pending_.erase(0, 2);
        state_ = State::kChunkSize;
        break;
      }
      case State::kTrailers: {
        std::string line;
        if (!take_line(line)) return true;
        if (line.empty()) state_ = State::kDone;
        break;
      }
      case State::kBodyToEof:
        body.append(pending_);
        pending_.clear();
        return true;
      case State::kDone:
        return true;  // bytes after the response (none expected: Connection: close) ignored
      case State::kFailed:
        return false;
    }
  }
}

bool HttpResponseReader::finish_at_eof() {
  if (state_ == State::kBodyToEof) state_ = State::kDone;
  return state_ == State::kDone;
}

}  // namespace hyserve::client
