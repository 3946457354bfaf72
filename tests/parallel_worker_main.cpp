// hyserve_parallel_worker: one rank of a CPU group for the multi-process tests
// (parallel_worker_test.cpp). Joins the TcpStore at --host:--port as --rank of --size,
// makes the CPU communicator, runs a few collectives and checks their results.
//   --die-after-rendezvous  exit as soon as the group is made, so that its peers fail
// Exit codes: 0 all results right, 1 a wrong result, 2 bad arguments, 3 CommError (the
// message on stderr), 4 any other error.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "parallel/make_communicator.h"
#include "parallel/store.h"

namespace {

using namespace hyserve::parallel;

constexpr int kWrongResult = 1;
constexpr int kBadArguments = 2;
constexpr int kCommError = 3;
constexpr int kOtherError = 4;

struct Args {
  std::string host = "127.0.0.1";
  int port = 0;
  int rank = -1;
  int size = 0;
  int timeout_ms = 5000;
  bool die_after_rendezvous = false;
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--die-after-rendezvous") {
      a.die_after_rendezvous = true;
    } else if (arg == "--host" && has_value) {
      a.host = argv[++i];
    } else if (arg == "--port" && has_value) {
      a.port = std::atoi(argv[++i]);
    } else if (arg == "--rank" && has_value) {
      a.rank = std::atoi(argv[++i]);
    } else if (arg == "--size" && has_value) {
      a.size = std::atoi(argv[++i]);
    } else if (arg == "--timeout-ms" && has_value) {
      a.timeout_ms = std::atoi(argv[++i]);
    } else {
      return false;
    }
  }
  return a.port > 0 && a.size > 0 && a.rank >= 0 && a.rank < a.size && a.timeout_ms > 0;
}

// The collectives, checked; returns false (after printing why) on a wrong result. Run many
// times, so that a peer that left is noticed by the survivors.
bool run_collectives(Communicator& comm, int round) {
  const int rank = comm.rank();
  const int size = comm.size();
  std::vector<float> sum(1000);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(rank + i + round);
  comm.all_reduce(sum.data(), static_cast<int64_t>(sum.size()), ReduceOp::kSum);
  for (size_t i = 0; i < sum.size(); ++i) {
    const float expected = static_cast<float>(size * (size - 1) / 2 + size * (i + round));
    if (sum[i] != expected) {
      std::fprintf(stderr, "rank %d: all_reduce[%zu] = %g, expected %g\n", rank, i, sum[i],
                   expected);
      return false;
    }
  }
  std::vector<int32_t> gathered(size, -1);
  const int32_t mine = rank * 10 + round;
  comm.all_gather(&mine, gathered.data(), sizeof(int32_t));
  for (int r = 0; r < size; ++r) {
    if (gathered[r] != r * 10 + round) {
      std::fprintf(stderr, "rank %d: all_gather[%d] = %d\n", rank, r, gathered[r]);
      return false;
    }
  }
  int32_t value = rank == 0 ? 1234 + round : 0;
  comm.broadcast(&value, sizeof(value), 0);
  if (value != 1234 + round) {
    std::fprintf(stderr, "rank %d: broadcast = %d\n", rank, value);
    return false;
  }
  comm.barrier();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::fprintf(stderr,
                 "usage: %s --port P --rank R --size N [--host H] [--timeout-ms T] "
                 "[--die-after-rendezvous]\n",
                 argv[0]);
    return kBadArguments;
  }
  try {
    TcpStoreOptions options;
    options.host = args.host;
    options.port = args.port;
    options.connect_timeout = std::chrono::milliseconds(args.timeout_ms);
    options.timeout = std::chrono::milliseconds(args.timeout_ms);
    TcpStore store(options);
    auto comm = make_cpu_communicator(store, args.rank, args.size,
                                      std::chrono::milliseconds(args.timeout_ms), "worker");
    if (args.die_after_rendezvous) {
      std::printf("rank %d: leaving after the rendezvous\n", args.rank);
      return 0;
    }
    constexpr int kRounds = 20;
    for (int round = 0; round < kRounds; ++round)
      if (!run_collectives(*comm, round)) return kWrongResult;
    std::printf("rank %d: ok\n", args.rank);
    return 0;
  } catch (const CommError& e) {
    std::fprintf(stderr, "rank %d: CommError: %s\n", args.rank, e.what());
    return kCommError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", args.rank, e.what());
    return kOtherError;
  }
}
