#include "client/bench_sweep.h"

#include <sstream>

#include "util/error.h"

namespace hyserve::client {
namespace {

constexpr Rgb kBlue{31, 119, 180}, kOrange{255, 127, 14};

double number_at(const nlohmann::ordered_json& j, const char* key) {
  const auto it = j.find(key);
  CHECK(it != j.end() && it->is_number(), "bench sweep: the result has no number '", key, "'");
  return it->get<double>();
}

}  // namespace

SweepPoint sweep_point(int64_t concurrency, const nlohmann::ordered_json& result) {
  SweepPoint p;
  p.concurrency = concurrency;
  p.output_throughput = number_at(result, "output_throughput");
  p.mean_tpot_ms = number_at(result, "mean_tpot_ms");
  p.median_tpot_ms = number_at(result, "median_tpot_ms");
  p.p99_tpot_ms = number_at(result, "p99_tpot_ms");
  p.median_ttft_ms = number_at(result, "median_ttft_ms");
  p.p99_ttft_ms = number_at(result, "p99_ttft_ms");
  p.completed = static_cast<int64_t>(number_at(result, "completed"));
  p.failed = static_cast<int64_t>(number_at(result, "failed"));
  return p;
}

std::vector<FrontierPoint> frontier(const std::vector<SweepPoint>& points, int64_t num_gpus) {
  CHECK(num_gpus >= 1, "--num-gpus must be >= 1");
  std::vector<FrontierPoint> out;
  for (const SweepPoint& p : points)
    out.push_back({p.concurrency, p.mean_tpot_ms > 0 ? 1000.0 / p.mean_tpot_ms : 0.0,
                   p.output_throughput / static_cast<double>(num_gpus)});
  return out;
}

std::vector<int64_t> parse_concurrencies(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CHECK(used == item.size() && value >= 1, "--concurrencies: '", item,
          "' is not a whole number >= 1");
    CHECK(out.empty() || value > out.back(), "--concurrencies must increase, got ", list);
    out.push_back(value);
  }
  CHECK(!out.empty(), "--concurrencies: empty list");
  return out;
}

LineChart frontier_chart(const std::vector<FrontierPoint>& frontier, const std::string& title) {
  LineChart chart;
  chart.title = title;
  chart.x_label = "output tokens/s per user (1000 / mean TPOT)";
  chart.y_label = "output tokens/s per GPU";
  ChartSeries s{"frontier", kBlue, {}, {}, {}};
  for (const FrontierPoint& p : frontier) {
    s.x.push_back(p.tokens_per_s_per_user);
    s.y.push_back(p.tokens_per_s_per_gpu);
    s.labels.push_back("c=" + std::to_string(p.concurrency));
  }
  chart.series.push_back(std::move(s));
  return chart;
}

LineChart latency_chart(const std::vector<SweepPoint>& points, const std::string& metric,
                        const std::string& title) {
  CHECK(metric == "ttft" || metric == "tpot", "latency chart of ", metric);
  const bool ttft = metric == "ttft";
  LineChart chart;
  chart.title = title;
  chart.x_label = "concurrency";
  chart.y_label = ttft ? "TTFT (ms)" : "TPOT (ms)";
  chart.log2_x = true;
  ChartSeries median{ttft ? "median TTFT" : "median TPOT", kBlue, {}, {}, {}};
  ChartSeries p99{ttft ? "p99 TTFT" : "p99 TPOT", kOrange, {}, {}, {}};
  for (const SweepPoint& p : points) {
    median.x.push_back(static_cast<double>(p.concurrency));
    p99.x.push_back(static_cast<double>(p.concurrency));
    median.y.push_back(ttft ? p.median_ttft_ms : p.median_tpot_ms);
    p99.y.push_back(ttft ? p.p99_ttft_ms : p.p99_tpot_ms);
  }
  chart.series = {std::move(median), std::move(p99)};
  return chart;
}

nlohmann::ordered_json sweep_summary_json(const std::vector<SweepPoint>& points, int64_t num_gpus,
                                          const std::vector<std::string>& point_files) {
  const std::vector<FrontierPoint> f = frontier(points, num_gpus);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < points.size(); ++i) {
    const SweepPoint& p = points[i];
    nlohmann::ordered_json row;
    row["concurrency"] = p.concurrency;
    row["completed"] = p.completed;
    row["failed"] = p.failed;
    row["output_throughput"] = p.output_throughput;
    row["output_tokens_per_s_per_user"] = f[i].tokens_per_s_per_user;
    row["output_tokens_per_s_per_gpu"] = f[i].tokens_per_s_per_gpu;
    row["mean_tpot_ms"] = p.mean_tpot_ms;
    row["median_tpot_ms"] = p.median_tpot_ms;
    row["p99_tpot_ms"] = p.p99_tpot_ms;
    row["median_ttft_ms"] = p.median_ttft_ms;
    row["p99_ttft_ms"] = p.p99_ttft_ms;
    row["result_file"] = i < point_files.size() ? point_files[i] : "";
    rows.push_back(std::move(row));
  }
  nlohmann::ordered_json j;
  j["num_gpus"] = num_gpus;
  j["points"] = std::move(rows);
  return j;
}

}  // namespace hyserve::client
