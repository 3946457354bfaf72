// ControlQueue: one thread that runs the server's blocking control requests (pause, sleep,
// weight transfer) in arrival order, off the HTTP I/O threads, which must never block.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace hyserve {

class ControlQueue {
 public:
  ControlQueue();
  // Runs what is queued, then joins the thread.
  ~ControlQueue();
  ControlQueue(const ControlQueue&) = delete;
  ControlQueue& operator=(const ControlQueue&) = delete;

  // Runs task on the control thread after those posted before it (a task that throws is
  // logged).
  void post(std::function<void()> task);

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the rest is built
};

}  // namespace hyserve
