// The roofline both benchmarks report against, measured in the same run: the
// device-to-device copy bandwidth. And the median they time with.
#pragma once

#include <vector>

namespace hyserve::bench {

// Median of v (0 when empty).
float median(std::vector<float> v);

// Device-to-device copy bandwidth of the current GPU, bytes read + written per second
// (2 GiB copies, median of 20 after 5 warm-ups).
double measure_copy_bandwidth();

}  // namespace hyserve::bench
