// hyserve: command-line entry: `hyserve info`, `hyserve generate`, `hyserve serve`. Every
// hyserve::Error becomes one line on stderr and exit code 1.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"hyserve: inference server for hybrid sparse-attention MoE models"};
  app.require_subcommand(1);
  auto info = hyserve::cli::add_info_command(app);
  auto generate = hyserve::cli::add_generate_command(app);
  auto serve = hyserve::cli::add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("info")) return info();
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("serve")) return serve();
  } catch (const hyserve::Error& e) {
    std::fprintf(stderr, "hyserve: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve: internal error: %s\n", e.what());
    return 2;
  }
  return 1;
}
