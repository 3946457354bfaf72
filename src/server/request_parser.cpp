#include "server/request_parser.h"

#include <algorithm>

namespace hyserve {
namespace {

constexpr std::size_t kMaxChunkLineBytes = 4096;
constexpr std::size_t kCompactBytes = 1 << 20;

}  // namespace

void RequestParser::feed(std::string_view bytes) {
  buffer_.append(bytes);
}

bool RequestParser::take_continue() {
  return std::exchange(continue_, false);
}

void RequestParser::compact() {
  if (pos_ == buffer_.size()) {
    buffer_.clear();
    pos_ = 0;
  } else if (pos_ > kCompactBytes) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
}

std::optional<std::pair<std::size_t, std::size_t>> RequestParser::find_head_end() {
  for (std::size_t i = buffer_.find('\n', scan_from_); i != std::string::npos;
       i = buffer_.find('\n', i + 1)) {
    scan_from_ = i;
    if (i + 1 >= buffer_.size()) return std::nullopt;
    if (buffer_[i + 1] == '\n') return std::pair(i + 1, i + 2);
    if (buffer_[i + 1] == '\r') {
      if (i + 2 >= buffer_.size()) return std::nullopt;
      if (buffer_[i + 2] == '\n') return std::pair(i + 1, i + 3);
    }
  }
  scan_from_ = buffer_.size();
  return std::nullopt;
}

std::optional<std::string> RequestParser::take_line(std::size_t max_bytes, int status_if_longer) {
  const std::size_t eol = buffer_.find('\n', pos_);
  if (eol == std::string::npos) {
    if (buffer_.size() - pos_ > max_bytes) throw HttpError(status_if_longer, "line too long");
    return std::nullopt;
  }
  std::string line = buffer_.substr(pos_, eol - pos_);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  pos_ = eol + 1;
  return line;
}

void RequestParser::start_body() {
  HttpRequest& request = request_;
  const auto transfer_encodings = request.headers.get_all("Transfer-Encoding");
  const auto content_lengths = request.headers.get_all("Content-Length");
  chunked_ = false;
  content_length_ = 0;
  if (!transfer_encodings.empty()) {
    if (!content_lengths.empty())
      throw HttpError(400, "both Transfer-Encoding and Content-Length are set");
    if (request.minor_version == 0)
      throw HttpError(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (transfer_encodings.size() != 1 || !iequals(transfer_encodings[0], "chunked"))
      throw HttpError(501, "only Transfer-Encoding: chunked is supported");
    chunked_ = true;
  } else if (!content_lengths.empty()) {
    for (std::string_view text : content_lengths) {
      if (text.empty() || text.size() > 18 ||
          !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        throw HttpError(400, "malformed Content-Length");
      if (text != content_lengths[0]) throw HttpError(400, "conflicting Content-Length headers");
      content_length_ = std::stoull(std::string(text));
    }
    if (content_length_ > limits_.max_body_bytes)
      throw HttpError(413, str_cat("request body of ", content_length_, " bytes is larger than ",
                                   limits_.max_body_bytes, " bytes"));
  }
  if (const auto expect = request.headers.get("Expect")) {
    if (!iequals(*expect, "100-continue"))
      throw HttpError(417, str_cat("unsupported Expect: ", *expect));
    const bool body_expected = chunked_ || content_length_ > 0;
    continue_ = request.minor_version >= 1 && body_expected && pos_ == buffer_.size();
  }
  chunk_stage_ = ChunkStage::kSize;
  chunk_left_ = 0;
  trailer_bytes_ = 0;
  stage_ = Stage::kBody;
}

bool RequestParser::parse_chunked() {
  std::string& body = request_.body;
  while (true) {
    switch (chunk_stage_) {
      case ChunkStage::kSize: {
        const auto line = take_line(kMaxChunkLineBytes, 400);
        if (!line) return false;
        const std::uint64_t size = parse_chunk_size(*line);
        if (size == 0) {
          chunk_stage_ = ChunkStage::kTrailers;
          break;
        }
        if (size > limits_.max_body_bytes - body.size())
          throw HttpError(413,
                          str_cat("request body larger than ", limits_.max_body_bytes, " bytes"));
        chunk_left_ = size;
        chunk_stage_ = ChunkStage::kData;
        break;
      }
      case ChunkStage::kData:
        if (buffer_.size() - pos_ < chunk_left_ + 2) return false;
        body.append(buffer_, pos_, chunk_left_);
        if (buffer_.compare(pos_ + chunk_left_, 2, "\r\n") != 0)
          throw HttpError(400, "chunk data not followed by CRLF");
        pos_ += chunk_left_ + 2;
        chunk_stage_ = ChunkStage::kSize;
        compact();
        break;
      case ChunkStage::kTrailers: {
        const auto line = take_line(limits_.max_header_bytes, 431);
        if (!line) return false;
        if (line->empty()) return true;
        trailer_bytes_ += line->size();
        if (trailer_bytes_ > limits_.max_header_bytes) throw HttpError(431, "trailers too large");
        break;
      }
    }
  }
}

std::optional<HttpRequest> RequestParser::parse() {
  if (stage_ == Stage::kIdle) {
    compact();
    while (pos_ < buffer_.size() && (buffer_[pos_] == '\r' || buffer_[pos_] == '\n')) ++pos_;
    if (pos_ == buffer_.size()) return std::nullopt;
    stage_ = Stage::kHead;
    scan_from_ = pos_;
  }
  if (stage_ == Stage::kHead) {
    const std::string too_large =
        str_cat("request line and headers larger than ", limits_.max_header_bytes, " bytes");
    const auto head_end = find_head_end();
    if (!head_end) {
      if (buffer_.size() - pos_ > limits_.max_header_bytes) throw HttpError(431, too_large);
      return std::nullopt;
    }
    const auto [head_stop, body_start] = *head_end;
    if (body_start - pos_ > limits_.max_header_bytes) throw HttpError(431, too_large);
    request_ = parse_request_head(std::string_view(buffer_).substr(pos_, head_stop - pos_));
    pos_ = body_start;
    start_body();
  }
  if (chunked_) {
    if (!parse_chunked()) return std::nullopt;
  } else {
    if (buffer_.size() - pos_ < content_length_) return std::nullopt;
    request_.body = buffer_.substr(pos_, content_length_);
    pos_ += content_length_;
  }
  stage_ = Stage::kIdle;
  continue_ = false;
  return std::exchange(request_, HttpRequest{});
}

}  // namespace hyserve
