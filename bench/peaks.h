// The roofline the benchmarks report against, measured in the same run: the
// device-to-device copy bandwidth. And the medians they time with.
#pragma once

#include <functional>
#include <vector>

namespace hyserve::bench {

// Median of v (0 when empty).
float median(std::vector<float> v);

// Median milliseconds of fn's work on the default stream (CUDA events), over 20 runs
// after 5 warm-ups.
float median_event_ms(const std::function<void()>& fn);

// Device-to-device copy bandwidth of the current GPU, bytes read + written per second
// (2 GiB copies, median of 20 after 5 warm-ups).
double measure_copy_bandwidth();

// A benchmark's main: run(argc, argv), or its exception's message after `name: ` on
// stderr and exit status 1.
int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv);

}  // namespace hyserve::bench
