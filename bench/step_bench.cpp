// hyserve_step_bench: the engine's decode step as `serve` runs it (scheduler, model runner,
// forward from a CUDA graph, logits processing, sampling, outputs), per batch size:
//
//   wall_us        median wall time of one decode step (Engine::step on this thread)
//   gpu_us         median GPU busy time of a step: the union of the intervals of every
//                  kernel, copy and memset CUPTI records while the step runs
//   host_us        wall_us - gpu_us: the step's time the GPU is idle, split into
//     gaps_us      idle time between the step's first and last GPU op (launch gaps between
//                  kernels, also inside a graph, and host work between launches)
//     edge_us      wall_us - (last op's end - first op's start): idle before the first op
//                  and after the last (scheduling, input preparation, output processing
//                  the GPU waits for)
//   d2h_bytes      median bytes copied device -> host per step (CUPTI's memcpy records)
//   tokens_per_s   batch / wall
//   step_bytes     the bytes the step must move (model/step_bytes.h: weights, the routed
//                  experts the batch touches under uniform routing, the cache rows attended,
//                  the KDA states read and written), at the timed steps' mean context
//   bound_us       step_bytes / the copy rate measured at the start of the run
//                  (measure_copy_bandwidth, peaks.h: bytes read + written per second)
//   gpu_over_bound gpu_us / bound_us (issue 51: <= 1.25 at batch 1, <= 1.4 at batch 8)
//   projection     with --config: the whole model of that config (every layer) at TP8 and a
//                  32K context, per GPU: its step_bytes, its bound at this run's copy rate,
//                  and that bound times the slice's gpu_over_bound (the step as fast, per
//                  byte, as the slice measured here; the full-model projection)
//
// Only Engine's public API is used, so the same source builds against an older tree and
// both run side by side in one session (`--label` names the tree in the JSON lines).
//
//   hyserve_step_bench [--model DIR | --config CONFIG.json] --batches 1,8,64,256 [--lora-rank R]
//
// --lora-rank R: every request runs with one LoRA adapter of rank R (random A and B, written
// as a PEFT folder in a temporary directory) on every projection the backend adapts (issue 48
// item 2's cost, against a run without it).
//
// --config builds the two-layer slice hyserve_layer_bench uses (one KDA layer with a dense
// MLP, one DSA MLA layer with the MoE; random weights, FP8 latent and index keys);
// --full-config the whole model of a config on random weights, serve's defaults (the decode
// step and its byte bound of a model whose checkpoint is not at hand: issue 26 item 4).
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#if __has_include("backend/backend.h")
#include "backend/backend.h"
#else
#include "model/backend.h"
#endif
#include "engine/engine.h"
#if __has_include("model/step_bytes.h")
#define HYSERVE_STEP_BENCH_BOUND 1
#include "model/step_bytes.h"
#endif
#if __has_include("engine/lora_registry.h")
#define HYSERVE_STEP_BENCH_LORA 1
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/lora_registry.h"
#include "model/lora_table.h"
#include "model/safetensors.h"
#endif
#include "model/model.h"
#include "model/random_weights.h"
#include "peaks.h"
#include "slice.h"

namespace hyserve::bench {
namespace {

#define CUPTI_CHECK(call)                                                                 \
  do {                                                                                    \
    const CUptiResult r_ = (call);                                                        \
    if (r_ != CUPTI_SUCCESS) {                                                            \
      const char* msg_ = nullptr;                                                         \
      cuptiGetResultString(r_, &msg_);                                                    \
      HYSERVE_THROW(Error, #call, " failed: ", msg_ != nullptr ? msg_ : "unknown error"); \
    }                                                                                     \
  } while (0)

// GPU activity intervals (ns, CUPTI's clock) and device-to-host bytes, collected from
// CUPTI's activity buffers.
struct Activity {
  struct Interval {
    uint64_t start = 0, end = 0;
    uint64_t d2h_bytes = 0;
    std::string name;  // kernel (demangled, up to 96 characters), "memcpy" or "memset"
  };
  std::mutex mu;
  std::vector<Interval> intervals;
};
Activity g_activity;

// A kernel's name without its template arguments and parameters, for the breakdown.
std::string kernel_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  for (const std::string drop : {"void ", "(anonymous namespace)::"}) {
    for (size_t at = name.find(drop); at != std::string::npos; at = name.find(drop)) {
      name.erase(at, drop.size());
    }
  }
  if (const size_t cut = name.find_first_of("<("); cut != std::string::npos) name.resize(cut);
  if (name.size() > 96) name.resize(96);
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(g_activity.mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    Activity::Interval iv;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      iv = {k->start, k->end, 0, kernel_name(k->name)};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      iv = {m->start, m->end, m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? m->bytes : 0,
            m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "memcpy DtoH" : "memcpy"};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      iv = {m->start, m->end, 0, "memset"};
    } else {
      continue;
    }
    g_activity.intervals.push_back(iv);
  }
  std::free(buffer);
}

uint64_t cupti_now() {
  uint64_t t = 0;
  CUPTI_CHECK(cuptiGetTimestamp(&t));
  return t;
}

struct StepTimes {
  double busy_ns = 0, span_ns = 0, d2h_bytes = 0;
};

// Busy ns, span (first start to last end) and d2h bytes of the recorded intervals that
// start inside [t0, t1).
StepTimes busy_in(std::vector<Activity::Interval> iv, uint64_t t0, uint64_t t1) {
  std::erase_if(iv, [&](const Activity::Interval& i) { return i.start < t0 || i.start >= t1; });
  std::sort(iv.begin(), iv.end(), [](const Activity::Interval& a, const Activity::Interval& b) {
    return a.start < b.start;
  });
  double busy = 0, bytes = 0;
  uint64_t cur_start = 0, cur_end = 0;
  for (const Activity::Interval& i : iv) {
    bytes += static_cast<double>(i.d2h_bytes);
    if (i.start > cur_end) {
      busy += static_cast<double>(cur_end - cur_start);
      cur_start = i.start;
      cur_end = i.end;
    } else {
      cur_end = std::max(cur_end, i.end);
    }
  }
  busy += static_cast<double>(cur_end - cur_start);
  StepTimes t;
  t.busy_ns = busy;
  t.d2h_bytes = bytes;
  if (!iv.empty()) t.span_ns = static_cast<double>(cur_end - iv.front().start);
  return t;
}

struct Args {
  std::string model_dir;
  std::string config;
  std::string full_config;
  std::string label = "this";
  std::vector<int64_t> batches = {1, 8, 64, 256};
  int64_t prompt = 128;
  int64_t steps = 32;
  int64_t warmup = 4;
  bool enforce_eager = false;
  bool async_scheduling = false;  // serve's default; off: each step waits for its results
  bool kernels = false;   // a breakdown line per batch: GPU time and count per step by kernel
  int64_t lora_rank = 0;  // > 0: every request with an adapter of this rank
};

#ifdef HYSERVE_STEP_BENCH_LORA
// A PEFT folder with random A [r, in] (~1/sqrt(in)) and B [out, r] (~0.01) on every target of
// the model (routed experts included); returns the folder.
std::filesystem::path write_bench_adapter(const Model& model, int64_t rank) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("hyserve_step_bench_lora_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorToWrite> tensors;
  const auto tensor = [](std::string name, std::vector<int64_t> shape,
                         const std::vector<float>& v) {
    TensorToWrite t{std::move(name), DType::kF32, std::move(shape), {}};
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  };
  for (const LoraTargets::Target& t : model.lora_targets()->targets()) {
    const Weight& w = *t.weight;
    std::vector<float> av(static_cast<size_t>(rank * w.cols)),
        bv(static_cast<size_t>(w.rows * rank));
    for (float& v : av) v = normal(rng) / std::sqrt(static_cast<float>(w.cols));
    for (float& v : bv) v = 0.01f * normal(rng);
    const std::string module = "base_model.model.model." + t.name;
    tensors.push_back(tensor(module + ".lora_A.weight", {rank, w.cols}, av));
    tensors.push_back(tensor(module + ".lora_B.weight", {w.rows, rank}, bv));
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  std::ofstream(dir / "adapter_config.json") << nlohmann::json{
      {"r", rank},
      {"lora_alpha", 2 * rank},
      {"target_modules", "all-linear"}}.dump();
  return dir;
}
#endif

std::unique_ptr<Model> make_model(const Args& a) {
  if (!a.full_config.empty()) {
    // Every layer of the config, random weights as serve --load-format dummy makes them.
    const ModelConfig c = ModelConfig::load(a.full_config);
    return Model::create(c, std::make_unique<RandomWeights>(c, 0), {}, make_cuda_backend(0));
  }
  if (!a.config.empty()) {
    const ModelConfig c = bench::layer_slice(ModelConfig::load(a.config));
    ModelOptions options;
    options.indexer_fp8 = true;
    options.latent_cache = LatentCacheDtype::kFp8;
    return Model::create(c, std::make_unique<RandomWeights>(c, 1), options, make_cuda_backend(0));
  }
  const std::string dir =
      a.model_dir.empty() ? std::string(HYSERVE_SOURCE_DIR) + "/models/tiny-kimi-k3" : a.model_dir;
  return Model::load(dir, {}, make_cuda_backend(0));
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app("hyserve_step_bench: the engine's decode step, GPU time vs host time");
  app.add_option("--model", a.model_dir, "checkpoint folder (default: the bundled tiny model)");
  app.add_option("--config", a.config, "config.json: the two-layer random-weight slice");
  app.add_option("--full-config", a.full_config,
                 "config.json: every layer of it, random weights (serve --load-format dummy)");
  app.add_option("--label", a.label, "names the tree in the JSON lines")->capture_default_str();
  app.add_option("--batches", a.batches, "batch sizes")->delimiter(',');
  app.add_option("--prompt", a.prompt, "prompt tokens per request")->capture_default_str();
  app.add_option("--steps", a.steps, "timed decode steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "decode steps before timing")->capture_default_str();
  app.add_flag("--enforce-eager", a.enforce_eager, "no CUDA graphs");
  app.add_flag("--async-scheduling", a.async_scheduling,
               "schedule and launch each step while the one before runs (serve's default)");
  app.add_flag("--kernels", a.kernels, "print the GPU time per step by kernel too");
  app.add_option("--lora-rank", a.lora_rank,
                 "every request with a random LoRA adapter of this rank (0: none)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));

  // The copy rate of this GPU now (peaks.h): bytes read + written per second.
#ifdef HYSERVE_STEP_BENCH_BOUND
  const double copy_bytes_per_s = measure_copy_bandwidth();
#endif

  // One engine for every batch size (the model is built once): each batch size is a wave of
  // requests that runs to completion before the next.
  const int64_t max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const int64_t max_tokens = a.warmup + a.steps + 2;
  const int64_t max_len = a.prompt + max_tokens;
  auto model = make_model(a);
  const ModelConfig c = model->config();
  EngineConfig ec;
  if (!a.enforce_eager) ec.decode_graph_max_batch = max_batch;  // HYSERVE_STEP_BENCH_GRAPHS
  ec.scheduler.max_num_seqs = max_batch;
  ec.async_scheduling = a.async_scheduling;
  ec.scheduler.max_model_len = max_len;
  ec.scheduler.max_num_batched_tokens = std::max<int64_t>(8192, max_batch);
#ifdef HYSERVE_STEP_BENCH_LORA
  if (a.lora_rank > 0) {
    ec.scheduler.max_loras = 1;
    ec.max_lora_rank = a.lora_rank;
  }
#else
  if (a.lora_rank > 0) {
    std::fprintf(stderr, "--lora-rank: this tree has no LoRA\n");
    return 2;
  }
#endif
  Engine engine(std::move(model), ec);
#ifdef HYSERVE_STEP_BENCH_LORA
  std::filesystem::path adapter;
  if (a.lora_rank > 0) {
    adapter = write_bench_adapter(engine.model(), a.lora_rank);
    engine.loras()->load("bench", adapter, false);
  }
#endif
  std::mt19937_64 rng(7);
  int64_t wave = 0;
  for (int64_t b : a.batches) {
    int64_t num_started = 0, num_finished = 0;
    for (int64_t i = 0; i < b; ++i) {
      Request r;
      r.id = "w" + std::to_string(wave) + "r" + std::to_string(i);
      for (int64_t j = 0; j < a.prompt; ++j) {
        r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      }
      r.sampling_params.temperature = 0.8f;
      r.sampling_params.top_p = 0.95f;
      r.sampling_params.seed = static_cast<uint64_t>(i);
      r.sampling_params.max_tokens = max_tokens;
      r.sampling_params.ignore_eos = true;
#ifdef HYSERVE_STEP_BENCH_LORA
      if (a.lora_rank > 0 && !engine.loras()->attach("bench", r)) {
        std::fprintf(stderr, "the bench adapter is not loaded\n");
        return 1;
      }
#endif
      bool started = false;
      engine.add_request(std::move(r),
                         [&num_started, &num_finished, started](const RequestOutput& o) mutable {
                           if (!started && !o.new_tokens.empty()) {
                             started = true;
                             ++num_started;
                           }
                           if (o.finished) ++num_finished;
                         });
    }
    ++wave;
    // Prefill until every request has its first token; then every step decodes b tokens.
    while (num_started < b) engine.step();
    for (int64_t i = 0; i < a.warmup; ++i) engine.step();
    cudaDeviceSynchronize();
    std::vector<uint64_t> t0(static_cast<size_t>(a.steps)), t1(static_cast<size_t>(a.steps));
    std::vector<float> wall_us;
    for (int64_t i = 0; i < a.steps; ++i) {
      t0[i] = cupti_now();
      const auto w0 = std::chrono::steady_clock::now();
      engine.step();
      const auto w1 = std::chrono::steady_clock::now();
      t1[i] = cupti_now();
      wall_us.push_back(std::chrono::duration<float, std::micro>(w1 - w0).count());
    }
    while (num_finished < b) engine.step();
    cudaDeviceSynchronize();
    CUPTI_CHECK(cuptiActivityFlushAll(1));
    std::vector<Activity::Interval> iv;
    {
      std::lock_guard lock(g_activity.mu);
      iv.swap(g_activity.intervals);
    }
    std::vector<float> gpu_us, d2h, gaps_us, edge_us;
    for (int64_t i = 0; i < a.steps; ++i) {
      const StepTimes t = busy_in(iv, t0[i], t1[i]);
      gpu_us.push_back(static_cast<float>(t.busy_ns / 1e3));
      d2h.push_back(static_cast<float>(t.d2h_bytes));
      gaps_us.push_back(static_cast<float>((t.span_ns - t.busy_ns) / 1e3));
      edge_us.push_back(wall_us[static_cast<size_t>(i)] - static_cast<float>(t.span_ns / 1e3));
    }
    const float wall = median(wall_us), gpu = median(gpu_us);
    nlohmann::json j;
    j["bench"] = "decode_step";
    j["tree"] = a.label;
    j["model"] = a.config.empty() ? "tiny" : "k3_slice";
    j["batch"] = b;
    j["context"] = a.prompt;
    j["graphs"] = !a.enforce_eager;
    j["async_scheduling"] = a.async_scheduling;
    j["wall_us"] = wall;
    j["gpu_us"] = gpu;
    j["host_us"] = wall - gpu;
    j["host_over_gpu"] = (wall - gpu) / gpu;
    j["gaps_us"] = median(gaps_us);
    j["edge_us"] = median(edge_us);
    j["d2h_bytes"] = median(d2h);
    j["tokens_per_s"] = static_cast<double>(b) / (wall * 1e-6);
    j["lora_rank"] = a.lora_rank;
#ifdef HYSERVE_STEP_BENCH_BOUND
    {
      const CachePlan plan = engine.model().cache_plan();
      const DecodeStepBytes bytes =
          estimate_decode_step_bytes(c, {.batch = b,
                                         .context = a.prompt + a.warmup + a.steps / 2,
                                         .tp = 1,
                                         .latent = plan.options.latent,
                                         .index = plan.options.index});
      j["step_bytes"] = bytes.total();
      j["step_bytes_parts"] = {{"weights", bytes.weights},
                               {"routed_experts", bytes.routed_experts},
                               {"cache", bytes.cache},
                               {"kda_state", bytes.kda_state}};
      j["copy_gb_per_s"] = copy_bytes_per_s / 1e9;
      if (copy_bytes_per_s > 0) {
        const double bound_us = static_cast<double>(bytes.total()) / copy_bytes_per_s * 1e6;
        j["bound_us"] = bound_us;
        j["gpu_over_bound"] = gpu / bound_us;
        j["wall_over_bound"] = wall / bound_us;
        if (!a.config.empty()) {
          const ModelConfig whole = ModelConfig::load(a.config);
          const DecodeStepBytes full =
              estimate_decode_step_bytes(whole, {.batch = b,
                                                 .context = 32768,
                                                 .tp = 8,
                                                 .latent = plan.options.latent,
                                                 .index = plan.options.index});
          const double full_bound_us = static_cast<double>(full.total()) / copy_bytes_per_s * 1e6;
          j["projection"] = {{"layers", whole.num_hidden_layers},
                             {"tp", 8},
                             {"context", 32768},
                             {"step_bytes_per_gpu", full.total()},
                             {"bound_us", full_bound_us},
                             {"at_slice_efficiency_us", full_bound_us * gpu / bound_us}};
        }
      }
    }
#endif
    std::printf("%s\n", j.dump().c_str());
    if (a.kernels) {
      // GPU time and launches per timed step, by kernel, largest first.
      std::map<std::string, std::pair<double, int64_t>> by_name;
      int64_t launches = 0;
      for (const Activity::Interval& i : iv) {
        for (int64_t k = 0; k < a.steps; ++k) {
          if (i.start < t0[k] || i.start >= t1[k]) continue;
          auto& e = by_name[i.name];
          e.first += static_cast<double>(i.end - i.start);
          ++e.second;
          ++launches;
          break;
        }
      }
      std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(by_name.begin(),
                                                                           by_name.end());
      std::sort(rows.begin(), rows.end(),
                [](const auto& x, const auto& y) { return x.second.first > y.second.first; });
      nlohmann::json k;
      k["bench"] = "decode_step_kernels";
      k["tree"] = a.label;
      k["model"] = j["model"];
      k["batch"] = b;
      k["ops_per_step"] = static_cast<double>(launches) / static_cast<double>(a.steps);
      nlohmann::json list = nlohmann::json::array();
      for (size_t r = 0; r < rows.size() && r < 32; ++r) {
        list.push_back({{"name", rows[r].first},
                        {"us_per_step", rows[r].second.first / 1e3 / static_cast<double>(a.steps)},
                        {"per_step", static_cast<double>(rows[r].second.second) /
                                         static_cast<double>(a.steps)}});
      }
      k["top"] = list;
      std::printf("%s\n", k.dump().c_str());
    }
    std::fflush(stdout);
  }
#ifdef HYSERVE_STEP_BENCH_LORA
  if (!adapter.empty()) std::filesystem::remove_all(adapter);
#endif
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_step_bench", hyserve::bench::run, argc, argv);
}
