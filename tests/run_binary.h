// Running the hyserve binary (HYSERVE_BINARY, set by tests/CMakeLists.txt) from a test:
// its exit code and its stdout + stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace hyserve::test {

struct RunResult {
  int exit_code;
  std::string output;  // stdout + stderr
};

// Runs a shell command line.
inline RunResult run_command(const std::string& cmd) {
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `hyserve ARGS`.
inline RunResult run(const std::string& args) {
  return run_command(std::string(HYSERVE_BINARY) + " " + args + " 2>&1");
}

}  // namespace hyserve::test
