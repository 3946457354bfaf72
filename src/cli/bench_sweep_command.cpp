// `hyserve bench sweep --concurrencies 1,2,4,... [bench serve's flags]` (issue 26): runs
// `bench serve` once per concurrency (--max-concurrency set to each), saves each point's
// result JSON and a summary, and draws the frontier (output tokens/s per user against per
// GPU) and TTFT / TPOT against the concurrency as SVG and PNG files in --result-dir.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_args.h"
#include "client/bench_sweep.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

struct BenchSweepArgs {
  BenchServeArgs serve;
  std::string concurrencies = "1,2,4,8,16,32,64";
  int64_t num_gpus = 1;
  // > 0: each point sends at least this many requests (agentic: sessions) per unit of
  // concurrency, so low concurrencies stay short and high ones reach a steady state.
  int64_t prompts_per_concurrency = 0;
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  CHECK(out, "cannot write ", path.string());
  out << text;
  CHECK(out.good(), "cannot write ", path.string());
}

void write_plots(const std::filesystem::path& dir, const std::vector<client::SweepPoint>& points,
                 int64_t num_gpus, const std::string& title) {
  const std::vector<std::pair<std::string, client::LineChart>> charts = {
      {"frontier", client::frontier_chart(client::frontier(points, num_gpus), title)},
      {"ttft", client::latency_chart(points, "ttft", title)},
      {"tpot", client::latency_chart(points, "tpot", title)}};
  for (const auto& [name, chart] : charts) {
    write_text(dir / (name + ".svg"), client::render_svg(chart));
    const std::vector<uint8_t> png = client::render_png(chart);
    write_text(dir / (name + ".png"), std::string(png.begin(), png.end()));
  }
}

int run_bench_sweep(const BenchSweepArgs& a) {
  const std::vector<int64_t> concurrencies = client::parse_concurrencies(a.concurrencies);
  CHECK(a.num_gpus >= 1, "--num-gpus must be >= 1");
  CHECK(a.prompts_per_concurrency >= 0, "--prompts-per-concurrency must be >= 0");
  const std::filesystem::path dir(a.serve.result_dir.empty() ? "." : a.serve.result_dir);
  std::filesystem::create_directories(dir);
  std::vector<client::SweepPoint> points;
  std::vector<std::string> files;
  int exit_code = 0;
  for (const int64_t c : concurrencies) {
    BenchServeArgs point_args = a.serve;
    point_args.max_concurrency = c;
    if (a.prompts_per_concurrency > 0) {
      point_args.num_prompts = std::max(a.serve.num_prompts, a.prompts_per_concurrency * c);
    }
    point_args.save_result = false;  // saved below under a name of the sweep's
    point_args.percentile_metrics = "ttft,tpot,itl,e2el";
    point_args.metric_percentiles = "50,90,99";
    std::fprintf(stderr, "[sweep] concurrency %lld\n", static_cast<long long>(c));
    const BenchPointResult point = run_bench_point(point_args);
    const std::string name = "concurrency-" + std::to_string(c) + ".json";
    write_json_file(dir / name, point.result);
    points.push_back(client::sweep_point(c, point.result));
    files.push_back(name);
    exit_code = std::max(exit_code, point.exit_code);
  }
  write_json_file(dir / "sweep_summary.json",
                  client::sweep_summary_json(points, a.num_gpus, files));
  const std::string title =
      a.serve.dataset_name + " workload, " + std::to_string(a.num_gpus) + " GPU(s)";
  write_plots(dir, points, a.num_gpus, title);
  std::fprintf(stderr, "[sweep] results, sweep_summary.json and plots in %s\n",
               dir.string().c_str());
  return exit_code;
}

}  // namespace

std::function<int()> add_bench_sweep_command(CLI::App& bench) {
  CLI::App* sweep = bench.add_subcommand(
      "sweep", "bench serve at each of a list of concurrencies; the frontier and latency plots");
  auto args = std::make_shared<BenchSweepArgs>();
  add_serve_flags(*sweep, args->serve);
  sweep->add_option("--concurrencies", args->concurrencies, "max concurrencies, e.g. 1,2,4,8")
      ->capture_default_str();
  sweep->add_option("--num-gpus", args->num_gpus, "GPUs serving (throughput per GPU)")
      ->capture_default_str();
  sweep
      ->add_option("--prompts-per-concurrency", args->prompts_per_concurrency,
                   "each point sends max(--num-prompts, this x its concurrency) (0: off)")
      ->capture_default_str();
  return [args, sweep] {
    if (sweep->parsed()) return run_bench_sweep(*args);
    return 1;
  };
}

}  // namespace hyserve::cli
