// hyserve: command-line entry: `hyserve info`, `generate`, `serve`, `bench serve`. Every
// subcommand takes `--log-level`, set before it runs. Every hyserve::Error becomes one error
// line on stderr and exit code 1.
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "util/error.h"
#include "util/log.h"
#include "util/version.h"

int main(int argc, char** argv) {
  CLI::App app{"hyserve: inference server for hybrid sparse-attention MoE models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(hyserve::kVersion));
  auto info = hyserve::cli::add_info_command(app);
  auto generate = hyserve::cli::add_generate_command(app);
  auto serve = hyserve::cli::add_serve_command(app);
  auto bench = hyserve::cli::add_bench_command(app);
  auto send_weights = hyserve::cli::add_send_weights_command(app);
  std::string log_level = "info";
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->add_option("--log-level", log_level, "lowest level of the log lines on stderr")
        ->check(CLI::IsMember(hyserve::log::level_names()))
        ->capture_default_str();
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    hyserve::log::set_level(log_level);  // before any subcommand logs or loads a model
    if (app.got_subcommand("info")) return info();
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("serve")) return serve();
    if (app.got_subcommand("bench")) return bench();
    if (app.got_subcommand("send-weights")) return send_weights();
  } catch (const hyserve::Error& e) {
    hyserve::log::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    hyserve::log::error("internal error: {}", e.what());
    return 2;
  }
  return 1;
}
