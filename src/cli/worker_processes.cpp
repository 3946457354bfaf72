#include "cli/worker_processes.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "util/error.h"

extern char** environ;

namespace hyserve::cli {
namespace {

constexpr const char* kRankVar = "HYSERVE_TP_RANK";
constexpr const char* kMasterVar = "HYSERVE_TP_MASTER";

// This process's argv, as the kernel has it.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  CHECK(!args.empty(), "cannot read /proc/self/cmdline to start the worker processes");
  return args;
}

// The GPU slot `local_rank` names: that entry of CUDA_VISIBLE_DEVICES, or the index.
std::string visible_device(int local_rank) {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr || *env == '\0') return std::to_string(local_rank);
  std::vector<std::string> ids;
  std::string cur;
  for (const char* p = env;; ++p) {
    if (*p == ',' || *p == '\0') {
      ids.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur.push_back(*p);
    }
  }
  CHECK(local_rank < static_cast<int>(ids.size()), "local rank ", local_rank,
        " has no GPU: CUDA_VISIBLE_DEVICES=", env, " lists ", ids.size());
  return ids[static_cast<size_t>(local_rank)];
}

}  // namespace

std::optional<WorkerPlace> worker_place_from_env() {
  const char* rank = std::getenv(kRankVar);
  if (rank == nullptr) return std::nullopt;
  const char* master = std::getenv(kMasterVar);
  WorkerPlace p;
  const std::string text = rank;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), p.rank);
  CHECK(ec == std::errc() && end == text.data() + text.size() && p.rank > 0, kRankVar,
        " must be a rank > 0, got '", text, "'");
  CHECK(master != nullptr && std::strchr(master, ':') != nullptr, kRankVar, " is set but ",
        kMasterVar, " (host:port of rank 0) is not");
  p.master = master;
  return p;
}

WorkerProcesses::~WorkerProcesses() {
  terminate(std::chrono::seconds(5));
}

void WorkerProcesses::spawn(int rank, int local_rank, const std::string& master, bool cuda) {
  // Everything the child needs, built before fork (between fork and exec only
  // async-signal-safe calls).
  const std::vector<std::string> args = own_arguments();
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const auto is = [&](const char* name) { return entry.rfind(std::string(name) + "=", 0) == 0; };
    if (is(kRankVar) || is(kMasterVar) || (cuda && is("CUDA_VISIBLE_DEVICES"))) continue;
    env.push_back(entry);
  }
  env.push_back(str_cat(kRankVar, "=", rank));
  env.push_back(str_cat(kMasterVar, "=", master));
  if (cuda) env.push_back(str_cat("CUDA_VISIBLE_DEVICES=", visible_device(local_rank)));
  std::vector<char*> argv, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  CHECK(pid >= 0, "starting the worker of rank ", rank, ": fork failed: ", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent already died
    // The parent blocks SIGINT / SIGTERM to sigwait for them; the worker takes the defaults.
    // A terminal's ^C reaches the whole process group: the worker ignores it and stops when
    // rank 0 says so (or on SIGTERM), so that rank 0 can drain.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_IGN);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  children_.push_back({rank, pid, false, 0});
}

std::string WorkerProcesses::describe(const Child& c) const {
  if (WIFSIGNALED(c.status)) {
    return str_cat("rank ", c.rank, " (pid ", c.pid, ") was killed by signal ", WTERMSIG(c.status),
                   " (", strsignal(WTERMSIG(c.status)), ")");
  }
  return str_cat("rank ", c.rank, " (pid ", c.pid, ") exited with code ", WEXITSTATUS(c.status));
}

std::optional<WorkerProcesses::Exit> WorkerProcesses::poll_exit() {
  for (Child& c : children_) {
    if (c.exited) continue;
    int status = 0;
    const pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.exited = true;
      c.status = status;
      return Exit{describe(c), WIFEXITED(status) && WEXITSTATUS(status) == 0};
    }
  }
  return std::nullopt;
}

bool WorkerProcesses::all_exited() const {
  for (const Child& c : children_) {
    if (!c.exited) return false;
  }
  return true;
}

bool WorkerProcesses::all_succeeded() const {
  for (const Child& c : children_) {
    if (!c.exited || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) return false;
  }
  return true;
}

void WorkerProcesses::terminate(std::chrono::milliseconds grace) {
  for (const Child& c : children_) {
    if (!c.exited) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!all_exited() && std::chrono::steady_clock::now() < deadline) {
    while (poll_exit()) {
    }
    if (!all_exited()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children_) {
    if (c.exited) continue;
    kill(c.pid, SIGKILL);
    int status = 0;
    waitpid(c.pid, &status, 0);
    c.exited = true;
    c.status = status;
  }
}

}  // namespace hyserve::cli
