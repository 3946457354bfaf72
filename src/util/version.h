// The release of hyserve a binary was built from: `hyserve --version` and the server's
// GET /version (vLLM's route, {"version": ...}).
#pragma once

namespace hyserve {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace hyserve
