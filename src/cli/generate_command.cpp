// `hyserve generate [MODEL_DIR] (--prompt-ids 1,2,3 | --prompt "text") --max-tokens N
// [--temperature T] [--seed S] [--device cpu|cuda]`: one request through the engine (the same
// scheduler, model runner and sampler as `serve`: the same request and seed give the same
// tokens), printing the ids and a hash of the logits the last token was drawn from. --prompt
// encodes the text with the model folder's tokenizer as serve does (special-token strings
// become their ids) and also prints the continuation decoded as text (special tokens dropped).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/engine.h"
#include "kv/cache_format.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/logits.h"

namespace hyserve::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::vector<int64_t> prompt_ids;
  std::string prompt;  // text; exactly one of prompt and prompt_ids
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::string device = "cpu";
  bool ignore_eos = false;
  std::string kv_cache_dtype = "auto";
  std::string index_cache_dtype = "fp8";  // serve's default: the same request, the same tokens
  bool indexer_fp8 = false;               // the old spelling of --index-cache-dtype fp8
  std::string attention_backend = "auto";
  bool enforce_eager = false;
  bool batch_invariant = false;
  std::string cpu_gemm = "blas";
};

int run_generate(const GenerateArgs& a) {
  CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '", a.device,
        "'");
  CHECK(a.prompt.empty() != a.prompt_ids.empty(),
        "give exactly one of --prompt \"text\" and --prompt-ids 1,2,3");
  CHECK(a.max_tokens >= 1, "--max-tokens must be >= 1, got ", a.max_tokens);
  const std::filesystem::path dir =
      a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int64_t> prompt_ids = a.prompt_ids;
  if (!a.prompt.empty()) {
    tokenizer = Tokenizer::load(dir);
    // As vLLM's generate: the tokenizer's special prefix / suffix around a text prompt.
    for (int32_t id : tokenizer->encode_prompt(a.prompt, /*add_special_tokens=*/true)) {
      prompt_ids.push_back(id);
    }
  }
  ModelOptions options;
  const IndexCacheDtype index_cache = parse_index_cache_dtype(a.index_cache_dtype);
  CHECK(index_cache != IndexCacheDtype::kMxfp4,
        "--index-cache-dtype mxfp4: not built yet (fp8 or fp32)");
  CHECK(!a.indexer_fp8 || index_cache == IndexCacheDtype::kFp8,
        "--indexer-fp8 contradicts --index-cache-dtype ", a.index_cache_dtype);
  options.indexer_fp8 = index_cache == IndexCacheDtype::kFp8;
  options.latent_cache = resolve_latent_cache_dtype(parse_latent_cache_dtype(a.kv_cache_dtype),
                                                    ModelConfig::load(dir).cache_spec());
  options.batch_invariant = a.batch_invariant;
  options.cpu_gemm = cpu::parse_cpu_gemm(a.cpu_gemm);
  options.attention_backend = parse_attention_backend(a.attention_backend);
  auto model =
      Model::load(dir, options, a.device == "cuda" ? make_cuda_backend(0) : make_cpu_backend());
  const ModelConfig c = model->config();
  for (int64_t id : prompt_ids) {
    CHECK(id >= 0 && id < c.vocab_size, "--prompt-ids: token id ", id,
          " is outside the vocabulary [0, ", c.vocab_size, ")");
  }
  const int64_t max_len = static_cast<int64_t>(prompt_ids.size()) + a.max_tokens;

  EngineConfig ec;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_model_len = max_len;
  if (a.device == "cuda" && !a.enforce_eager) ec.decode_graph_max_batch = 1;
  Engine engine(std::move(model), ec);
  std::string last_hash;
  engine.set_logits_observer(
      [&](const std::string&, std::span<const float> row) { last_hash = hash_logits(row); });

  Request request;
  request.id = "generate";
  for (int64_t id : prompt_ids) request.prompt_token_ids.push_back(static_cast<int32_t>(id));
  request.sampling_params.temperature = a.temperature;
  request.sampling_params.seed = a.seed;
  request.sampling_params.max_tokens = a.max_tokens;
  request.sampling_params.ignore_eos = a.ignore_eos;
  const size_t num_prompt = request.prompt_token_ids.size();
  std::vector<int32_t> out;
  std::optional<std::chrono::steady_clock::time_point> first_token;
  std::string finish_reason;
  const auto t0 = std::chrono::steady_clock::now();
  engine.add_request(std::move(request), [&](const RequestOutput& o) {
    if (!first_token && !o.new_tokens.empty()) first_token = std::chrono::steady_clock::now();
    for (const OutputToken& t : o.new_tokens) out.push_back(t.token);
    if (o.finished) finish_reason = o.finish_reason;
  });
  while (engine.step()) {
  }
  CHECK(engine.alive() && finish_reason != "abort", "generate: the engine failed (see the log)");
  const auto t1 = first_token.value_or(t0), t2 = std::chrono::steady_clock::now();
  const double prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();

  std::printf("model: %s (%s)\n", dir.string().c_str(), c.model_type_name.c_str());
  std::printf("prompt: %zu tokens, prefill %.1f ms; generated %zu tokens, decode %.1f ms\n",
              num_prompt, prefill_ms, out.size(), decode_ms);
  std::printf("ids:");
  for (int32_t id : out) std::printf(" %d", id);
  std::printf("\nlast_logits_xxh64: %s\n", last_hash.c_str());
  if (tokenizer) {
    const std::string text =
        replace_invalid_utf8(tokenizer->decode_output(out, /*skip_special=*/true));
    std::printf("text: %s\n", text.c_str());
  }
  return 0;
}

}  // namespace

std::function<int()> add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt's text or token ids");
  cmd->add_option("model", a->model_dir, "checkpoint folder (default: the bundled tiny kimi_k3)");
  cmd->add_option("--prompt-ids", a->prompt_ids, "prompt token ids, comma separated")
      ->delimiter(',');
  cmd->add_option("--prompt", a->prompt,
                  "prompt text, encoded with the model's tokenizer (instead of --prompt-ids)");
  cmd->add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating after an end-of-sequence token");
  cmd->add_flag("--enforce-eager", a->enforce_eager, "decode without CUDA graphs");
  cmd->add_flag("--batch-invariant", a->batch_invariant,
                "logits bitwise independent of the batch, the chunking and prefix hits");
  cmd->add_option("--cpu-gemm", a->cpu_gemm,
                  "CPU matrix products outside --batch-invariant: blas (OpenBLAS for calls of "
                  "many tokens) or reference (the fp32 reference's fixed order)")
      ->capture_default_str()
      ->envname("HYSERVE_CPU_GEMM");
  cmd->add_option("--index-cache-dtype", a->index_cache_dtype,
                  "DSA index keys: fp8 (the FP8 indexer with the Hadamard rotation, as serve) or "
                  "fp32 (exact scores, as the golden references)")
      ->capture_default_str();
  cmd->add_flag("--indexer-fp8", a->indexer_fp8, "the same as --index-cache-dtype fp8");
  cmd->add_option("--attention-backend", a->attention_backend,
                  "how MLA layers attend: auto, mla, mla_sparse, dsa_fp8 or dsa_fp8_fused (auto: "
                  "from the config and the cache dtypes; see hyserve info)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "MLA latent cache: auto (fp8 for DSA models with a 576-wide latent, else bf16), "
                  "bf16, fp32 or fp8 (DSA models)")
      ->capture_default_str();
  return [a] { return run_generate(*a); };
}

}  // namespace hyserve::cli
