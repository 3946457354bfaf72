// Errors: typed exceptions that carry the source location, and the CHECK macros
// that throw them. Library code never exits; the CLI and (later) the HTTP layer
// turn these into messages and status codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace hyserve {

// Base of every error hyserve throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A config.json that cannot describe a model we serve (unknown model_type,
// missing or inconsistent fields).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A checkpoint that cannot be read or does not match its config.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// Bad arguments to an op or a function (shape, dtype, range).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A request a client sent that can never run: `param` names the field (the OpenAI error's
// "param"), the message is for the client (no source location).
class InvalidRequest : public InvalidArgument {
 public:
  InvalidRequest(std::string param, const std::string& message)
      : InvalidArgument(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

inline std::string with_location(const char* file, int line, const std::string& msg) {
  std::string f(file);
  const auto pos = f.rfind("src/");
  if (pos != std::string::npos) f = f.substr(pos);
  return msg + " [" + f + ":" + std::to_string(line) + "]";
}

}  // namespace detail

// Builds a message from any streamable arguments.
template <typename... Args>
std::string str_cat(Args&&... args) {
  return detail::concat(std::forward<Args>(args)...);
}

}  // namespace hyserve

// CHECK(cond, msg...) throws hyserve::InvalidArgument naming the condition.
// CHECK_AS(ErrorType, cond, msg...) throws the given error type.
#define HYSERVE_THROW(ErrorType, ...)                                  \
  throw ErrorType(::hyserve::detail::with_location(__FILE__, __LINE__, \
                                                   ::hyserve::detail::concat(__VA_ARGS__)))

#define CHECK_AS(ErrorType, cond, ...)                                               \
  do {                                                                               \
    if (!(cond)) HYSERVE_THROW(ErrorType, "check failed: " #cond ": ", __VA_ARGS__); \
  } while (0)

#define CHECK(cond, ...) CHECK_AS(::hyserve::InvalidArgument, cond, __VA_ARGS__)
