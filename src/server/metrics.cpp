#include "server/metrics.h"

#include <cstdio>

namespace hyserve {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void counter(std::string& out, const std::string& name, const std::string& help,
             const std::string& labels, double v) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n";
  out += name + "{" + labels + "} " + number(v) + "\n";
}

void gauge(std::string& out, const std::string& name, const std::string& help,
           const std::string& labels, double v) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
  out += name + "{" + labels + "} " + number(v) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (v <= buckets_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + labels + ",le=\"" + number(buckets_[i]) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
  out += name + "_sum{" + labels + "} " + number(sum_) + "\n";
}

ServerMetrics::ServerMetrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      queue_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
              30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::request_finished(const std::string& finish_reason, double e2e_s) {
  std::lock_guard<std::mutex> lk(mu_);
  ++success_[finish_reason];
  e2e_.observe(e2e_s);
}

void ServerMetrics::first_token(double ttft_s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(ttft_s);
}

void ServerMetrics::queue_time(double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  queue_.observe(seconds);
}

void ServerMetrics::inter_token(double itl_s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(itl_s);
}

std::string ServerMetrics::render(const EngineStats& s) const {
  const std::string l = "model_name=\"" + model_name_ + "\"";
  std::string out;
  gauge(out, "vllm:num_requests_running", "Number of requests running on the engine.", l,
        static_cast<double>(s.num_running));
  gauge(out, "vllm:num_requests_waiting", "Number of requests waiting to be scheduled.", l,
        static_cast<double>(s.num_waiting));
  gauge(out, "vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", l,
        s.kv_cache_usage);
  counter(out, "vllm:prefix_cache_queries_total", "Prefix-cache queries, in tokens.", l,
          static_cast<double>(s.prefix_cache_queries));
  counter(out, "vllm:prefix_cache_hits_total", "Prefix-cache hits, in tokens.", l,
          static_cast<double>(s.prefix_cache_hits));
  counter(out, "vllm:num_preemptions_total", "Preemptions by recompute.", l,
          static_cast<double>(s.num_preemptions));
  counter(out, "vllm:prompt_tokens_total", "Prompt tokens computed.", l,
          static_cast<double>(s.prompt_tokens));
  counter(out, "vllm:generation_tokens_total", "Tokens generated.", l,
          static_cast<double>(s.generation_tokens));
  // No speculative decoding yet: these stay 0.
  counter(out, "vllm:spec_decode_num_drafts_total", "Speculative drafts.", l, 0);
  counter(out, "vllm:spec_decode_num_draft_tokens_total", "Speculative draft tokens.", l, 0);
  counter(out, "vllm:spec_decode_num_accepted_tokens_total", "Accepted draft tokens.", l, 0);
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP vllm:request_success_total Finished requests by finish reason.\n";
  out += "# TYPE vllm:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort"}) {
    const auto it = success_.find(reason);
    out += std::string("vllm:request_success_total{") + l + ",finished_reason=\"" + reason +
           "\"} " + std::to_string(it == success_.end() ? 0 : it->second) + "\n";
  }
  out += "# HELP vllm:time_to_first_token_seconds Time to first token.\n";
  out += "# TYPE vllm:time_to_first_token_seconds histogram\n";
  ttft_.render(out, "vllm:time_to_first_token_seconds", l);
  out += "# HELP vllm:inter_token_latency_seconds Time between tokens.\n";
  out += "# TYPE vllm:inter_token_latency_seconds histogram\n";
  itl_.render(out, "vllm:inter_token_latency_seconds", l);
  out += "# HELP vllm:e2e_request_latency_seconds End-to-end request latency.\n";
  out += "# TYPE vllm:e2e_request_latency_seconds histogram\n";
  e2e_.render(out, "vllm:e2e_request_latency_seconds", l);
  out += "# HELP vllm:request_queue_time_seconds Time from arrival to first scheduling.\n";
  out += "# TYPE vllm:request_queue_time_seconds histogram\n";
  queue_.render(out, "vllm:request_queue_time_seconds", l);
  return out;
}

}  // namespace hyserve
