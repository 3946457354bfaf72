// The flags of `hyserve bench serve` and the one benchmark run behind it, shared with
// `hyserve bench sweep` (bench_sweep_command.cpp), which runs it once per concurrency.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "client/agentic_workload.h"
#include "client/bench_dataset.h"
#include "client/bench_metrics.h"

namespace hyserve::cli {

struct BenchServeArgs {
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string tokenizer;
  std::string api_key;
  std::string dataset_name = "random";
  std::string dataset_path;
  int64_t num_prompts = 1000;
  uint64_t seed = 0;
  client::RandomDatasetOptions random;
  std::optional<int64_t> sharegpt_output_len;
  client::AgenticOptions agentic;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  bool ignore_eos = false;
  bool return_token_ids = false;
  double request_timeout_s = 6 * 3600.0;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::vector<std::string> goodput;
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
  bool disable_tqdm = false;
};

// Registers every flag of `bench serve` on `command`.
void add_serve_flags(CLI::App& command, BenchServeArgs& a);

// One benchmark run: the dataset, the requests, the report on stdout, the result file when
// a.save_result. exit_code: 1 when every request failed, else 0.
struct BenchPointResult {
  client::BenchSummary summary;
  nlohmann::ordered_json result;  // the --save-result document
  int exit_code = 0;
};
BenchPointResult run_bench_point(BenchServeArgs a);

// Writes `j` (indented) to `path`, creating its folder; throws naming the file on failure.
void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j);

// `bench sweep` on the `bench` command (bench_sweep_command.cpp); the action to run when it
// is chosen.
std::function<int()> add_bench_sweep_command(CLI::App& bench);

}  // namespace hyserve::cli
