// parallel_for: split [0, n) into contiguous ranges over a process-wide pool of
// worker threads. The CPU backend uses it for row-parallel loops; the result of
// every op is independent of the thread count (each output element is written by
// exactly one range, with the same arithmetic order).
#pragma once

#include <cstdint>
#include <functional>

namespace hyserve {

// Calls fn(begin, end) over disjoint ranges covering [0, n). Ranges hold at least
// `min_chunk` items; runs inline when n is small or when called from a worker.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t min_chunk = 1);

// Number of threads parallel_for uses (HYSERVE_NUM_THREADS, else the core count).
int num_cpu_threads();

}  // namespace hyserve
