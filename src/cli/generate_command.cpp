#include "cli/commands.h"

namespace hyserve::cli {

std::function<int()> add_generate_command(CLI::App& app) {
  app.add_subcommand("generate", "Generate tokens (not yet available)");
  return [] { return 1; };
}

}  // namespace hyserve::cli
