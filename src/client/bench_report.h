// A serving benchmark's results for people and for files: the terminal table in the layout
// of `vllm bench serve`, and the --save-result JSON with vLLM's field names (so scripts that
// read vLLM's results read ours), plus the prefix-cache hit rate scraped from the server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/bench_metrics.h"

namespace hyserve::client {

// What the run was, beside its numbers.
struct RunDescription {
  std::string backend = "openai";  // vLLM's name of the protocol driven
  std::string base_url;
  std::string endpoint;
  std::string model_id;
  std::string tokenizer_id;
  std::string dataset_name;
  int64_t num_prompts = 0;
  double request_rate = 0;  // infinity when unbounded
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  std::optional<double> prefix_cache_hit_rate;  // nullopt: the server reports none
  std::string date;                             // "YYYYMMDD-HHMMSS", local time
};

// The result table, lines of vLLM's layout, ending in a newline.
std::string format_report(const BenchSummary& summary, const SummaryOptions& options,
                          const RunDescription& run);

// The --save-result document: vLLM's keys, per-request arrays over every request sent
// (failed ones with output length 0, TTFT 0, no ITLs and their error); `e2els` (seconds,
// per request) is ours, beside vLLM's `ttfts` and `itls`.
nlohmann::ordered_json result_json(const BenchSummary& summary, const SummaryOptions& options,
                                   const RunDescription& run,
                                   const std::vector<RequestOutcome>& outcomes);

// vLLM's default result file name: "openai-{rate}qps[-concurrency{N}]-{model}-{date}.json",
// the model's last path component.
std::string default_result_filename(const RunDescription& run);

}  // namespace hyserve::client
