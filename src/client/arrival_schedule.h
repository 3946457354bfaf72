// When each benchmark request is sent, as `vllm bench serve` draws it: the gaps between
// arrivals are gamma-distributed with shape `burstiness` and mean 1 / request_rate
// (burstiness 1 is a Poisson process; below 1 burstier, above 1 more regular); an infinite
// rate sends every request at time 0. A max concurrency applies on top, at run time.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace hyserve::client {

struct ArrivalOptions {
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second
  double burstiness = 1.0;                                        // gamma shape, > 0
  uint64_t seed = 0;
};

// The send time of each of `num_requests`, in seconds from the start: the first at 0, each
// next one gap later (as vLLM, which sends a request and then sleeps a drawn gap).
// Throws InvalidArgument for a rate <= 0 or a burstiness <= 0.
std::vector<double> arrival_times_s(int64_t num_requests, const ArrivalOptions& options);

}  // namespace hyserve::client
