// hyserve_itl_bench: inter-token latency of decoding streams while a long prompt prefills
// (issue 49), through the Engine as `serve` runs it, on K3.1 Pro-shaped layers on one GPU
// (the layer benchmark's two-layer slice, random weights, FP8 latent and index keys).
//
// --streams requests decode (short prompts, ignore_eos) for --warm-steps steps alone: the
// baseline gaps. Then one --prompt-token prompt arrives and the engine steps until it has
// its first token; every stream's gaps (the wall time between two of its tokens, measured
// where the engine delivers them) are collected in both phases. One JSON line per phase:
// p50 / p90 / p99 / max gap in ms, steps, prefill chunks; and the run's settings (token
// budget, the prefill cost cap: serve's default for the budget unless --max-step-prefill-cost).
// Run it with the cap off (--max-step-prefill-cost 0) for the comparison.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/worker.h"
#include "kv/cache_format.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "peaks.h"
#include "slice.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

void print(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

nlohmann::json gap_summary(const char* phase, const std::vector<double>& gaps_s, int64_t steps) {
  nlohmann::json j;
  j["bench"] = "itl";
  j["phase"] = phase;
  j["steps"] = steps;
  j["gaps"] = gaps_s.size();
  j["p50_ms"] = percentile(gaps_s, 0.50) * 1e3;
  j["p90_ms"] = percentile(gaps_s, 0.90) * 1e3;
  j["p99_ms"] = percentile(gaps_s, 0.99) * 1e3;
  j["max_ms"] = gaps_s.empty() ? 0.0 : *std::max_element(gaps_s.begin(), gaps_s.end()) * 1e3;
  return j;
}

int run(int argc, char** argv) {
  CLI::App app{"Inter-token gaps of decoding streams while a long prompt prefills"};
  std::string config_path =
      std::string(HYSERVE_SOURCE_DIR) + "/../shared/configs/kimi-k3.1-pro-published.json";
  int64_t streams = 64, prompt_tokens = 131072, budget = 8192, warm_steps = 32;
  int64_t cost_cap = -1;
  app.add_option("--config", config_path, "config.json of the model")->capture_default_str();
  app.add_option("--streams", streams, "decoding streams")->capture_default_str();
  app.add_option("--prompt", prompt_tokens, "the long prompt's tokens")->capture_default_str();
  app.add_option("--max-num-batched-tokens", budget, "the step's token budget")
      ->capture_default_str();
  app.add_option("--max-step-prefill-cost", cost_cap,
                 "the step's prefill cost cap (-1: serve's default for the budget, 0: off)")
      ->capture_default_str();
  app.add_option("--warm-steps", warm_steps, "decode steps measured before the prompt arrives")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  CHECK(streams >= 1 && prompt_tokens >= 1 && budget >= 64 && warm_steps >= 2, "bad sizes");

  const ModelConfig c = bench::layer_slice(ModelConfig::load(config_path));
  constexpr int64_t kStreamPrompt = 64;
  // Enough for every step: the long prompt takes one aligned chunk (64 tokens) a step at least.
  const int64_t stream_tokens = warm_steps + 3 + prompt_tokens / 64 + 64;
  const int64_t max_model_len = std::max(prompt_tokens + 1, kStreamPrompt + stream_tokens);

  ModelOptions options;
  options.indexer_fp8 = true;
  options.latent_cache =
      resolve_latent_cache_dtype(parse_latent_cache_dtype("fp8"), c.cache_spec());
  auto model =
      Model::create(c, std::make_unique<RandomWeights>(c, 1), options, make_cuda_backend(0));
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = budget;
  ec.scheduler.max_num_seqs = streams + 1;
  ec.scheduler.max_model_len = max_model_len;
  ec.workspace_bytes = step_workspace_bytes(*model, ec.scheduler);  // as serve sizes it
  model->reserve_decode_scratch(streams + 1, max_model_len);
  ec.scheduler.max_step_prefill_cost =
      cost_cap < 0 ? default_max_step_prefill_cost(ec.scheduler) : cost_cap;
  const CachePlan plan = model->cache_plan(ec.min_block_size);
  ec.num_blocks = static_cast<int32_t>(
      plan.blocks_for_tokens(prompt_tokens + 1) +
      streams * plan.blocks_for_tokens(kStreamPrompt + stream_tokens) + plan.kda_state_rows);
  Engine engine(std::move(model), ec);
  {
    nlohmann::json j;
    j["bench"] = "itl_setup";
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    j["gpu"] = prop.name;
    j["streams"] = streams;
    j["prompt_tokens"] = prompt_tokens;
    j["max_num_batched_tokens"] = budget;
    j["max_step_prefill_cost"] = ec.scheduler.max_step_prefill_cost;
    print(j);
  }

  std::mt19937_64 rng(7);
  const auto random_request = [&](std::string id, int64_t len, int64_t max_tokens) {
    Request r;
    r.id = std::move(id);
    r.prompt_token_ids.resize(static_cast<size_t>(len));
    for (auto& t : r.prompt_token_ids) t = static_cast<int32_t>(rng() % c.vocab_size);
    r.sampling_params.temperature = 0.0f;
    r.sampling_params.max_tokens = max_tokens;
    r.sampling_params.ignore_eos = true;
    return r;
  };
  // Each stream's last token time; its gaps go to the current phase's list.
  std::vector<Clock::time_point> last(static_cast<size_t>(streams));
  std::vector<bool> started(static_cast<size_t>(streams), false);
  std::vector<double>* gaps = nullptr;
  std::vector<double> warm_gaps, long_gaps;
  for (int64_t i = 0; i < streams; ++i) {
    engine.add_request(random_request("s" + std::to_string(i), kStreamPrompt, stream_tokens),
                       [&, i](const RequestOutput& out) {
                         if (out.new_tokens.empty()) return;
                         const auto now = Clock::now();
                         if (started[i] && gaps != nullptr) {
                           gaps->push_back(std::chrono::duration<double>(now - last[i]).count());
                         }
                         started[i] = true;
                         last[i] = now;
                       });
  }
  // The streams' prompts, and two steps to settle (graphs captured, buffers grown).
  for (int k = 0; k < 3; ++k) engine.step();
  gaps = &warm_gaps;
  for (int64_t k = 0; k < warm_steps; ++k) engine.step();
  print(gap_summary("streams_alone", warm_gaps, warm_steps));

  bool long_done = false;
  engine.add_request(random_request("long", prompt_tokens, 1),
                     [&](const RequestOutput& out) { long_done = long_done || out.finished; });
  gaps = &long_gaps;
  int64_t steps = 0;
  const auto t0 = Clock::now();
  while (!long_done && engine.step()) ++steps;
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(long_done, "the long prompt did not finish");
  nlohmann::json j = gap_summary("beside_long_prompt", long_gaps, steps);
  j["prefill_s"] = prefill_s;
  print(j);
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_itl_bench", hyserve::bench::run, argc, argv);
}
