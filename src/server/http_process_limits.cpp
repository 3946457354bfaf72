// The process-level setup of the HTTP server: see http_process_limits.h.
#include "server/http_process_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "util/log.h"

namespace hyserve {

void raise_open_file_limit(int max_connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) getrlimit(RLIMIT_NOFILE, &limit);
  }
  static std::atomic<bool> warned{false};
  if (limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < static_cast<rlim_t>(max_connections) + 64 && !warned.exchange(true)) {
    log::warn(
        "open-file limit {} (hard limit {}) is below --max-connections {}: fewer "
        "connections than that can be accepted",
        limit.rlim_cur, limit.rlim_max, max_connections);
  }
}

int resolve_num_io_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 4u));
}

}  // namespace hyserve
