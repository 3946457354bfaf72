#include "client/arrival_schedule.h"

#include <cmath>
#include <random>

#include "util/error.h"

namespace hyserve::client {

std::vector<double> arrival_times_s(int64_t num_requests, const ArrivalOptions& options) {
  CHECK(options.request_rate > 0, "--request-rate must be > 0, got ", options.request_rate);
  CHECK(options.burstiness > 0 && std::isfinite(options.burstiness),
        "--burstiness must be a positive number, got ", options.burstiness);
  CHECK(num_requests >= 0, "number of requests must be >= 0");
  std::vector<double> times(static_cast<size_t>(num_requests), 0.0);
  if (std::isinf(options.request_rate)) return times;
  // Gamma(shape k, scale theta) has mean k * theta: theta = 1 / (rate * k) keeps the mean
  // gap at 1 / rate whatever the burstiness.
  const double theta = 1.0 / (options.request_rate * options.burstiness);
  std::mt19937_64 rng(options.seed);
  std::gamma_distribution<double> gap(options.burstiness, theta);
  for (size_t i = 1; i < times.size(); ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

}  // namespace hyserve::client
