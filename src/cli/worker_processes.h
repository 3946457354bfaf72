// The worker processes of a tensor-parallel `hyserve serve` (vLLM's multiprocessing
// executor): this binary started again with the same arguments, once per local rank, each
// told its place by the environment:
//
//   HYSERVE_TP_RANK     the global rank (> 0)
//   HYSERVE_TP_MASTER   host:port of rank 0's TcpStore (the rendezvous)
//   CUDA_VISIBLE_DEVICES  the one GPU of the rank (the local rank's entry of this
//                       process's list, or the local rank), so every process uses device 0
//
// A child gets SIGTERM when this process dies (PR_SET_PDEATHSIG), so that no worker
// outlives its server.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace hyserve::cli {

struct WorkerPlace {
  int rank = 0;
  std::string master;  // host:port
};

// This process's place when it is a spawned worker (HYSERVE_TP_RANK set); none otherwise.
// Throws Error on malformed values.
std::optional<WorkerPlace> worker_place_from_env();

class WorkerProcesses {
 public:
  WorkerProcesses() = default;
  ~WorkerProcesses();  // terminate(5 s)
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // Starts rank `rank` on local GPU slot `local_rank`. Throws Error when fork fails.
  void spawn(int rank, int local_rank, const std::string& master, bool cuda);
  struct Exit {
    std::string what;  // "rank R (pid P) exited with code C" or "... was killed by signal S"
    bool ok = false;   // exit code 0
  };
  // A worker that exited since the last call; none while all run. Never blocks.
  std::optional<Exit> poll_exit();
  // Whether every worker has exited with code 0 (after poll_exit saw them all).
  bool all_exited() const;
  bool all_succeeded() const;
  // SIGTERM to those still running, SIGKILL after `grace`; reaps them all.
  void terminate(std::chrono::milliseconds grace);

 private:
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    bool exited = false;
    int status = 0;
  };
  std::string describe(const Child& c) const;
  std::vector<Child> children_;
};

}  // namespace hyserve::cli
