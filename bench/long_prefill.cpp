// hyserve_long_prefill: one very long prompt (default 1,048,576 tokens) through K3.1
// Pro-shaped layers on one GPU, the way `serve` runs it: the Engine's scheduler cuts it
// into chunked-prefill steps of --chunk tokens, then decodes --output-tokens tokens at the
// full context. The model is the layer benchmark's: layer 0 = KDA + dense MLP, layer 1 =
// MLA with the DSA indexer + MoE, at the config's true dimensions, random weights; the
// latent cache in FP8 (576 B/token, the DSA kernels' format) or fp32.
//
// What it shows: memory is bounded and known before the prompt starts. As `serve` does,
// a warm-up step of --chunk tokens sizes the op workspaces, the model's workspace is then
// reserved with the indexer's score chunk grown to the whole context (and the op scratch
// with a decode step's at that context), and both the
// workspace and the backend are frozen: any buffer that tried to grow with the context
// would throw. Device memory in use is recorded after every step; the JSON lines report
// it next to what a prompt x context score matrix alone would take.
//
// Output: one JSON line per --progress-every steps (tokens done, time, tokens/s, device
// memory in use), one per decode step, and a summary with the time spent in each op
// (CUDA events around every backend call, as in the layer benchmark).
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

#include "core/cuda/device_buffer.h"
#include "engine/engine.h"
#include "engine/worker.h"
#include "kv/cache_format.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "peaks.h"
#include "slice.h"
#include "timing_backend.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

int64_t device_bytes_in_use() {
  const cuda::MemoryInfo m = cuda::memory_info();
  return static_cast<int64_t>(m.total_bytes - m.free_bytes);
}

void print(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"One long prompt through K3.1 Pro-shaped layers, in bounded memory"};
  std::string config_path =
      std::string(HYSERVE_SOURCE_DIR) + "/../shared/configs/kimi-k3.1-pro-published.json";
  int64_t prompt_tokens = int64_t{1} << 20, chunk = 16384, output_tokens = 4;
  int64_t progress_every = 8;
  std::string kv_cache_dtype = "fp8";
  app.add_option("--config", config_path, "config.json of the model")->capture_default_str();
  app.add_option("--prompt", prompt_tokens, "prompt tokens")->capture_default_str();
  app.add_option("--chunk", chunk, "max_num_batched_tokens (prefill chunk)")->capture_default_str();
  app.add_option("--output-tokens", output_tokens, "tokens decoded after the prompt")
      ->capture_default_str();
  app.add_option("--progress-every", progress_every, "steps between progress lines")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "latent cache: fp8 (576 B/token) or fp32 (auto = fp32)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  CHECK(prompt_tokens >= 1 && chunk >= 64 && output_tokens >= 1, "bad sizes");

  const ModelConfig c = bench::layer_slice(ModelConfig::load(config_path));
  const int64_t max_model_len = prompt_tokens + output_tokens;

  auto timing_owner = std::make_unique<TimingBackend>(make_cuda_backend(0));
  TimingBackend& timing = *timing_owner;
  ModelOptions options;
  options.indexer_fp8 = true;
  options.latent_cache =
      resolve_latent_cache_dtype(parse_latent_cache_dtype(kv_cache_dtype), c.cache_spec());
  auto model =
      Model::create(c, std::make_unique<RandomWeights>(c, 1), options, std::move(timing_owner));
  model->set_trace([&](std::string_view s) { timing.set_section(s); });
  const int64_t weights_bytes = device_bytes_in_use();

  // serve's sizing: a warm-up step of `chunk` tokens, then the context term, then freeze.
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = chunk;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_model_len = max_model_len;
  ec.workspace_bytes = step_workspace_bytes(*model, ec.scheduler);
  model->reserve_decode_scratch(1, max_model_len);

  const CachePlan plan = model->cache_plan(ec.min_block_size);
  ec.num_blocks = static_cast<int32_t>(plan.blocks_for_tokens(max_model_len) + plan.kda_state_rows);
  Engine engine(std::move(model), ec);  // allocates the KV pool
  engine.freeze_memory();
  const int64_t start_bytes = device_bytes_in_use();
  {
    nlohmann::json j;
    j["bench"] = "long_prefill_setup";
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    j["gpu"] = prop.name;
    j["prompt_tokens"] = prompt_tokens;
    j["chunk"] = chunk;
    j["kv_cache_dtype"] = kv_cache_dtype;
    j["weights_bytes"] = weights_bytes;
    j["kv_blocks"] = ec.num_blocks;
    j["kv_row_bytes"] = plan.row_bytes;
    j["kv_pool_bytes"] = int64_t{ec.num_blocks} * plan.row_bytes;
    j["model_workspace_bytes"] = engine.runner().workspace().capacity_bytes();
    j["context_transient_bytes"] = engine.model().context_transient_bytes(max_model_len);
    j["device_bytes_in_use"] = start_bytes;
    // What one [prompt, context] fp32 score matrix alone would take (the thing not built).
    j["full_score_matrix_bytes"] = static_cast<double>(prompt_tokens) * prompt_tokens * 2.0;
    print(j);
  }

  std::mt19937_64 rng(7);
  Request req;
  req.id = "long";
  req.prompt_token_ids.resize(static_cast<size_t>(prompt_tokens));
  for (auto& t : req.prompt_token_ids) t = static_cast<int32_t>(rng() % c.vocab_size);
  req.sampling_params.temperature = 0.0f;
  req.sampling_params.max_tokens = output_tokens;
  req.sampling_params.ignore_eos = true;
  int64_t generated = 0;
  bool finished = false;
  engine.add_request(std::move(req), [&](const RequestOutput& out) {
    generated += static_cast<int64_t>(out.new_tokens.size());
    finished = finished || out.finished;
  });

  std::map<std::pair<std::string, std::string>, double> op_us;
  int64_t peak_bytes = start_bytes, step_index = 0, prompt_done = 0;
  double prefill_s = 0.0, window_s = 0.0;
  int64_t window_tokens = 0;
  while (!finished) {
    const int64_t before = engine.stats().prompt_tokens;
    timing.begin();
    const auto t0 = std::chrono::steady_clock::now();
    if (!engine.step()) break;
    const std::vector<OpRecord> recs = timing.end();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const OpRecord& r : recs) op_us[{r.section, r.op}] += r.time_us;
    peak_bytes = std::max(peak_bytes, device_bytes_in_use());
    const int64_t done = engine.stats().prompt_tokens - before;
    ++step_index;
    if (done > 0) {
      prompt_done += done;
      prefill_s += s;
      window_s += s;
      window_tokens += done;
      if (step_index % progress_every == 0 || prompt_done == prompt_tokens) {
        nlohmann::json j;
        j["bench"] = "long_prefill_progress";
        j["prompt_done"] = prompt_done;
        j["elapsed_s"] = prefill_s;
        j["window_tokens_per_s"] = window_tokens / window_s;
        j["device_bytes_in_use"] = device_bytes_in_use();
        print(j);
        window_s = 0.0;
        window_tokens = 0;
      }
    } else {
      nlohmann::json j;
      j["bench"] = "long_prefill_decode";
      j["context"] = prompt_tokens + generated;
      j["step_ms"] = s * 1e3;
      j["device_bytes_in_use"] = device_bytes_in_use();
      print(j);
    }
  }
  CHECK(finished && generated == output_tokens, "the request did not finish: ", generated, " of ",
        output_tokens, " tokens");

  std::vector<std::pair<double, std::pair<std::string, std::string>>> ranked;
  for (const auto& [k, us] : op_us) ranked.emplace_back(us, k);
  std::sort(ranked.rbegin(), ranked.rend());
  for (const auto& [us, k] : ranked) {
    if (us < 1e4) break;  // ops under 10 ms in total
    nlohmann::json j;
    j["bench"] = "long_prefill_op";
    j["section"] = k.first;
    j["op"] = k.second;
    j["total_s"] = us * 1e-6;
    print(j);
  }
  nlohmann::json j;
  j["bench"] = "long_prefill";
  j["prompt_tokens"] = prompt_tokens;
  j["prefill_s"] = prefill_s;
  j["prefill_tokens_per_s"] = prompt_tokens / prefill_s;
  j["device_bytes_at_start"] = start_bytes;
  j["device_bytes_peak"] = peak_bytes;
  j["grew_bytes"] = peak_bytes - start_bytes;
  print(j);
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_long_prefill", hyserve::bench::run, argc, argv);
}
