// The hyserve binary itself: `info` and `generate` as a user runs them.
#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "run_binary.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::run;
using test::run_command;
using test::RunResult;

// `serve` with flags it must refuse: a server that starts instead is killed after 60 s
// (exit code 124), which fails the test rather than hanging it.
RunResult serve_refusing(const std::string& flags) {
  return run_command("timeout 60 " + std::string(HYSERVE_BINARY) + " serve --port 0 " + flags +
                     " 2>&1");
}

std::string shared_configs() {
  return std::string(HYSERVE_SOURCE_DIR) + "/../shared/configs";
}

bool has_shared_configs() {
  FILE* f = std::fopen((shared_configs() + "/kimi-k3.1-pro-published.json").c_str(), "r");
  if (f) std::fclose(f);
  return f != nullptr;
}

TEST(Cli, InfoOnKimiK31ProShowsCacheBytes) {
  if (!has_shared_configs()) GTEST_SKIP() << "shared/configs not found";
  const RunResult r = run("info " + shared_configs() + "/kimi-k3.1-pro-published.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("93 = 69 KDA + 24 MLA+DSA"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fp8          -                  13,824"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fp8          fp8                16,992"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nvfp4        mxfp4              10,080"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total 2.78T"), std::string::npos) << r.output;
}

// The attention backend the flags lead to, as serve would choose it at load.
TEST(Cli, InfoNamesTheAttentionBackend) {
  if (!has_shared_configs()) GTEST_SKIP() << "shared/configs not found";
  const std::string info = "info " + shared_configs() + "/kimi-k3.1-pro-published.json";
  const RunResult def = run(info);
  ASSERT_EQ(def.exit_code, 0) << def.output;
  EXPECT_NE(def.output.find("attention backend: dsa_fp8_fused (sparse MLA over the FP8 latent"),
            std::string::npos)
      << def.output;
  const RunResult dcp = run(info + " --dcp 2");
  EXPECT_NE(dcp.output.find("attention backend: dsa_fp8 ("), std::string::npos) << dcp.output;
  EXPECT_NE(dcp.output.find("the fused DSA decode step not under DCP"), std::string::npos)
      << dcp.output;
  const RunResult bf16 = run(info + " --kv-cache-dtype bf16");
  EXPECT_NE(bf16.output.find("attention backend: mla_sparse"), std::string::npos) << bf16.output;
  const RunResult dense = run(info + " --kv-cache-dtype bf16 --attention-backend mla");
  ASSERT_EQ(dense.exit_code, 0) << dense.output;
  EXPECT_NE(dense.output.find("attention backend: none (attention backend mla cannot run: this "
                              "kimi_k3 model has the DSA indexer"),
            std::string::npos)
      << dense.output;
  const RunResult json = run(info + " --json --index-cache-dtype fp32");
  EXPECT_NE(json.output.find("\"attention_backend\": \"dsa_fp8\""), std::string::npos)
      << json.output;
  const RunResult bad = run(info + " --attention-backend flashmla");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("unknown attention backend 'flashmla'"), std::string::npos)
      << bad.output;
}

TEST(Cli, InfoOnKimiK3ShowsDenseMlaCache) {
  if (!has_shared_configs()) GTEST_SKIP() << "shared/configs not found";
  const RunResult r = run("info " + shared_configs() + "/kimi-k3-published.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("13,824"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MLA (dense)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bounded forget gate, full-rank output gate"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("block AttnRes, a snapshot every 12 layers"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("latent experts at 3584"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total 2.78T"), std::string::npos) << r.output;
  // Every field of the published config is known: no warning.
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
}

TEST(Cli, InfoPrintsTheCachePlan) {
  if (!has_shared_configs()) GTEST_SKIP() << "shared/configs not found";
  RunResult r =
      run("info " + shared_configs() + "/kimi-k3.1-pro-published.json --gpu-memory 141GB --tp 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 4096-token blocks x 16,992 B/token (tests/cache_plan_test.cpp has the hand computation).
  EXPECT_NE(r.output.find("row: 69,599,232 B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
  r = run("info " + shared_configs() +
          "/kimi-k3.1-pro-published.json --gpu-memory 141GB --tp 16 --dcp 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("full contexts fit"), std::string::npos) << r.output;
  r = run("info " + shared_configs() + "/kimi-k3.1-pro-published.json --gpu-memory lots");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--gpu-memory"), std::string::npos) << r.output;
}

TEST(Cli, LogLevelFiltersTheUnknownFieldWarning) {
  const std::string dir = testing::TempDir() + "/hyserve_cli_log_level";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ifstream in(std::string(HYSERVE_SOURCE_DIR) + "/models/tiny-kimi-k3/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(config.front(), '{');
  std::ofstream(dir + "/config.json") << "{\"some_new_knob\": 1," << config.substr(1);
  RunResult r = run("info " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("WARNING"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("some_new_knob"), std::string::npos) << r.output;
  r = run("info " + dir + " --log-level error");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
  r = run("info " + dir + " --log-level verbose");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("verbose"), std::string::npos) << r.output;
}

TEST(Cli, InfoJsonOnBundledModel) {
  const RunResult r = run("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"model_type\": \"kimi_k3\""), std::string::npos) << r.output;
}

TEST(Cli, InfoRefusesUnknownModelTypeNamingTheField) {
  const std::string dir = testing::TempDir() + "/hyserve_cli_bad";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
  std::fputs("{\"model_type\": \"llama\", \"vocab_size\": 10}", f);
  std::fclose(f);
  const RunResult r = run("info " + dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("model_type"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("llama"), std::string::npos) << r.output;
}

TEST(Cli, GenerateGreedyOnBundledModelIsReproducible) {
  const RunResult a = run("generate --prompt-ids 1,2,3,4,5 --max-tokens 8");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto ids_line = [](const std::string& out) {
    const size_t p = out.find("ids:");
    return p == std::string::npos ? std::string() : out.substr(p, out.find('\n', p) - p);
  };
  const std::string ids = ids_line(a.output);
  ASSERT_FALSE(ids.empty()) << a.output;
  int count = 0;
  for (char ch : ids) count += ch == ' ';
  EXPECT_EQ(count, 8) << ids;
  EXPECT_NE(a.output.find("last_logits_xxh64: "), std::string::npos);
  const RunResult b = run("generate --prompt-ids 1,2,3,4,5 --max-tokens 8");
  EXPECT_EQ(a.output.substr(a.output.find("ids:")), b.output.substr(b.output.find("ids:")));
}

// generate's index keys default to serve's (fp8); fp32 is asked for by name. A 48-token
// prompt: past index_topk (8) keys, so the two key formats select differently.
// (On the random-weight tiny K3: the bundled default's index_topk covers these prompts whole.)
TEST(Cli, GenerateIndexKeysDefaultToServes) {
  const auto tail = [](const RunResult& r) { return r.output.substr(r.output.find("ids:")); };
  const std::string request =
      "generate " HYSERVE_SOURCE_DIR
      "/models/tiny-kimi-k3 --max-tokens 16 --prompt-ids "
      "243,606,557,133,378,937,618,485,640,594,67,620,13,"
      "930,857,480,265,564,239,196,734,481,553,856,562,487,406,654,881,154,237,650,155,888,948,"
      "535,399,759,15,687,795,65,163,776,980,605,43,308";
  const RunResult def = run(request);
  const RunResult fp8 = run(request + " --index-cache-dtype fp8");
  const RunResult old = run(request + " --indexer-fp8");
  const RunResult fp32 = run(request + " --index-cache-dtype fp32");
  ASSERT_EQ(def.exit_code, 0) << def.output;
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_EQ(tail(def), tail(fp8));
  EXPECT_EQ(tail(def), tail(old));
  EXPECT_NE(tail(def), tail(fp32));
}

// --kv-cache-dtype auto on the bundled model (a latent narrower than the DSA kernels'):
// bf16, the checkpoint dtype, as vLLM's auto; fp32 (the exact reference) caches other bits.
TEST(Cli, KvCacheDtypeAutoIsBf16ForTheBundledModel) {
  const auto tail = [](const RunResult& r) { return r.output.substr(r.output.find("ids:")); };
  const std::string request = "generate --max-tokens 12 --prompt-ids 5,17,256,31,999,2,64,128";
  const RunResult def = run(request);
  const RunResult bf16 = run(request + " --kv-cache-dtype bf16");
  const RunResult fp32 = run(request + " --kv-cache-dtype fp32");
  ASSERT_EQ(def.exit_code, 0) << def.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_EQ(tail(def), tail(bf16));
  EXPECT_NE(tail(def), tail(fp32));  // the logits' hash differs
}

TEST(Cli, GenerateSeedReproducesSampledTokens) {
  const RunResult a =
      run("generate --prompt-ids 7,8,9 --max-tokens 12 --temperature 1.0 --seed 42");
  const RunResult b =
      run("generate --prompt-ids 7,8,9 --max-tokens 12 --temperature 1.0 --seed 42");
  const RunResult c =
      run("generate --prompt-ids 7,8,9 --max-tokens 12 --temperature 1.0 --seed 43");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto tail = [](const RunResult& r) { return r.output.substr(r.output.find("ids:")); };
  EXPECT_EQ(tail(a), tail(b));
  EXPECT_NE(tail(a), tail(c));
}

TEST(Cli, GenerateRefusesBadInputClearly) {
  RunResult r = run("generate --prompt-ids 1,999999 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("999999"), std::string::npos) << r.output;
  r = run("generate /nonexistent/model --prompt-ids 1 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/model"), std::string::npos) << r.output;
  r = run("generate --prompt-ids 1 --device tpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
  r = run("generate --prompt-ids 1 --index-cache-dtype mxfp4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--index-cache-dtype mxfp4"), std::string::npos) << r.output;
  r = run("generate --prompt-ids 1 --indexer-fp8 --index-cache-dtype fp32");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--indexer-fp8"), std::string::npos) << r.output;
}

// The line of `output` that starts with `key`, without its newline; empty when none.
std::string line_of(const std::string& output, const std::string& key) {
  const size_t at = output.starts_with(key) ? 0 : output.find("\n" + key);
  if (at == std::string::npos) return "";
  const size_t begin = at == 0 ? 0 : at + 1;
  return output.substr(begin, output.find('\n', begin) - begin);
}

// --prompt "text" is the default model's tokenizer's ids as --prompt-ids: the same prompt
// length, ids and logits hash, plus the continuation decoded as text (special tokens dropped).
TEST(Cli, GeneratePromptTextEqualsItsTokenIds) {
  const auto tok =
      Tokenizer::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-k3-speaks");
  const std::string prompt = "The quick brown fox<|im_end|>";
  const std::vector<int32_t> ids = tok->encode(prompt, /*allow_special=*/true);
  std::string ids_arg;
  for (int32_t id : ids) ids_arg += (ids_arg.empty() ? "" : ",") + std::to_string(id);
  const RunResult text = run("generate --prompt '" + prompt + "' --max-tokens 8");
  const RunResult by_ids = run("generate --prompt-ids " + ids_arg + " --max-tokens 8");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.output;
  EXPECT_TRUE(
      line_of(text.output, "prompt: ").starts_with(str_cat("prompt: ", ids.size(), " tokens")))
      << text.output;
  EXPECT_EQ(line_of(text.output, "ids:"), line_of(by_ids.output, "ids:"));
  EXPECT_EQ(line_of(text.output, "last_logits_xxh64:"),
            line_of(by_ids.output, "last_logits_xxh64:"));
  EXPECT_EQ(by_ids.output.find("\ntext: "), std::string::npos);  // --prompt-ids prints as before

  std::vector<int32_t> out;
  std::istringstream in(line_of(text.output, "ids:").substr(4));
  for (int32_t id; in >> id;) out.push_back(id);
  ASSERT_EQ(out.size(), 8u);
  const size_t text_at = text.output.find("\ntext: ");
  ASSERT_NE(text_at, std::string::npos) << text.output;
  EXPECT_EQ(text.output.substr(text_at + 7),
            replace_invalid_utf8(tok->decode(out, /*skip_special=*/true)) + "\n");
}

TEST(Cli, GenerateNeedsExactlyOneOfPromptAndPromptIds) {
  for (const std::string& args :
       {std::string("generate --max-tokens 2"),
        std::string("generate --prompt hi --prompt-ids 1 --max-tokens 2")}) {
    const RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.output.find("exactly one of --prompt"), std::string::npos) << r.output;
  }
}

// vLLM's flag rules, checked before any weight loads (no "kernel plan" line, which
// follows the load): each refusal names the flag and exits non-zero.
TEST(Cli, ServeRefusesBadFlagsBeforeLoading) {
  const struct {
    std::string flags;
    std::string expected;  // in the output
  } cases[] = {
      {"--max-num-seqs 0", "--max-num-seqs must be at least 1, got 0"},
      {"--max-num-seqs -3", "--max-num-seqs must be at least 1, got -3"},
      {"--max-num-batched-tokens 0", "--max-num-batched-tokens must be at least 1, got 0"},
      {"--max-step-prefill-cost -1", "--max-step-prefill-cost must be at least 0 (0: off), got -1"},
      {"--max-model-len 0",
       "--max-model-len must be at least 2 (a prompt token and an output), got 0"},
      {"--max-model-len 1", "--max-model-len must be at least 2"},
      {"--max-model-len 100000",
       "--max-model-len 100000 is greater than the model's "
       "max_position_embeddings (4096"},
      {"--max-num-seqs 4 --max-num-seqs 8", "--max-num-seqs"},
      {"--enable-prefix-caching --enable-prefix-caching", "--enable-prefix-caching"},
      {"--served-model-name a --served-model-name b", "--served-model-name given more than once"},
      {"--allowed-origins https://x.example", "--allowed-origins must be a JSON list of strings"},
      {"--allowed-headers '[1]'", "--allowed-headers must be a JSON list of strings"},
      {"--speculative-config '{\"method\": \"dspark\", \"num_speculative_tokens\": 7}'",
       "method 'dspark' is refused until its drafter is specified"},
      {"--speculative-config '{\"method\": \"ngram\"}'", "num_speculative_tokens is required"},
      {"--speculative-config 'ngram'", "--speculative-config is not JSON"},
      {"--attention-backend flashmla", "unknown attention backend 'flashmla' (one of auto, mla"},
      {"--async-scheduling --speculative-config "
       "'{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'",
       "speculative decoding runs without asynchronous scheduling"},
  };
  for (const auto& c : cases) {
    const RunResult r = serve_refusing(c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << c.flags << " started a server\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("kernel plan"), std::string::npos) << c.flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace hyserve
