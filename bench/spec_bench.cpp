// hyserve_spec_bench: speculative decoding's time per output token through the engine, with
// synthetic drafts (engine/speculative.h: accepted at a configured mean acceptance length),
// against no speculation in the same run:
//
//   tpot_us          decode time per output token of a request: the wall time from every
//                    request's first token to the last one's finish, over the tokens each
//                    request got after its first (a wave of `batch` requests decoding together)
//   step_us          wall time per engine step of that phase (a verification of 1 + k tokens
//                    per request, its sampling and the KDA commit)
//   acceptance       measured mean tokens per verification (1 + accepted / drafts)
//   speedup          tpot_us without speculation / tpot_us, same batch
//   per_draft_us     (step_us - step_us without speculation) / k: a verified draft's cost
//
//   hyserve_spec_bench [--model DIR | --config CONFIG.json] --batches 1,8,64 --drafts 1,3,5,7
//                      --acceptance 2,3.36,4.6 --tokens 64 [--method ngram]
//
// --method ngram drafts by prompt lookup (1..3-token matches) instead: the acceptance is then
// the model's own, over prompts that repeat a motif (--acceptance is not read).
//
// --config builds the two-layer slice of the layer benchmark (bench/slice.h, random weights,
// FP8 latent and index keys when the config has an indexer). Each (drafts, acceptance) point is
// an engine of its own over a model built again from the same seed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "slice.h"
#include "util/error.h"

namespace hyserve::bench {
namespace {

struct Args {
  std::string model_dir;
  std::string config;
  std::string label = "this";
  std::vector<int64_t> batches = {1, 8, 64};
  std::vector<int64_t> drafts = {1, 3, 5, 7};
  std::vector<double> acceptance = {2.0, 3.36, 4.6};
  int64_t prompt = 128;
  int64_t tokens = 64;  // output tokens per request
  bool enforce_eager = false;
  std::string method = "synthetic";
};

std::unique_ptr<Model> make_model(const Args& a) {
  if (!a.config.empty()) {
    const ModelConfig c = bench::layer_slice(ModelConfig::load(a.config));
    ModelOptions options;
    if (c.has_indexer()) {
      options.indexer_fp8 = true;
      options.latent_cache = LatentCacheDtype::kFp8;
    }
    return Model::create(c, std::make_unique<RandomWeights>(c, 1), options, make_cuda_backend(0));
  }
  const std::string dir =
      a.model_dir.empty() ? std::string(HYSERVE_SOURCE_DIR) + "/models/tiny-kimi-k3" : a.model_dir;
  return Model::load(dir, {}, make_cuda_backend(0));
}

struct Point {
  double tpot_us = 0, step_us = 0, acceptance = 1.0;
  int64_t steps = 0;
};

// One wave of `batch` greedy requests of a.tokens outputs on an engine of this config.
Point run_wave(Engine& engine, const Args& a, int64_t batch, int64_t wave) {
  const int64_t vocab = engine.model().config().vocab_size;
  std::mt19937_64 rng(static_cast<uint64_t>(7 + wave));
  int64_t num_started = 0, num_finished = 0, num_tokens = 0;
  for (int64_t i = 0; i < batch; ++i) {
    Request r;
    r.id = "w" + std::to_string(wave) + "r" + std::to_string(i);
    // Random tokens; for prompt lookup a motif of 16 repeated, which it can draft from.
    const int64_t motif = a.method == "ngram" ? 16 : a.prompt;
    for (int64_t j = 0; j < a.prompt; ++j) {
      r.prompt_token_ids.push_back(j < motif
                                       ? static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab))
                                       : r.prompt_token_ids[static_cast<size_t>(j % motif)]);
    }
    r.sampling_params.temperature = 0.0f;
    r.sampling_params.max_tokens = a.tokens;
    r.sampling_params.ignore_eos = true;
    bool started = false;
    engine.add_request(std::move(r), [&, started](const RequestOutput& o) mutable {
      num_tokens += std::ssize(o.new_tokens);
      if (!started && !o.new_tokens.empty()) {
        started = true;
        ++num_started;
      }
      if (o.finished) ++num_finished;
    });
  }
  while (num_started < batch) engine.step();
  const int64_t tokens_before = num_tokens;
  const SpecDecodeCounts before = engine.stats().spec_decode;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  while (num_finished < batch) {
    engine.step();
    ++steps;
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  const SpecDecodeCounts after = engine.stats().spec_decode;
  Point p;
  p.steps = steps;
  p.step_us = us / static_cast<double>(steps);
  p.tpot_us = us / (static_cast<double>(num_tokens - tokens_before) / static_cast<double>(batch));
  const int64_t drafts = after.num_drafts - before.num_drafts;
  if (drafts > 0) {
    p.acceptance =
        1.0 + static_cast<double>(after.num_accepted_tokens - before.num_accepted_tokens) /
                  static_cast<double>(drafts);
  }
  return p;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app("hyserve_spec_bench: speculative decoding's TPOT with synthetic drafts");
  app.add_option("--model", a.model_dir, "checkpoint folder (default: the bundled tiny model)");
  app.add_option("--config", a.config, "config.json: the two-layer random-weight slice");
  app.add_option("--label", a.label, "names the tree in the JSON lines")->capture_default_str();
  app.add_option("--batches", a.batches, "batch sizes")->delimiter(',');
  app.add_option("--drafts", a.drafts, "num_speculative_tokens values")->delimiter(',');
  app.add_option("--acceptance", a.acceptance, "mean acceptance lengths")->delimiter(',');
  app.add_option("--prompt", a.prompt, "prompt tokens per request")->capture_default_str();
  app.add_option("--tokens", a.tokens, "output tokens per request")->capture_default_str();
  app.add_flag("--enforce-eager", a.enforce_eager, "no CUDA graphs");
  app.add_option("--method", a.method, "synthetic or ngram")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const int64_t max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const std::string model_name =
      a.config.empty() ? "tiny" : std::filesystem::path(a.config).stem().string() + "_slice";
  // (drafts, acceptance) points; drafts 0 is the plain decode.
  CHECK(a.method == "synthetic" || a.method == "ngram", "--method must be synthetic or ngram");
  std::vector<std::pair<int64_t, double>> points = {{0, 1.0}};
  for (int64_t k : a.drafts) {
    if (a.method == "ngram") {
      points.push_back({k, 0.0});
      continue;
    }
    for (double l : a.acceptance) {
      if (l <= static_cast<double>(k + 1)) points.push_back({k, l});
    }
  }
  std::map<int64_t, Point> plain;  // by batch
  for (const auto& [k, length] : points) {
    EngineConfig ec;
    ec.scheduler.max_num_seqs = max_batch;
    ec.scheduler.max_model_len = a.prompt + a.tokens + 16;
    ec.scheduler.max_num_batched_tokens = std::max<int64_t>(8192, max_batch * (1 + k));
    if (!a.enforce_eager) ec.decode_graph_max_batch = max_batch;
    if (k > 0 && a.method == "ngram") {
      ec.speculative.method = SpeculativeMethod::kNgram;
      ec.speculative.num_speculative_tokens = k;
      ec.speculative.prompt_lookup_min = 1;
      ec.speculative.prompt_lookup_max = 3;
    } else if (k > 0) {
      ec.speculative.method = SpeculativeMethod::kSynthetic;
      ec.speculative.num_speculative_tokens = k;
      ec.speculative.acceptance_length = length;
    }
    Engine engine(make_model(a), ec);
    int64_t wave = 0;
    run_wave(engine, a, std::min<int64_t>(max_batch, 8), wave++);  // warm-up (graphs, scratch)
    for (int64_t b : a.batches) {
      const Point p = run_wave(engine, a, b, wave++);
      if (k == 0) plain[b] = p;
      nlohmann::json j;
      j["bench"] = "spec_decode";
      j["tree"] = a.label;
      j["model"] = model_name;
      j["batch"] = b;
      j["context"] = a.prompt;
      j["drafts"] = k;
      j["method"] = k == 0 ? "none" : a.method;
      if (a.method == "synthetic") j["acceptance_target"] = k == 0 ? 1.0 : length;
      j["acceptance"] = p.acceptance;
      j["tpot_us"] = p.tpot_us;
      j["step_us"] = p.step_us;
      j["steps"] = p.steps;
      if (k > 0 && plain.contains(b)) {
        j["speedup"] = plain[b].tpot_us / p.tpot_us;
        j["speedup_over_acceptance"] = plain[b].tpot_us / p.tpot_us / p.acceptance;
        j["per_draft_us"] = (p.step_us - plain[b].step_us) / static_cast<double>(k);
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  try {
    return hyserve::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve_spec_bench: %s\n", e.what());
    return 1;
  }
}
