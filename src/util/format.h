// Number formatting for human-readable reports (`hyserve info`, the plans it prints).
#pragma once

#include <cstdint>
#include <string>

namespace hyserve {

// 1234567 -> "1,234,567"; -1234 -> "-1,234".
std::string with_commas(int64_t v);

}  // namespace hyserve
