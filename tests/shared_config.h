// The published configs beside the repository (../shared/configs, or shared/configs in a
// checkout that carries them): a config's path, or empty when absent (the test skips).
#pragma once

#include <filesystem>

namespace hyserve::test {

inline std::filesystem::path shared_config(const char* name) {
  for (auto dir : {std::filesystem::path(HYSERVE_SOURCE_DIR) / "../shared/configs",
                   std::filesystem::path(HYSERVE_SOURCE_DIR) / "shared/configs"}) {
    if (std::filesystem::exists(dir / name)) return dir / name;
  }
  return {};
}

}  // namespace hyserve::test
