// hyserve_layer_bench: one KDA layer, one MLA+DSA layer and one MoE layer at the true
// dimensions of a config (default ../shared/configs/kimi-k3.1-pro-published.json), random weights
// (RandomWeights: bf16 matrices, MXFP4 experts as the config says), on one GPU.
//
// Cases: decode at batch 1, 8, 64 with --context past tokens per sequence (caches filled
// with random data), and a prefill of --prefill tokens. For each case it prints one JSON
// line per model section (KDA attention, dense MLP, MLA+DSA attention, MoE, embed, lm_head)
// and per op within it: median time over --iters runs, bytes that must move, FLOPs,
// achieved GB/s and TFLOP/s, and their ratios to the device-to-device copy bandwidth and
// the bf16 GEMM rate measured at the start of the same run.
//
// The synthetic model has two decoder layers: layer 0 = KDA + dense MLP (as K3.1 Pro's
// first layer), layer 1 = MLA with the DSA indexer + MoE. Caches: the latent in
// --kv-cache-dtype's format (default auto: the model's serving default, as `serve` picks it;
// fp32 is the reference path), FP8 index keys.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cuda/device_buffer.h"
#include "core/dtype.h"
#include "engine/decode_step.h"
#include "kv/cache_format.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "model/workspace.h"
#include "peaks.h"
#include "slice.h"
#include "timing_backend.h"
#include "util/cuda_check.h"

namespace hyserve::bench {
namespace {

// Fills the cache of a sequence with `context` past tokens in `blocks` (and KDA state row
// `state_block`) with random data of the right kind: the latent and index-key pages of its
// blocks and its KDA state.
void fill_cache(const Model& model, const KvCache& cache, std::span<const int32_t> blocks,
                int32_t state_block, int64_t context, std::mt19937_64& rng) {
  const ModelConfig& c = model.config();
  Backend& b = model.backend();
  const CachePlan& plan = cache.plan();
  auto random_floats = [&](size_t n, float amp) {
    std::vector<float> v(n);
    std::uniform_real_distribution<float> d(-amp, amp);
    for (float& x : v) x = d(rng);
    return v;
  };
  auto in_block = [&](void* page, int32_t block) {
    return static_cast<uint8_t*>(page) + static_cast<int64_t>(block) * plan.row_bytes;
  };
  const auto bs = static_cast<size_t>(plan.block_size);
  const int64_t used_blocks = plan.blocks_for_tokens(context);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_kda(l)) {
      const auto st =
          random_floats(static_cast<size_t>(plan.kda_page(l).recurrent_bytes / 4), 0.05f);
      b.upload(cache.kda_recurrent_state(state_block, l), st.data(), st.size() * 4);
      continue;
    }
    const LatentCacheDtype latent = model.options().latent_cache;
    const auto latent_row_bytes =
        static_cast<size_t>(latent_bytes_per_token(c.cache_spec(), latent));
    for (int64_t i = 0; i < used_blocks; ++i) {
      const int32_t block = blocks[static_cast<size_t>(i)];
      // Random latents in the cache's format: fp32 values, their bf16 bits, or finite e4m3
      // (and, for the other compressed formats, finite) codes.
      std::vector<uint8_t> lat(bs * latent_row_bytes);
      if (latent == LatentCacheDtype::kFp32 || latent == LatentCacheDtype::kBf16) {
        const auto v = random_floats(
            bs * latent_row_bytes / 4 * (latent == LatentCacheDtype::kBf16 ? 2 : 1), 1.0f);
        for (size_t j = 0; j < v.size(); ++j) {
          if (latent == LatentCacheDtype::kFp32) {
            std::memcpy(&lat[4 * j], &v[j], 4);
          } else {
            const uint16_t bits = f32_to_bf16(v[j]);
            std::memcpy(&lat[2 * j], &bits, 2);
          }
        }
      } else {
        for (auto& x : lat) x = static_cast<uint8_t>(rng() & 0x37);  // small finite codes
      }
      b.upload(in_block(cache.latent_page(l), block), lat.data(), lat.size());
      if (!c.has_indexer()) continue;
      if (plan.options.index == IndexCacheDtype::kFp8) {
        std::vector<uint8_t> codes(bs * static_cast<size_t>(c.index_head_dim));
        for (auto& x : codes) x = static_cast<uint8_t>(rng() & 0x77);  // finite e4m3 codes
        b.upload(in_block(cache.index_page(l), block), codes.data(), codes.size());
        const std::vector<float> scales(bs, 1.0f / 64);
        b.upload(in_block(cache.index_scale_page(l), block), scales.data(), scales.size() * 4);
      } else {
        const auto keys = random_floats(bs * static_cast<size_t>(c.index_head_dim), 1.0f);
        b.upload(in_block(cache.index_page(l), block), keys.data(), keys.size() * 4);
      }
    }
  }
  b.synchronize();
}

// A standalone sequence with `context` random past tokens.
void fill_state(const Model& model, SequenceState& s, int64_t context, std::mt19937_64& rng) {
  model.reserve(s, context + 64);
  fill_cache(model, *s.cache, s.blocks, s.state_block, context, rng);
  s.num_tokens = context;
}

struct Peaks {
  double copy_bytes_per_s;
  double gemm_flops_per_s;
};

// Runs `step` iters times and prints one JSON line per section and per (section, op).
void report(const std::string& case_name, int64_t batch, int64_t context, int64_t tokens,
            TimingBackend& timing, const Peaks& peaks, int iters,
            const std::function<void()>& step) {
  std::map<std::pair<std::string, std::string>, std::vector<float>> times;
  std::map<std::pair<std::string, std::string>, OpRecord> totals;
  std::map<std::string, std::vector<float>> section_times;
  std::vector<float> step_times;
  for (int i = 0; i < iters + 2; ++i) {
    timing.begin();
    step();
    const std::vector<OpRecord> recs = timing.end();
    if (i < 2) continue;  // warm-up
    std::map<std::pair<std::string, std::string>, float> sum;
    std::map<std::string, float> section_sum;
    float total = 0;
    for (const OpRecord& r : recs) {
      const auto key = std::make_pair(r.section, r.op);
      sum[key] += r.time_us;
      section_sum[r.section] += r.time_us;
      total += r.time_us;
      if (i == 2) {
        OpRecord& t = totals[key];
        t.section = r.section;
        t.op = r.op;
        t.bytes += r.bytes;
        t.flops += r.flops;
      }
    }
    for (auto& [k, v] : sum) times[k].push_back(v);
    for (auto& [k, v] : section_sum) section_times[k].push_back(v);
    step_times.push_back(total);
  }
  auto emit = [&](const std::string& section, const std::string& op, float us, double bytes,
                  double flops) {
    nlohmann::json j;
    j["bench"] = "layer";
    j["case"] = case_name;
    j["batch"] = batch;
    j["context"] = context;
    j["tokens"] = tokens;
    j["section"] = section;
    j["op"] = op;
    j["time_us"] = us;
    j["bytes"] = bytes;
    j["flops"] = flops;
    const double gbps = bytes / (us * 1e-6) / 1e9, tflops = flops / (us * 1e-6) / 1e12;
    j["gb_per_s"] = gbps;
    j["tflop_per_s"] = tflops;
    j["frac_copy_bw"] = gbps * 1e9 / peaks.copy_bytes_per_s;
    j["frac_gemm"] = tflops * 1e12 / peaks.gemm_flops_per_s;
    std::printf("%s\n", j.dump().c_str());
  };
  std::map<std::string, std::pair<double, double>> section_work;
  for (auto& [k, t] : totals) {
    emit(k.first, k.second, median(times[k]), t.bytes, t.flops);
    section_work[k.first].first += t.bytes;
    section_work[k.first].second += t.flops;
  }
  double all_bytes = 0, all_flops = 0;
  for (auto& [s, v] : section_times) {
    emit(s, "total", median(v), section_work[s].first, section_work[s].second);
    all_bytes += section_work[s].first;
    all_flops += section_work[s].second;
  }
  emit("step", "total", median(step_times), all_bytes, all_flops);
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"Layer benchmark at full model dimensions (random weights)"};
  std::string config_path =
      std::string(HYSERVE_SOURCE_DIR) + "/../shared/configs/kimi-k3.1-pro-published.json";
  int64_t context = 32768, prefill = 4096;
  std::vector<int64_t> batches = {1, 8, 64};
  int iters = 10;
  bool batch_invariant = false;
  app.add_option("--config", config_path, "config.json of the model")->capture_default_str();
  app.add_option("--context", context, "past tokens per sequence in decode")->capture_default_str();
  app.add_option("--prefill", prefill, "prompt tokens of the prefill case")->capture_default_str();
  app.add_option("--batches", batches, "decode batch sizes")->delimiter(',');
  app.add_option("--iters", iters, "timed runs per case")->capture_default_str();
  app.add_flag("--batch-invariant", batch_invariant, "the batch-invariant kernels (serve's flag)");
  std::string kv_cache_dtype = "auto";
  app.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "the latent cache's format (serve's flag; auto: the model's serving default)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const Peaks peaks{measure_copy_bandwidth(), measure_bf16_gemm_rate()};
  {
    nlohmann::json j;
    j["bench"] = "peaks";
    j["copy_gb_per_s"] = peaks.copy_bytes_per_s / 1e9;
    j["bf16_gemm_tflop_per_s"] = peaks.gemm_flops_per_s / 1e12;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    j["gpu"] = prop.name;
    j["batch_invariant"] = batch_invariant;
    std::printf("%s\n", j.dump().c_str());
  }

  const ModelConfig c = bench::layer_slice(ModelConfig::load(config_path));
  std::printf(
      "%s\n",
      nlohmann::json({{"bench", "latent_cache"},
                      {"kv_cache_dtype", kv_cache_dtype},
                      {"latent", latent_cache_dtype_name(resolve_latent_cache_dtype(
                                     parse_latent_cache_dtype(kv_cache_dtype), c.cache_spec()))}})
          .dump()
          .c_str());
  auto timing_owner = std::make_unique<TimingBackend>(make_cuda_backend(0));
  TimingBackend& timing = *timing_owner;
  ModelOptions options;
  options.indexer_fp8 = true;
  options.batch_invariant = batch_invariant;
  options.latent_cache =
      resolve_latent_cache_dtype(parse_latent_cache_dtype(kv_cache_dtype), c.cache_spec());
  auto model =
      Model::create(c, std::make_unique<RandomWeights>(c, 1), options, std::move(timing_owner));
  Workspace ws(&model->backend());
  model->set_trace([&](std::string_view s) {
    const std::string name(s);
    if (name == "layers.0.attention") {
      timing.set_section("kda_attention");
    } else if (name == "layers.0.mlp") {
      timing.set_section("dense_mlp");
    } else if (name == "layers.1.attention") {
      timing.set_section("mla_dsa_attention");
    } else if (name == "layers.1.mlp") {
      timing.set_section("moe");
    } else {
      timing.set_section(name);
    }
  });
  std::mt19937_64 rng(5);

  for (int64_t b : batches) {
    std::vector<SequenceState> states;
    for (int64_t i = 0; i < b; ++i) {
      states.push_back(model->new_sequence(context + 64));
      fill_state(*model, states.back(), context, rng);
    }
    std::vector<int32_t> tokens(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) tokens[i] = static_cast<int32_t>(rng() % c.vocab_size);
    std::vector<float> logits;
    report("decode", b, context, b, timing, peaks, iters, [&] {
      std::vector<SequenceInput> batch;
      for (int64_t i = 0; i < b; ++i) {
        states[i].num_tokens = context;  // same context every run
        batch.push_back(model->prepare(states[i], std::span<const int32_t>(&tokens[i], 1), false));
      }
      model->forward(batch, logits, ws);
    });
  }
  // Decode as the engine runs it: every sequence in one shared pool, so attention runs once
  // for the batch; per-op figures for eager steps, then the whole step's wall time (inputs
  // uploaded, logits downloaded) eager and replaying CUDA graphs.
  for (int64_t b : batches) {
    const CachePlan plan = model->cache_plan();
    const int64_t per_seq = plan.blocks_for_tokens(context + 64);
    auto cache = model->new_cache(b * (per_seq + 1));
    std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < per_seq; ++j)
        blocks[i].push_back(static_cast<int32_t>(i * per_seq + j));
      fill_cache(*model, *cache, blocks[i], static_cast<int32_t>(b * per_seq + i), context, rng);
    }
    std::vector<int32_t> tokens(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) tokens[i] = static_cast<int32_t>(rng() % c.vocab_size);
    std::vector<SequenceInput> batch;
    for (int64_t i = 0; i < b; ++i) {
      batch.push_back({cache.get(), blocks[i], static_cast<int32_t>(b * per_seq + i), context,
                       std::span<const int32_t>(&tokens[i], 1), false});
    }
    std::vector<float> logits;
    // As the runner runs it: the decode step's persistent inputs, eager or from graphs.
    DecodeStep eager_step(*model, *cache, ws, {b, context + 64, 0});
    DecodeStep graph_step(*model, *cache, ws, {b, context + 64, 256});
    DecodeStep* decode = &eager_step;
    auto step = [&] {
      const float* dev = decode->run(batch);
      logits.resize(static_cast<size_t>(b * c.vocab_size));
      model->backend().download(logits.data(), dev, logits.size() * 4);
    };
    report("decode_batched", b, context, b, timing, peaks, iters, step);
    // Whole-step wall time, median of iters after 2 warm-ups (the first captures).
    auto wall_us = [&] {
      std::vector<float> us;
      for (int i = 0; i < iters + 2; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        step();
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 2) us.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
      }
      return median(us);
    };
    const float eager_us = wall_us();
    decode = &graph_step;
    const float graph_us = wall_us();
    nlohmann::json j;
    j["bench"] = "decode_step";
    j["batch"] = b;
    j["context"] = context;
    j["eager_us"] = eager_us;
    j["graph_us"] = graph_us;
    j["graphs_captured"] = graph_step.num_graphs();
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  {
    std::vector<int32_t> prompt(static_cast<size_t>(prefill));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    SequenceState s = model->new_sequence(prefill + 64);
    std::vector<float> logits;
    report("prefill", 1, 0, prefill, timing, peaks, std::max(2, iters / 3), [&] {
      s.num_tokens = 0;
      model->forward(prompt, s, logits);
    });
  }
  return 0;
}

}  // namespace
}  // namespace hyserve::bench

int main(int argc, char** argv) {
  return hyserve::bench::guarded_main("hyserve_layer_bench", hyserve::bench::run, argc, argv);
}
