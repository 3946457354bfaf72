// A serving benchmark's numbers from its requests' outcomes, with `vllm bench serve`'s
// definitions so results compare across clients:
//   TTFT  - send to the first chunk carrying output;
//   ITL   - every gap between consecutive chunks carrying output, all requests pooled;
//   TPOT  - per request (E2E - TTFT) / (output tokens - 1), requests of one token left out;
//   E2EL  - send to the end of the response;
//   mean / median / std (population) / percentiles (linear interpolation, numpy's default)
//   over the successful requests, in milliseconds; throughputs over the run's duration;
//   goodput - successful requests per second that meet every SLO given (ttft, tpot, e2el
//   in ms; a one-token request's TPOT counts as 0, as vLLM).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyserve::client {

// What one request did.
struct RequestOutcome {
  bool success = false;
  std::string error;          // why it failed; empty on success
  int64_t prompt_len = 0;     // the server's usage.prompt_tokens, else the dataset's
  int64_t output_tokens = 0;  // usage.completion_tokens, else chunks carrying output
  double ttft_s = 0.0;
  double latency_s = 0.0;     // E2E
  std::vector<double> itl_s;  // one per chunk carrying output after the first
  // The output's token ids when the chunks carried them (vLLM's return_token_ids), else
  // empty. The agentic workload appends them to the session's next prompt.
  std::vector<int32_t> output_token_ids;
};

// The metric names of --percentile-metrics, in report order.
inline const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> names = {"ttft", "tpot", "itl", "e2el"};
  return names;
}

struct MetricStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct SummaryOptions {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> percentiles = {99};
  std::map<std::string, double> goodput_slos_ms;  // metric -> SLO, empty: no goodput
};

struct BenchSummary {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;
  std::optional<double> request_goodput;
  double output_throughput = 0;
  double total_token_throughput = 0;
  std::map<std::string, MetricStats> stats;  // every metric of metric_names()
};

// numpy.percentile(values, p) with linear interpolation; 0 for no values.
double percentile(std::vector<double> values, double p);

// The summary of a run that took duration_s (> 0).
BenchSummary summarize(const std::vector<RequestOutcome>& outcomes, double duration_s,
                       const SummaryOptions& options);

// "ttft:500 tpot:50" items -> {ttft: 500, tpot: 50}; throws InvalidArgument for an unknown
// metric (allowed: ttft, tpot, e2el), a value that is not a positive number, or a bad item.
std::map<std::string, double> parse_goodput(const std::vector<std::string>& items);

// "ttft,tpot,itl" -> names, each checked against metric_names().
std::vector<std::string> parse_metric_list(const std::string& list);
// "50,90,99" -> percentiles, each in (0, 100].
std::vector<double> parse_percentile_list(const std::string& list);

// vLLM's key word for a percentile: 99 -> "99", 99.9 -> "99.9".
std::string percentile_word(double p);

}  // namespace hyserve::client
