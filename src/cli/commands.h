// The hyserve subcommands. Each registers its options on the CLI11 app and runs
// when chosen; errors propagate as hyserve::Error and main() prints them.
#pragma once

#include <filesystem>
#include <functional>

#include <CLI/CLI.hpp>

namespace hyserve::cli {

// Returns the action to run when the subcommand is chosen.
std::function<int()> add_info_command(CLI::App& app);
std::function<int()> add_generate_command(CLI::App& app);
std::function<int()> add_serve_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);  // `bench serve` (bench_command.cpp)
// `send-weights`: a folder's tensors into a running server (send_weights_command.cpp).
std::function<int()> add_send_weights_command(CLI::App& app);

// The bundled tiny kimi_k3 model: $HYSERVE_DEFAULT_MODEL, else models/tiny-kimi-k3
// next to the binary's share folder, else in the source tree it was built from.
std::filesystem::path default_model_dir();

}  // namespace hyserve::cli
