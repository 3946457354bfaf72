#include "client/bench_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <sstream>

#include "util/error.h"

namespace hyserve::client {
namespace {

constexpr double kMsPerS = 1000.0;

MetricStats stats_ms(const std::vector<double>& values_s, const std::vector<double>& percentiles) {
  MetricStats s;
  if (!values_s.empty()) {
    const double n = static_cast<double>(values_s.size());
    const double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
    double sq = 0;
    for (const double v : values_s) sq += (v - mean) * (v - mean);
    s.mean_ms = mean * kMsPerS;
    s.std_ms = std::sqrt(sq / n) * kMsPerS;
    s.median_ms = percentile(values_s, 50) * kMsPerS;
  }
  for (const double p : percentiles)
    s.percentiles_ms.emplace_back(p, percentile(values_s, p) * kMsPerS);
  return s;
}

double parse_number(std::string_view text, std::string_view what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size(), what,
        ": not a number: '", std::string(text), "'");
  return v;
}

std::vector<std::string> split(const std::string& list, char sep) {
  std::vector<std::string> items;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) items.push_back(item);
  return items;
}

}  // namespace

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const auto low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (rank - static_cast<double>(low)) * (values[high] - values[low]);
}

BenchSummary summarize(const std::vector<RequestOutcome>& outcomes, double duration_s,
                       const SummaryOptions& options) {
  CHECK(duration_s > 0, "benchmark duration must be > 0");
  BenchSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t good = 0;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += o.prompt_len;
    s.total_output_tokens += o.output_tokens;
    double tpot = 0;  // a one-token request has none; goodput counts it as 0
    if (o.output_tokens > 1) {
      tpot = (o.latency_s - o.ttft_s) / static_cast<double>(o.output_tokens - 1);
      tpots.push_back(tpot);
    }
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    const std::map<std::string, double> value_ms = {
        {"ttft", o.ttft_s * kMsPerS}, {"tpot", tpot * kMsPerS}, {"e2el", o.latency_s * kMsPerS}};
    bool meets_slos = true;
    for (const auto& [metric, slo_ms] : options.goodput_slos_ms)
      meets_slos = meets_slos && value_ms.at(metric) <= slo_ms;
    if (meets_slos) ++good;
  }
  s.request_throughput = static_cast<double>(s.completed) / duration_s;
  if (!options.goodput_slos_ms.empty()) s.request_goodput = static_cast<double>(good) / duration_s;
  s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
  s.total_token_throughput =
      static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
  s.stats["ttft"] = stats_ms(ttfts, options.percentiles);
  s.stats["tpot"] = stats_ms(tpots, options.percentiles);
  s.stats["itl"] = stats_ms(itls, options.percentiles);
  s.stats["e2el"] = stats_ms(e2els, options.percentiles);
  return s;
}

std::map<std::string, double> parse_goodput(const std::vector<std::string>& items) {
  std::map<std::string, double> slos;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    CHECK(colon != std::string::npos, "--goodput: '", item,
          "' is not KEY:VALUE (ttft:500 tpot:50 e2el:2000, in ms)");
    const std::string metric = item.substr(0, colon);
    CHECK(metric == "ttft" || metric == "tpot" || metric == "e2el", "--goodput: unknown metric '",
          metric, "' (allowed: ttft, tpot, e2el)");
    const double value = parse_number(std::string_view(item).substr(colon + 1), "--goodput");
    CHECK(value > 0, "--goodput: the SLO of ", metric, " must be > 0 ms, got ", value);
    slos[metric] = value;
  }
  return slos;
}

std::vector<std::string> parse_metric_list(const std::string& list) {
  std::vector<std::string> metrics = split(list, ',');
  for (const std::string& m : metrics)
    CHECK(std::find(metric_names().begin(), metric_names().end(), m) != metric_names().end(),
          "--percentile-metrics: unknown metric '", m, "' (allowed: ttft, tpot, itl, e2el)");
  return metrics;
}

std::vector<double> parse_percentile_list(const std::string& list) {
  std::vector<double> percentiles;
  for (const std::string& item : split(list, ',')) {
    const double p = parse_number(item, "--metric-percentiles");
    CHECK(p > 0 && p <= 100, "--metric-percentiles: ", p, " is not in (0, 100]");
    percentiles.push_back(p);
  }
  return percentiles;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<int64_t>(p));
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace hyserve::client
