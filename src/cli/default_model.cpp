#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <system_error>
#include <vector>

#include "cli/commands.h"

namespace hyserve::cli {
namespace {

// A bundled model folder hyserve can load: a config and its weights (the trained model's
// folder holds only its tokenizer until the weights land, issue 50).
bool loadable(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "config.json", ec) &&
         std::filesystem::exists(dir / "model.safetensors", ec);
}

}  // namespace

// The bundled model that speaks (models/tiny-k3-speaks) once it has weights, else the random
// tiny K3 (models/tiny-kimi-k3); next to the binary (installed or built in the tree) first,
// then the source tree. HYSERVE_DEFAULT_MODEL overrides.
std::filesystem::path default_model_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("HYSERVE_DEFAULT_MODEL")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> roots;
  if (!ec) {
    roots.push_back(exe.parent_path() / "../share/hyserve/models");
    roots.push_back(exe.parent_path() / "../models");
  }
  roots.push_back(fs::path(HYSERVE_SOURCE_DIR) / "models");
  for (const char* name : {"tiny-k3-speaks", "tiny-kimi-k3"}) {
    for (const fs::path& root : roots) {
      if (!loadable(root / name)) continue;
      const fs::path canonical = fs::weakly_canonical(root / name, ec);
      return ec ? root / name : canonical;
    }
  }
  return fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
}

}  // namespace hyserve::cli
