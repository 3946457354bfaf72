// CPU groups of processes: hyserve_parallel_worker (HYSERVE_PARALLEL_WORKER) ranks meet at a
// TcpStore this test serves and run checked collectives; when one leaves right after the
// rendezvous, the others must fail with CommError within a bounded time, never hang.
#include <gtest/gtest.h>

#if HYSERVE_WITH_GLOO

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/store.h"

extern char** environ;

namespace hyserve::parallel {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kCommErrorExit = 3;  // parallel_worker_main.cpp

struct Worker {
  pid_t pid = -1;
  std::string log_path;  // its stdout + stderr
  int exit_code = -1;    // -1: killed or still running
};

Worker spawn_worker(int port, int rank, int size, bool die_after_rendezvous) {
  Worker w;
  w.log_path = testing::TempDir() + "parallel_worker_" + std::to_string(getpid()) + "_" +
               std::to_string(port) + "_" + std::to_string(rank) + ".log";
  std::vector<std::string> args = {HYSERVE_PARALLEL_WORKER,
                                   "--port",
                                   std::to_string(port),
                                   "--rank",
                                   std::to_string(rank),
                                   "--size",
                                   std::to_string(size),
                                   "--timeout-ms",
                                   "5000"};
  if (die_after_rendezvous) args.push_back("--die-after-rendezvous");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = posix_spawn(&w.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << "posix_spawn " << argv[0];
  return w;
}

std::string read_log(const Worker& w) {
  std::ifstream in(w.log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits for every worker until the deadline, then kills those still running; returns
// whether all exited by themselves.
bool wait_all(std::vector<Worker>& workers, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  bool all_exited = true;
  for (auto& w : workers) {
    int status = 0;
    pid_t r = 0;
    while ((r = waitpid(w.pid, &status, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    if (r == 0) {
      kill(w.pid, SIGKILL);
      waitpid(w.pid, &status, 0);
      all_exited = false;
    }
    w.exit_code = (r == w.pid && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  }
  return all_exited;
}

void remove_logs(const std::vector<Worker>& workers) {
  for (const auto& w : workers) std::remove(w.log_path.c_str());
}

void run_healthy_group(int size) {
  TcpStoreOptions o;
  o.is_server = true;
  TcpStore store(o);
  std::vector<Worker> workers;
  for (int r = 0; r < size; ++r) workers.push_back(spawn_worker(store.port(), r, size, false));
  ASSERT_TRUE(wait_all(workers, 30s)) << "a worker hung";
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(workers[r].exit_code, 0) << "rank " << r << ":\n" << read_log(workers[r]);
  remove_logs(workers);
}

TEST(ParallelWorker, TwoProcesses) {
  run_healthy_group(2);
}
TEST(ParallelWorker, ThreeProcesses) {
  run_healthy_group(3);
}

TEST(ParallelWorker, PeerThatLeavesMakesTheOthersFailInBoundedTime) {
  constexpr int kSize = 3;
  TcpStoreOptions o;
  o.is_server = true;
  TcpStore store(o);
  const auto start = Clock::now();
  std::vector<Worker> workers;
  for (int r = 0; r < kSize; ++r)
    workers.push_back(spawn_worker(store.port(), r, kSize, /*die_after_rendezvous=*/r == 2));
  ASSERT_TRUE(wait_all(workers, 30s)) << "a worker hung";
  EXPECT_LT(Clock::now() - start, 30s);
  EXPECT_EQ(workers[2].exit_code, 0) << read_log(workers[2]);
  for (int r = 0; r < 2; ++r) {
    const std::string log = read_log(workers[r]);
    EXPECT_EQ(workers[r].exit_code, kCommErrorExit) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("CommError"), std::string::npos) << log;
    EXPECT_NE(log.find("rank " + std::to_string(r) + " of 3"), std::string::npos) << log;
  }
  remove_logs(workers);
}

}  // namespace
}  // namespace hyserve::parallel

#endif  // HYSERVE_WITH_GLOO
