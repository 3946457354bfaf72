// `hyserve bench sweep`: one benchmark result per concurrency, and what is drawn from them.
// The frontier (SemiAnalysis' AgentX plot) puts each concurrency at
//   x = output tokens/s per user = 1000 / mean TPOT (ms)   (a user's decode speed)
//   y = output tokens/s per GPU  = output throughput / num_gpus
// so that moving along it trades interactivity for throughput; the latency charts show
// TTFT and TPOT (median, p99) against the concurrency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/line_chart.h"

namespace hyserve::client {

struct SweepPoint {
  int64_t concurrency = 0;
  double output_throughput = 0;  // tok/s, the whole run
  double mean_tpot_ms = 0, median_tpot_ms = 0, p99_tpot_ms = 0;
  double median_ttft_ms = 0, p99_ttft_ms = 0;
  int64_t completed = 0, failed = 0;
};

// The point of one --save-result document (needs mean/median/p99 of ttft and tpot).
SweepPoint sweep_point(int64_t concurrency, const nlohmann::ordered_json& result);

struct FrontierPoint {
  int64_t concurrency = 0;
  double tokens_per_s_per_user = 0;  // 0 when no request had a TPOT
  double tokens_per_s_per_gpu = 0;
};

std::vector<FrontierPoint> frontier(const std::vector<SweepPoint>& points, int64_t num_gpus);

// "1,2,4,8" -> {1, 2, 4, 8}: each >= 1, strictly increasing; InvalidArgument otherwise.
std::vector<int64_t> parse_concurrencies(const std::string& list);

LineChart frontier_chart(const std::vector<FrontierPoint>& frontier, const std::string& title);
LineChart latency_chart(const std::vector<SweepPoint>& points, const std::string& metric,
                        const std::string& title);  // metric: "ttft" or "tpot"

// The sweep's summary document: its settings, each point and its frontier coordinates, the
// files written.
nlohmann::ordered_json sweep_summary_json(const std::vector<SweepPoint>& points, int64_t num_gpus,
                                          const std::vector<std::string>& point_files);

}  // namespace hyserve::client
