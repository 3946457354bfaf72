// UTF-8 validation and lossy decoding: see utf8.h.
#include "tokenizer/utf8.h"

#include <cstdint>

namespace hyserve {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

struct ByteRange {
  uint8_t lo;
  uint8_t hi;
};

// The well-formed byte sequences (Unicode table 3-7), keyed by the lead byte: how many
// continuation bytes follow and the allowed range of the first one (the rest are 80..BF).
struct LeadInfo {
  int num_continuation;  // -1: not a valid lead byte
  ByteRange first;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {0, {0, 0}};
  if (b >= 0xC2 && b <= 0xDF) return {1, {0x80, 0xBF}};
  if (b == 0xE0) return {2, {0xA0, 0xBF}};
  if (b == 0xED) return {2, {0x80, 0x9F}};
  if (b >= 0xE1 && b <= 0xEF) return {2, {0x80, 0xBF}};
  if (b == 0xF0) return {3, {0x90, 0xBF}};
  if (b >= 0xF1 && b <= 0xF3) return {3, {0x80, 0xBF}};
  if (b == 0xF4) return {3, {0x80, 0x8F}};
  return {-1, {0, 0}};
}

enum class Scan { kValid, kInvalid, kIncomplete };

// Classifies the sequence starting at bytes[pos]; `length` is the character's length
// (kValid), the maximal invalid subpart's length (kInvalid), or the bytes present (kIncomplete).
Scan scan_char(std::string_view bytes, std::size_t pos, std::size_t& length) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(bytes[pos]));
  if (info.num_continuation < 0) {
    length = 1;
    return Scan::kInvalid;
  }
  for (int k = 1; k <= info.num_continuation; ++k) {
    if (pos + k >= bytes.size()) {
      length = k;
      return Scan::kIncomplete;
    }
    const auto c = static_cast<uint8_t>(bytes[pos + k]);
    const ByteRange range = k == 1 ? info.first : ByteRange{0x80, 0xBF};
    if (c < range.lo || c > range.hi) {
      length = k;
      return Scan::kInvalid;
    }
  }
  length = 1 + info.num_continuation;
  return Scan::kValid;
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t length = 0;
    if (scan_char(bytes, pos, length) != Scan::kValid) return false;
    pos += length;
  }
  return true;
}

std::size_t append_lossy_utf8(std::string_view bytes, bool final, std::string& out) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t length = 0;
    switch (scan_char(bytes, pos, length)) {
      case Scan::kValid:
        out.append(bytes.substr(pos, length));
        break;
      case Scan::kInvalid:
        out.append(kReplacement);
        break;
      case Scan::kIncomplete:
        if (!final) return pos;
        out.append(kReplacement);
        break;
    }
    pos += length;
  }
  return pos;
}

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_lossy_utf8(bytes, true, out);
  return out;
}

}  // namespace hyserve
