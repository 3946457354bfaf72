// PNG files from an RGB image: signature, IHDR (8-bit truecolor), one IDAT (every row with
// filter 0, deflated by zlib), IEND, each chunk with its CRC-32. What the plots of
// `hyserve bench sweep` are saved as, so that a person can open them anywhere.
#pragma once

#include <cstdint>
#include <vector>

namespace hyserve::client {

// rgb: height rows of width pixels, 3 bytes each (r, g, b). Throws InvalidArgument when
// its size is not width * height * 3 or a side is 0.
std::vector<uint8_t> encode_png(int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace hyserve::client
