// Prometheus metrics with vLLM's names (SERVING.md "Metrics"), label model_name.
// Counters and histograms are updated by the request handlers; gauges come from the
// engine's stats when /metrics is scraped.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace hyserve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> buckets)
      : buckets_(std::move(buckets)), counts_(buckets_.size(), 0) {}
  void observe(double v);
  // Appends the Prometheus text of this histogram.
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> buckets_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative)
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void request_finished(const std::string& finish_reason, double e2e_s);
  void first_token(double ttft_s);
  void inter_token(double itl_s);
  void queue_time(double seconds);
  // The Prometheus exposition text.
  std::string render(const EngineStats& stats) const;

 private:
  std::string model_name_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> success_;  // by finished_reason
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_;
};

}  // namespace hyserve
