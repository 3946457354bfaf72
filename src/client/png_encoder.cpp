#include "client/png_encoder.h"

#include <zlib.h>

#include <string_view>

#include "util/error.h"

namespace hyserve::client {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// length, type, data, CRC-32 of type + data.
void put_chunk(std::vector<uint8_t>& out, std::string_view type, const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type.begin(), type.end());
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + type_at, static_cast<uInt>(out.size() - type_at));
  put_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

std::vector<uint8_t> encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  CHECK(width > 0 && height > 0, "PNG: empty image ", width, "x", height);
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  CHECK(rgb.size() == row_bytes * static_cast<size_t>(height), "PNG: ", rgb.size(), " bytes for ",
        width, "x", height, " RGB");
  std::vector<uint8_t> raw;  // each row: filter type 0 (none), then its pixels
  raw.reserve((row_bytes + 1) * static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    const auto* row = rgb.data() + row_bytes * static_cast<size_t>(y);
    raw.insert(raw.end(), row, row + row_bytes);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> packed(packed_size);
  const int rc = compress2(packed.data(), &packed_size, raw.data(), static_cast<uLong>(raw.size()),
                           Z_BEST_COMPRESSION);
  CHECK(rc == Z_OK, "PNG: zlib compress2 failed (", rc, ")");
  packed.resize(packed_size);

  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> header;
  put_u32(header, static_cast<uint32_t>(width));
  put_u32(header, static_cast<uint32_t>(height));
  header.insert(header.end(),
                {8, 2, 0, 0, 0});  // 8 bits, truecolor, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", header);
  put_chunk(out, "IDAT", packed);
  put_chunk(out, "IEND", {});
  return out;
}

}  // namespace hyserve::client
