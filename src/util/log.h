// Logging: every diagnostic of hyserve goes through these functions, thin wrappers over
// one spdlog logger that writes one line per message to stderr, as vLLM prints them:
//   WARNING 12-02 08:15:03 models/x: config fields hyserve does not know ...
// Formats are fmt's ("{}", checked at compile time). A message below the level (default
// info; `--log-level`) is not even formatted. Safe to call from any thread.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

namespace hyserve::log {

enum class Level { kDebug, kInfo, kWarning, kError };

// "debug", "info", "warning", "error": the names set_level takes, lowest level first.
const std::vector<std::string>& level_names();

// Sets the level by name, one of level_names(); throws InvalidArgument naming any other.
void set_level(std::string_view name);

// Whether a message at `level` is written at the current level.
bool is_enabled(Level level);

// Formats and writes one line at `level` when it is enabled (the functions below check
// first, so that a disabled message is not formatted).
void vwrite(Level level, fmt::string_view format, fmt::format_args args);

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (is_enabled(Level::kDebug)) vwrite(Level::kDebug, format, fmt::make_format_args(args...));
}

template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (is_enabled(Level::kInfo)) vwrite(Level::kInfo, format, fmt::make_format_args(args...));
}

template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  if (is_enabled(Level::kWarning)) vwrite(Level::kWarning, format, fmt::make_format_args(args...));
}

template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  if (is_enabled(Level::kError)) vwrite(Level::kError, format, fmt::make_format_args(args...));
}

// Tests only: the lines go to `out` instead of stderr (nullptr: back to stderr), with the
// same format. `out` must outlive its use; writing to it is serialized by the logger.
void set_output_for_test(std::ostream* out);

}  // namespace hyserve::log
