#include "server/control_queue.h"

#include <exception>

#include "util/log.h"

namespace hyserve {

ControlQueue::ControlQueue() : thread_([this] { run(); }) {}

ControlQueue::~ControlQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ControlQueue::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void ControlQueue::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      log::error("control request failed: {}", e.what());
    }
  }
}

}  // namespace hyserve
