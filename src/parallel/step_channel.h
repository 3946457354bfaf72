// The leader's control channel to its workers: rank 0 sends each step's plan (and the stop
// message) to every other rank, each worker answers every plan with an acknowledgement, or
// with the error that ended it. TCP (Boost.Asio), one connection per worker, so that it
// works across nodes; the collectives run on the Communicator, not here.
//
// Frames: kind u8 | length u64 | payload. Leader -> worker: plan. Worker -> leader: hello
// (its rank, once), ack (the step, u64), error (a message). The leader reads each worker's
// frames on a thread of its own, so that a failure is known while the leader is busy or
// idle: an error frame, or a connection that closes before the leader closed it (the
// worker exited or was killed), is recorded as "rank R: ...".
//
// Every blocking call is bounded: accepting the workers and sending (SO_SNDTIMEO) by the
// timeout given; a worker waits for the next plan without a bound (the server may be idle)
// but sees the leader's exit as a closed connection.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/store.h"

namespace hyserve::parallel {

class LeaderChannel {
 public:
  // Listens on host:port (port 0: a free one, see port()).
  LeaderChannel(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~LeaderChannel();
  LeaderChannel(const LeaderChannel&) = delete;
  LeaderChannel& operator=(const LeaderChannel&) = delete;

  int port() const;
  // Returns once ranks 1 .. size - 1 have each connected and said hello; CommError naming
  // the ranks still missing at the timeout, or a rank that said hello twice or is out of
  // range.
  void accept_workers(int size);
  // Sends the payload to every worker (rank order). Throws CommError with the first failure
  // recorded (see failure()) instead of sending, or naming the rank whose send failed.
  void send(const Bytes& payload);
  // The first worker failure seen ("rank R: message"), if any.
  std::optional<std::string> failure() const;
  // The last step each worker acknowledged, index rank - 1.
  std::vector<uint64_t> acked() const;
  // Waits until every worker acknowledged `step` or a failure is known, at most `timeout`;
  // returns the ranks that had not (empty: all did).
  std::vector<int> wait_acked(uint64_t step, std::chrono::milliseconds timeout) const;
  // Closes every connection (the workers see end of stream) and joins the readers; first
  // waits up to `grace` for the workers to close theirs (after a stop plan).
  void close(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class WorkerChannel {
 public:
  // Connects to the leader at host:port, retrying until connect_timeout; says hello.
  WorkerChannel(const std::string& host, int port, int rank,
                std::chrono::milliseconds connect_timeout);
  ~WorkerChannel();
  WorkerChannel(const WorkerChannel&) = delete;
  WorkerChannel& operator=(const WorkerChannel&) = delete;

  // The next plan; none when the leader closed the connection. CommError on a malformed
  // frame.
  std::optional<Bytes> receive();
  void ack(uint64_t step);
  // Tells the leader why this worker stops (best effort: never throws).
  void report_error(const std::string& message) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyserve::parallel
