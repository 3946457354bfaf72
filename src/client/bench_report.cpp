#include "client/bench_report.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace hyserve::client {
namespace {

constexpr int kWidth = 50;

// "-----Title-----" centred in kWidth with `fill`.
std::string banner(const std::string& title, char fill) {
  const int pad = kWidth - static_cast<int>(title.size());
  const int left = pad / 2;
  return std::string(static_cast<size_t>(std::max(0, left)), fill) + title +
         std::string(static_cast<size_t>(std::max(0, pad - left)), fill) + "\n";
}

std::string row(const std::string& label, const std::string& value) {
  return fmt::format("{:<40} {:<10}\n", label, value);
}

std::string number(double v) {
  return fmt::format("{:.2f}", v);
}

struct MetricLabel {
  const char* key;
  const char* title;  // banner
  const char* short_name;
};

const MetricLabel kMetricLabels[] = {
    {"ttft", "Time to First Token", "TTFT"},
    {"tpot", "Time per Output Token (excl. 1st token)", "TPOT"},
    {"itl", "Inter-token Latency", "ITL"},
    {"e2el", "End-to-end Latency", "E2EL"},
};

std::string rate_text(double rate) {
  return std::isinf(rate) ? "inf" : fmt::format("{}", rate);
}

}  // namespace

std::string format_report(const BenchSummary& s, const SummaryOptions& options,
                          const RunDescription& run) {
  std::string out = banner(" Serving Benchmark Result ", '=');
  out += row("Successful requests:", std::to_string(s.completed));
  out += row("Failed requests:", std::to_string(s.failed));
  if (run.max_concurrency)
    out += row("Maximum request concurrency:", std::to_string(*run.max_concurrency));
  out += row("Request rate configured (RPS):", rate_text(run.request_rate));
  out += row("Benchmark duration (s):", number(s.duration_s));
  out += row("Total input tokens:", std::to_string(s.total_input_tokens));
  out += row("Total generated tokens:", std::to_string(s.total_output_tokens));
  out += row("Request throughput (req/s):", number(s.request_throughput));
  if (s.request_goodput) out += row("Request goodput (req/s):", number(*s.request_goodput));
  out += row("Output token throughput (tok/s):", number(s.output_throughput));
  out += row("Total Token throughput (tok/s):", number(s.total_token_throughput));
  out += row("Prefix cache hit rate:",
             run.prefix_cache_hit_rate ? fmt::format("{:.2f}%", *run.prefix_cache_hit_rate * 100)
                                       : std::string("n/a"));
  for (const MetricLabel& m : kMetricLabels) {
    if (std::find(options.percentile_metrics.begin(), options.percentile_metrics.end(), m.key) ==
        options.percentile_metrics.end())
      continue;
    const MetricStats& st = s.stats.at(m.key);
    out += banner(m.title, '-');
    out += row(fmt::format("Mean {} (ms):", m.short_name), number(st.mean_ms));
    out += row(fmt::format("Median {} (ms):", m.short_name), number(st.median_ms));
    for (const auto& [p, v] : st.percentiles_ms)
      out += row(fmt::format("P{} {} (ms):", percentile_word(p), m.short_name), number(v));
  }
  out += std::string(kWidth, '=') + "\n";
  return out;
}

nlohmann::ordered_json result_json(const BenchSummary& s, const SummaryOptions& options,
                                   const RunDescription& run,
                                   const std::vector<RequestOutcome>& outcomes) {
  nlohmann::ordered_json j;
  j["date"] = run.date;
  j["backend"] = run.backend;
  j["base_url"] = run.base_url;
  j["endpoint"] = run.endpoint;
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = run.tokenizer_id;
  j["dataset_name"] = run.dataset_name;
  j["num_prompts"] = run.num_prompts;
  // JSON has no infinity: vLLM writes the string "inf".
  if (std::isinf(run.request_rate)) {
    j["request_rate"] = "inf";
  } else {
    j["request_rate"] = run.request_rate;
  }
  j["burstiness"] = run.burstiness;
  j["max_concurrency"] = run.max_concurrency ? nlohmann::ordered_json(*run.max_concurrency)
                                             : nlohmann::ordered_json(nullptr);
  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["request_goodput"] = s.request_goodput ? nlohmann::ordered_json(*s.request_goodput)
                                           : nlohmann::ordered_json(nullptr);
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["prefix_cache_hit_rate"] = run.prefix_cache_hit_rate
                                   ? nlohmann::ordered_json(*run.prefix_cache_hit_rate)
                                   : nlohmann::ordered_json(nullptr);
  for (const std::string& metric : options.percentile_metrics) {
    const MetricStats& st = s.stats.at(metric);
    j["mean_" + metric + "_ms"] = st.mean_ms;
    j["median_" + metric + "_ms"] = st.median_ms;
    j["std_" + metric + "_ms"] = st.std_ms;
    for (const auto& [p, v] : st.percentiles_ms)
      j["p" + percentile_word(p) + "_" + metric + "_ms"] = v;
  }
  // Arrays built first: j is an ordered_json, whose members move when a key is added.
  using Array = nlohmann::ordered_json;
  Array input_lens = Array::array(), output_lens = Array::array(), ttfts = Array::array(),
        e2els = Array::array(), itls = Array::array(), errors = Array::array();
  for (const RequestOutcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttfts.push_back(o.success ? o.ttft_s : 0.0);
    e2els.push_back(o.success ? o.latency_s : 0.0);
    itls.push_back(o.success ? o.itl_s : std::vector<double>{});
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["e2els"] = std::move(e2els);  // beyond vLLM's keys
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  return j;
}

std::string default_result_filename(const RunDescription& run) {
  std::string model = run.model_id;
  while (!model.empty() && model.back() == '/') model.pop_back();
  const size_t slash = model.rfind('/');
  if (slash != std::string::npos) model = model.substr(slash + 1);
  std::string name = run.backend + "-" + rate_text(run.request_rate) + "qps";
  if (run.max_concurrency) name += "-concurrency" + std::to_string(*run.max_concurrency);
  return name + "-" + model + "-" + run.date + ".json";
}

}  // namespace hyserve::client
