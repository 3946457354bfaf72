#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "cli/commands.h"

namespace hyserve::cli {

std::filesystem::path default_model_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("HYSERVE_DEFAULT_MODEL")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& cand : {exe.parent_path() / "../share/hyserve/models/tiny-kimi-k3",
                                 exe.parent_path() / "../models/tiny-kimi-k3"}) {
      if (fs::exists(cand / "config.json")) return fs::weakly_canonical(cand);
    }
  }
  return fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
}

}  // namespace hyserve::cli
