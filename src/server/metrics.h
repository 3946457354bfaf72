// Prometheus metrics with vLLM's names and labels (SERVING.md "Metrics"): model_name and
// engine on every vllm: series. The engine's events (EngineObserver, engine thread) feed
// the per-request histograms and counters; the request handlers add what only they know
// (a request's n, the largest output among its choices), and the HTTP server the
// http_* series (prometheus-fastapi-instrumentator's, which vLLM exposes); gauges come
// from the engine's stats when /metrics is scraped, with the process collectors
// (process_*, from /proc/self).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace hyserve {

// A number as Prometheus' Python client writes it (Python's repr: 1.0, 0.005, 1e+20).
std::string prometheus_number(double v);

class Histogram {
 public:
  explicit Histogram(std::vector<double> buckets)
      : buckets_(std::move(buckets)), counts_(buckets_.size(), 0) {}
  void observe(double v);
  // Appends the samples of this histogram (no HELP / TYPE lines).
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> buckets_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative)
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

// vLLM's 1-2-5 buckets up to `max` (its build_1_2_5_buckets): 1, 2, 5, 10, 20, 50, ...
std::vector<double> buckets_1_2_5(double max);

class ServerMetrics : public EngineObserver {
 public:
  // max_model_len and max_num_batched_tokens bound the token-count buckets.
  ServerMetrics(std::string model_name, int64_t max_model_len, int64_t max_num_batched_tokens);

  // EngineObserver (engine thread).
  void request_finished(const FinishedRequest& r) override;
  void first_token(double ttft_s) override;
  void inter_token(double seconds) override;
  void step(int64_t num_scheduled_tokens) override;

  // A generation request's n and the most tokens one of its choices produced, once it ends.
  void generation_request(int64_t n, int64_t max_generation_tokens);
  // One HTTP request answered: its route (the handler's path, or "none"), method and
  // status code, and the seconds it took (HttpServer::observe).
  void http_request(const std::string& handler, const std::string& method, int status,
                    double seconds);
  // vllm:cache_config_info's labels (block_size, cache_dtype, ...), set once at start.
  void set_cache_config(std::vector<std::pair<std::string, std::string>> labels);

  // The Prometheus exposition text.
  std::string render(const EngineStats& stats) const;

 private:
  std::string model_name_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> success_;  // by finished_reason
  Histogram ttft_, itl_, tpot_, e2e_, queue_, inference_, prefill_, decode_;
  Histogram prompt_tokens_, generation_tokens_, max_tokens_, max_generation_tokens_, n_;
  Histogram iteration_tokens_;
  std::vector<std::pair<std::string, std::string>> cache_config_;
  // (handler, method, status class "2xx") -> count; (handler, method) -> durations.
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> http_counts_;
  std::map<std::pair<std::string, std::string>, Histogram> http_duration_;
};

}  // namespace hyserve
