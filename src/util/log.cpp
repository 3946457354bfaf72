#include "util/log.h"

#include <ctime>
#include <iterator>
#include <memory>
#include <ostream>

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "util/error.h"

namespace hyserve::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarning:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

// `%*` in the pattern: the level as vLLM writes it (spdlog's own names are lower case).
class UpperLevelFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view name = "ERROR";
    switch (msg.level) {
      case spdlog::level::trace:
        name = "TRACE";
        break;
      case spdlog::level::debug:
        name = "DEBUG";
        break;
      case spdlog::level::info:
        name = "INFO";
        break;
      case spdlog::level::warn:
        name = "WARNING";
        break;
      case spdlog::level::critical:
        name = "CRITICAL";
        break;
      default:
        break;
    }
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<UpperLevelFlag>();
  }
};

// A sink writing `INFO 12-02 08:15:03 message` lines to `out`, or to stderr (flushed per line).
std::shared_ptr<spdlog::sinks::sink> make_sink(std::ostream* out) {
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (out)
    sink = std::make_shared<spdlog::sinks::ostream_sink_st>(*out, /*force_flush=*/true);
  else
    sink = std::make_shared<spdlog::sinks::stderr_sink_st>();
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<UpperLevelFlag>('*').set_pattern("%* %m-%d %H:%M:%S %v");
  sink->set_formatter(std::move(formatter));
  return sink;
}

// The one logger. Its output is a dist_sink (thread-safe) so that tests can swap what it
// writes to; never destroyed, since threads may still log while the process exits.
struct Logger {
  std::shared_ptr<spdlog::sinks::dist_sink_mt> output =
      std::make_shared<spdlog::sinks::dist_sink_mt>(
          std::vector<std::shared_ptr<spdlog::sinks::sink>>{make_sink(nullptr)});
  spdlog::logger logger{"hyserve", output};

  Logger() { logger.set_level(to_spdlog(Level::kInfo)); }
};

Logger& the_logger() {
  static Logger* const logger = new Logger();
  return *logger;
}

}  // namespace

const std::vector<std::string>& level_names() {
  static const std::vector<std::string> names = {"debug", "info", "warning", "error"};
  return names;
}

void set_level(std::string_view name) {
  const std::vector<std::string>& names = level_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) {
      the_logger().logger.set_level(to_spdlog(static_cast<Level>(i)));
      return;
    }
  }
  HYSERVE_THROW(InvalidArgument, "unknown log level '", name,
                "' (expected debug, info, warning or error)");
}

bool is_enabled(Level level) {
  return the_logger().logger.should_log(to_spdlog(level));
}

void vwrite(Level level, fmt::string_view format, fmt::format_args args) {
  fmt::memory_buffer message;
  fmt::vformat_to(std::back_inserter(message), format, args);
  the_logger().logger.log(to_spdlog(level), spdlog::string_view_t(message.data(), message.size()));
}

void set_output_for_test(std::ostream* out) {
  the_logger().output->set_sinks({make_sink(out)});
}

}  // namespace hyserve::log
