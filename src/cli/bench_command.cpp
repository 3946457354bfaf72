// `hyserve bench serve --base-url http://HOST:PORT [...]`: the serving benchmark, flag for
// flag `vllm bench serve` (issue 26): streams a dataset's prompts to any OpenAI-compatible
// server at a request rate and/or a max concurrency, prints vLLM's result table and saves
// its JSON. Datasets random, sharegpt and agentic (multi-turn sessions, run by
// client/agentic_runner). The work is in src/client/; this file turns flags into its options
// and wires in the tokenizer (random and agentic prompts' vocabulary, ShareGPT lengths).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_args.h"
#include "cli/commands.h"
#include "client/agentic_report.h"
#include "client/agentic_runner.h"
#include "client/bench_dataset.h"
#include "client/bench_metrics.h"
#include "client/bench_report.h"
#include "client/bench_runner.h"
#include "client/prometheus_text.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

constexpr double kScrapeTimeoutS = 10.0;

double parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  size_t used = 0;
  double rate = 0;
  try {
    rate = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  CHECK(used == text.size() && rate > 0, "--request-rate must be a positive number or inf, got '",
        text, "'");
  return rate;
}

// The served model's name: --model, else the first of the server's /v1/models.
std::string served_model(const BenchServeArgs& a, const client::BaseUrl& url) {
  if (!a.model.empty()) return a.model;
  const auto body = client::http_get(url, "/v1/models", kScrapeTimeoutS);
  CHECK(body, "--model not given and GET ", a.base_url, "/v1/models failed: is a server there?");
  const auto models = nlohmann::json::parse(*body, nullptr, false);
  CHECK(models.is_object() && models.contains("data") && models["data"].is_array() &&
            !models["data"].empty() && models["data"][0].contains("id"),
        "--model not given and /v1/models lists no model");
  return models["data"][0]["id"].get<std::string>();
}

// The tokenizer: --tokenizer, else --model when it names a checkpoint folder, else none.
std::unique_ptr<Tokenizer> load_tokenizer(const BenchServeArgs& a, std::string& tokenizer_id) {
  tokenizer_id = a.tokenizer;
  if (tokenizer_id.empty() && !a.model.empty() && std::filesystem::is_directory(a.model))
    tokenizer_id = a.model;
  if (tokenizer_id.empty()) return nullptr;
  return Tokenizer::load(tokenizer_id);
}

// Every id a random prompt may hold: assigned, not special.
std::vector<int32_t> random_vocabulary(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const auto token = static_cast<int32_t>(id);
    if (tokenizer.has_token(token) && !tokenizer.is_special(token)) ids.push_back(token);
  }
  return ids;
}

std::vector<client::BenchRequest> make_requests(const BenchServeArgs& a, bool chat,
                                                const Tokenizer* tokenizer) {
  if (a.dataset_name == "sharegpt") {
    CHECK(!a.dataset_path.empty(), "--dataset-name sharegpt needs --dataset-path FILE.json");
    client::ShareGptOptions options{a.num_prompts, a.sharegpt_output_len, a.seed};
    client::TokenCounter count;
    if (tokenizer) {
      count = [tokenizer](std::string_view text) {
        return static_cast<int64_t>(tokenizer->encode(text, false).size());
      };
    }
    return client::load_sharegpt_requests(a.dataset_path, options, count);
  }
  CHECK(a.dataset_name == "random", "--dataset-name must be random, sharegpt or agentic, got '",
        a.dataset_name, "'");
  CHECK(tokenizer,
        "--dataset-name random draws token ids from the served model's vocabulary: pass "
        "--tokenizer MODEL_DIR (the checkpoint folder)");
  client::RandomDatasetOptions options = a.random;
  options.num_prompts = a.num_prompts;
  options.seed = a.seed;
  std::vector<client::BenchRequest> requests =
      client::make_random_requests(options, random_vocabulary(*tokenizer));
  if (chat) {  // a chat message is text: the ids decoded (the server's count may differ)
    for (client::BenchRequest& r : requests) {
      r.prompt_text = replace_invalid_utf8(tokenizer->decode(r.prompt_ids, true));
      r.prompt_ids.clear();
    }
  }
  return requests;
}

std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

void save_result(const BenchServeArgs& a, const client::RunDescription& run,
                 const nlohmann::ordered_json& result) {
  std::filesystem::path path(a.result_filename.empty() ? client::default_result_filename(run)
                                                       : a.result_filename);
  if (!a.result_dir.empty()) path = std::filesystem::path(a.result_dir) / path;
  write_json_file(path, result);
  std::fprintf(stderr, "result saved to %s\n", path.string().c_str());
}

client::BenchRunOptions make_run_options(const BenchServeArgs& a) {
  client::BenchRunOptions options;
  options.base_url = client::parse_base_url(a.base_url);
  options.endpoint = a.endpoint;
  options.api_key = a.api_key;
  options.request.chat = a.endpoint == "/v1/chat/completions";
  options.request.ignore_eos = a.ignore_eos || a.dataset_name != "sharegpt";
  options.request.return_token_ids = a.return_token_ids;
  options.arrivals = {parse_rate(a.request_rate), a.burstiness, a.seed};
  options.max_concurrency = a.max_concurrency;
  options.request_timeout_s = a.request_timeout_s;
  options.show_progress = !a.disable_tqdm && isatty(STDERR_FILENO);
  return options;
}

// The prompts of a run: one request per prompt, or the agentic workload's sessions.
struct Dataset {
  std::vector<client::BenchRequest> requests;
  std::optional<client::AgenticWorkload> agentic;
};

Dataset make_dataset(const BenchServeArgs& a, bool chat, const Tokenizer* tokenizer) {
  if (a.dataset_name != "agentic") return {make_requests(a, chat, tokenizer), std::nullopt};
  CHECK(!chat,
        "--dataset-name agentic sends token ids to /v1/completions, so that every turn's prompt "
        "extends the previous one exactly: drop --endpoint /v1/chat/completions");
  CHECK(tokenizer,
        "--dataset-name agentic draws token ids from the served model's vocabulary: pass "
        "--tokenizer MODEL_DIR (the checkpoint folder)");
  client::AgenticOptions options = a.agentic;
  options.num_sessions = a.num_prompts;
  options.seed = a.seed;
  options.range_ratio = a.random.range_ratio;
  return {{}, client::make_agentic_workload(options, random_vocabulary(*tokenizer))};
}

// Runs the dataset; the agentic workload adds its report lines and result fields.
struct DatasetRun {
  std::vector<client::RequestOutcome> outcomes;
  double duration_s = 0;
  std::string extra_report;
  std::optional<client::AgenticRunResult> agentic;
};

DatasetRun run_dataset(const Dataset& dataset, const client::BenchRunOptions& options) {
  if (!dataset.agentic) {
    client::BenchRunResult r = client::run_benchmark(dataset.requests, options);
    return {std::move(r.outcomes), r.duration_s, "", std::nullopt};
  }
  client::AgenticRunResult r = client::run_agentic_benchmark(*dataset.agentic, options);
  DatasetRun out{r.outcomes, r.duration_s, client::format_agentic_report(r, *dataset.agentic),
                 std::nullopt};
  if (r.num_replies_without_ids > 0)
    log::warn(
        "{} replies came without token ids (return_token_ids unknown to the server?): the "
        "next prompts hold stand-in ids, and the prefix shared with the cache ends there",
        r.num_replies_without_ids);
  out.agentic = std::move(r);
  return out;
}

int exit_code_of(const client::BenchSummary& summary,
                 const std::vector<client::RequestOutcome>& outcomes) {
  if (summary.failed == 0) return 0;
  std::string first_error;
  for (const client::RequestOutcome& o : outcomes)
    if (!o.success && first_error.empty()) first_error = o.error;
  if (summary.completed == 0) {
    log::error("all {} requests failed; the first: {}", summary.failed, first_error);
    return 1;
  }
  log::warn("{} of {} requests failed; the first: {}", summary.failed, outcomes.size(),
            first_error);
  return 0;
}

}  // namespace

void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  CHECK(out, "cannot write the result file ", path.string());
  out << j.dump(2) << "\n";
  CHECK(out.good(), "cannot write the result file ", path.string());
}

BenchPointResult run_bench_point(BenchServeArgs a) {
  if (a.base_url.empty()) a.base_url = "http://" + a.host + ":" + std::to_string(a.port);
  CHECK(a.endpoint == "/v1/completions" || a.endpoint == "/v1/chat/completions",
        "--endpoint must be /v1/completions or /v1/chat/completions, got '", a.endpoint, "'");
  client::SummaryOptions summary_options;
  summary_options.percentile_metrics = client::parse_metric_list(a.percentile_metrics);
  summary_options.percentiles = client::parse_percentile_list(a.metric_percentiles);
  summary_options.goodput_slos_ms = client::parse_goodput(a.goodput);
  client::BenchRunOptions options = make_run_options(a);

  client::RunDescription run;
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(a, run.tokenizer_id);
  const Dataset dataset = make_dataset(a, options.request.chat, tokenizer.get());
  // The model name needs a live server: asked after the flags and the dataset are checked.
  options.request.model =
      a.model.empty() && a.num_prompts > 0 ? served_model(a, options.base_url) : a.model;
  run.base_url = a.base_url;
  run.endpoint = a.endpoint;
  run.model_id = options.request.model;
  run.dataset_name = a.dataset_name;
  run.num_prompts = dataset.agentic ? dataset.agentic->num_turns() : a.num_prompts;
  run.request_rate = options.arrivals.request_rate;
  run.burstiness = a.burstiness;
  run.max_concurrency = a.max_concurrency;
  run.date = local_date();

  const auto scrape = [&] {
    const auto text = client::http_get(options.base_url, "/metrics", kScrapeTimeoutS);
    return text ? client::read_prefix_cache_counters(*text) : std::nullopt;
  };
  const auto counters_before = scrape();
  const DatasetRun result = run_dataset(dataset, options);
  run.prefix_cache_hit_rate = client::prefix_cache_hit_rate(counters_before, scrape());

  BenchPointResult point;
  point.summary =
      client::summarize(result.outcomes, std::max(result.duration_s, 1e-9), summary_options);
  std::fputs(client::format_report(point.summary, summary_options, run).c_str(), stdout);
  std::fputs(result.extra_report.c_str(), stdout);
  std::fflush(stdout);
  point.result = client::result_json(point.summary, summary_options, run, result.outcomes);
  if (result.agentic) client::add_agentic_result(point.result, *result.agentic, *dataset.agentic);
  if (a.save_result) save_result(a, run, point.result);
  point.exit_code = exit_code_of(point.summary, result.outcomes);
  return point;
}

namespace {

void add_agentic_flags(CLI::App& serve, client::AgenticOptions& o) {
  serve.add_option("--agentic-system-len", o.system_len, "system prompt tokens, shared")
      ->capture_default_str();
  serve.add_option("--agentic-user-len", o.user_len, "tokens of a user message")
      ->capture_default_str();
  serve.add_option("--agentic-tool-result-len", o.tool_result_len, "tokens of a tool result")
      ->capture_default_str();
  serve.add_option("--agentic-output-len", o.output_len, "max_tokens of a turn")
      ->capture_default_str();
  serve
      .add_option("--agentic-tool-call-ratio", o.tool_call_ratio,
                  "share of later turns that bring a tool result instead of a user message")
      ->capture_default_str();
  serve.add_option("--agentic-turns-dist", o.turns_dist, "turns per session: geometric or uniform")
      ->capture_default_str();
  serve.add_option("--agentic-min-turns", o.min_turns, "fewest turns of a session")
      ->capture_default_str();
  serve.add_option("--agentic-max-turns", o.max_turns, "most turns of a session")
      ->capture_default_str();
  serve.add_option("--agentic-mean-turns", o.mean_turns, "geometric: mean turns before the cut")
      ->capture_default_str();
  serve.add_option("--agentic-think-time-dist", o.think_time_dist, "exponential or constant")
      ->capture_default_str();
  serve.add_option("--agentic-think-time-s", o.think_time_s, "mean seconds between turns")
      ->capture_default_str();
}

}  // namespace

void add_serve_flags(CLI::App& serve, BenchServeArgs& a) {
  serve.add_option("--base-url", a.base_url, "the server, http://HOST:PORT (else --host/--port)");
  serve.add_option("--host", a.host, "the server's host when no --base-url")->capture_default_str();
  serve.add_option("--port", a.port, "the server's port when no --base-url")->capture_default_str();
  serve.add_option("--endpoint", a.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  serve.add_option("--model", a.model, "the served model name (default: the first of /v1/models)");
  serve.add_option("--tokenizer", a.tokenizer,
                   "checkpoint folder whose tokenizer gives the random vocabulary and ShareGPT "
                   "lengths (default: --model when it is a folder)");
  serve.add_option("--api-key", a.api_key, "sent as Authorization: Bearer KEY");
  serve.add_option("--dataset-name", a.dataset_name, "random, sharegpt or agentic")
      ->capture_default_str();
  serve.add_option("--dataset-path", a.dataset_path, "the ShareGPT JSON file");
  serve.add_option("--num-prompts", a.num_prompts, "requests to send (agentic: sessions)")
      ->capture_default_str();
  serve.add_option("--seed", a.seed, "seed of the dataset and the arrivals")->capture_default_str();
  serve.add_option("--random-input-len", a.random.input_len, "prompt tokens after the prefix")
      ->capture_default_str();
  serve.add_option("--random-output-len", a.random.output_len, "max_tokens")->capture_default_str();
  serve
      .add_option("--random-range-ratio", a.random.range_ratio,
                  "lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str();
  serve
      .add_option("--random-prefix-len", a.random.prefix_len, "random tokens shared by all prompts")
      ->capture_default_str();
  serve.add_option("--sharegpt-output-len", a.sharegpt_output_len,
                   "max_tokens of every ShareGPT request (default: the reply's length)");
  add_agentic_flags(serve, a.agentic);
  serve
      .add_option("--request-rate", a.request_rate,
                  "requests (agentic: session starts) per second, or inf (all at once)")
      ->capture_default_str();
  serve.add_option("--burstiness", a.burstiness, "gamma shape of the arrival gaps (1: Poisson)")
      ->capture_default_str();
  serve.add_option("--max-concurrency", a.max_concurrency,
                   "requests in flight at most (agentic: sessions open at most)");
  serve.add_flag("--ignore-eos", a.ignore_eos, "send ignore_eos (always on for random)");
  serve.add_flag("--return-token-ids", a.return_token_ids,
                 "ask for token ids in every chunk (vLLM's field): one ITL per token chunk even "
                 "when its text is held back");
  serve.add_option("--request-timeout", a.request_timeout_s, "seconds one request may take")
      ->capture_default_str();
  serve.add_option("--percentile-metrics", a.percentile_metrics, "of ttft,tpot,itl,e2el")
      ->capture_default_str();
  serve.add_option("--metric-percentiles", a.metric_percentiles, "e.g. 50,90,99")
      ->capture_default_str();
  serve.add_option("--goodput", a.goodput, "SLOs in ms, e.g. ttft:500 tpot:50");
  serve.add_flag("--save-result", a.save_result, "write the result JSON");
  serve.add_option("--result-dir", a.result_dir, "folder of the result JSON");
  serve.add_option("--result-filename", a.result_filename,
                   "name of the result JSON (default: vLLM's pattern)");
  serve.add_flag("--disable-tqdm", a.disable_tqdm, "no progress line on stderr");
}

std::function<int()> add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmark a running server");
  bench->require_subcommand(1);
  bench->fallthrough();  // --log-level (main.cpp) after `bench serve`
  CLI::App* serve = bench->add_subcommand(
      "serve", "serving benchmark of an OpenAI-compatible server, as `vllm bench serve`");
  auto args = std::make_shared<BenchServeArgs>();
  add_serve_flags(*serve, *args);
  std::function<int()> sweep = add_bench_sweep_command(*bench);
  return [args, serve, sweep] {
    if (serve->parsed()) return run_bench_point(*args).exit_code;
    return sweep();
  };
}

}  // namespace hyserve::cli
