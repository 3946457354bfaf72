// `hyserve bench serve` end to end: the binary drives the real OpenAI server (the bundled
// model, in this process, loopback) and its saved JSON must account for every token asked
// for; against a port where nothing listens, every request fails, the run says why and
// exits non-zero.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "run_binary.h"
#include "tiny_openai_server.h"

namespace hyserve {
namespace {

using test::run;
using test::RunResult;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return nlohmann::json::parse(in);
}

std::string bench_flags(int port, const std::string& result_file) {
  return str_cat("bench serve --base-url http://127.0.0.1:", port, " --tokenizer ",
                 test::tiny_model_dir().string(),
                 " --num-prompts 8 --random-input-len 12 --random-output-len 6 --seed 5"
                 " --save-result --result-filename ",
                 result_file, " --disable-tqdm");
}

void expect_every_token(const nlohmann::json& j, bool one_itl_per_token) {
  EXPECT_EQ(j["completed"], 8);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_input_tokens"], 8 * 12);
  EXPECT_EQ(j["total_output_tokens"], 8 * 6);                    // ignore_eos: exactly max_tokens
  EXPECT_EQ(j["model_id"], test::TinyOpenAIServer::kModelName);  // from /v1/models
  ASSERT_EQ(j["ttfts"].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(j["input_lens"][i], 12);
    EXPECT_EQ(j["output_lens"][i], 6);
    EXPECT_EQ(j["errors"][i], "");
    const double ttft = j["ttfts"][i];
    const double e2el = j["e2els"][i];
    EXPECT_GT(ttft, 0.0);
    EXPECT_LE(ttft, e2el);
    const size_t num_itls = j["itls"][i].size();
    if (one_itl_per_token) {
      EXPECT_EQ(num_itls, 5u) << "request " << i;
    } else {
      EXPECT_LE(num_itls, 5u) << "request " << i;  // held-back text may share a chunk
    }
    double sum = 0;
    for (double itl : j["itls"][i]) sum += itl;
    EXPECT_LE(ttft + sum, e2el + 1e-9);
  }
  EXPECT_GT(j["request_throughput"].get<double>(), 0.0);
  EXPECT_TRUE(j.contains("p99_ttft_ms"));
  // A rate in [0, 1], or null when no prompt token was looked up (the in-process server's
  // engine config has prefix caching off).
  const auto& hit_rate = j["prefix_cache_hit_rate"];
  if (!hit_rate.is_null()) {
    EXPECT_GE(hit_rate.get<double>(), 0.0);
    EXPECT_LE(hit_rate.get<double>(), 1.0);
  }
}

TEST(BenchServe, RandomPromptsAgainstTheRealServer) {
  test::TinyOpenAIServer server;
  const std::string file = testing::TempDir() + "/bench_serve_random.json";
  // One ITL per token: token ids in every chunk.
  RunResult r = run(bench_flags(server.port(), file) + " --return-token-ids --max-concurrency 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Serving Benchmark Result"), std::string::npos) << r.output;
  expect_every_token(read_json(file), true);
  // Text chunks only, at a Poisson rate.
  r = run(bench_flags(server.port(), file) + " --request-rate 200 --percentile-metrics ttft,e2el");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_every_token(read_json(file), false);
}

TEST(BenchServe, NothingListeningFailsEveryRequest) {
  const std::string file = testing::TempDir() + "/bench_serve_refused.json";
  // Port 1 on loopback: nothing listens there (connection refused at once).
  const RunResult r = run(str_cat("bench serve --base-url http://127.0.0.1:1 --model tiny",
                                  " --tokenizer ", test::tiny_model_dir().string(),
                                  " --num-prompts 5 --random-input-len 4 --random-output-len 2",
                                  " --save-result --result-filename ", file));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all 5 requests failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot connect"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(file);
  EXPECT_EQ(j["completed"], 0);
  EXPECT_EQ(j["failed"], 5);
  EXPECT_TRUE(j["prefix_cache_hit_rate"].is_null());
  for (const auto& e : j["errors"])
    EXPECT_NE(e.get<std::string>().find("cannot connect"), std::string::npos);
}

TEST(BenchServe, ServerErrorsAreCountedNotFatal) {
  test::TinyOpenAIServer server;
  const std::string file = testing::TempDir() + "/bench_serve_errors.json";
  // An unknown model name: every request answered 404 with OpenAI's error body.
  const RunResult r = run(bench_flags(server.port(), file) + " --model no-such-model");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const nlohmann::json j = read_json(file);
  EXPECT_EQ(j["failed"], 8);
  EXPECT_NE(j["errors"][0].get<std::string>().find("HTTP 404"), std::string::npos) << j["errors"];
}

// Two sessions of three turns: every turn completes, and each turn's prompt is the previous
// turn's prompt + its reply + the new user message or tool result, token for token (the
// server's usage counts what arrived).
TEST(BenchServe, AgenticSessionsResendTheConversation) {
  test::TinyOpenAIServer server;
  const std::string file = testing::TempDir() + "/bench_serve_agentic.json";
  const RunResult r = run(
      str_cat("bench serve --base-url http://127.0.0.1:", server.port(), " --tokenizer ",
              test::tiny_model_dir().string(),
              " --dataset-name agentic --num-prompts 2 --max-concurrency 2 --seed 3",
              " --agentic-system-len 16 --agentic-user-len 6 --agentic-tool-result-len 10",
              " --agentic-output-len 5 --agentic-tool-call-ratio 0.5 --agentic-turns-dist uniform",
              " --agentic-min-turns 3 --agentic-max-turns 3 --agentic-think-time-s 0.01",
              " --save-result --result-filename ", file, " --disable-tqdm"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Agentic sessions"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(file);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["num_sessions"], 2);
  EXPECT_EQ(j["num_turns"], 6);
  EXPECT_EQ(j["num_replies_without_ids"], 0);
  ASSERT_EQ(j["input_lens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(j["session_ids"][i], i / 3);
    EXPECT_EQ(j["turn_indices"][i], i % 3);
    EXPECT_EQ(j["output_lens"][i], 5);  // ignore_eos: exactly max_tokens
    const int64_t input = j["input_lens"][i];
    if (i % 3 == 0) {
      EXPECT_EQ(j["turn_kinds"][i], "user");
      EXPECT_EQ(input, 16 + 6) << "turn " << i;  // system + user
      continue;
    }
    const int64_t new_tokens = j["turn_kinds"][i] == "tool" ? 10 : 6;
    EXPECT_EQ(input, j["input_lens"][i - 1].get<int64_t>() +
                         j["output_lens"][i - 1].get<int64_t>() + new_tokens)
        << "request " << i;
  }
  EXPECT_EQ(j["max_context_len"],
            std::max(j["input_lens"][2].get<int64_t>(), j["input_lens"][5].get<int64_t>()));
}

// A tiny sweep: one result per concurrency, the summary and the plots.
TEST(BenchServe, SweepWritesPointsSummaryAndPlots) {
  test::TinyOpenAIServer server;
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "bench_sweep";
  std::filesystem::remove_all(dir);
  const RunResult r =
      run(str_cat("bench sweep --base-url http://127.0.0.1:", server.port(), " --tokenizer ",
                  test::tiny_model_dir().string(),
                  " --num-prompts 4 --random-input-len 8 --random-output-len 4",
                  " --concurrencies 1,2 --num-gpus 1 --disable-tqdm --result-dir ", dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json summary = read_json((dir / "sweep_summary.json").string());
  ASSERT_EQ(summary["points"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& p = summary["points"][i];
    EXPECT_EQ(p["concurrency"], i + 1);
    EXPECT_EQ(p["completed"], 4);
    EXPECT_GT(p["output_tokens_per_s_per_gpu"].get<double>(), 0.0);
    EXPECT_GT(p["output_tokens_per_s_per_user"].get<double>(), 0.0);
    const nlohmann::json point = read_json((dir / p["result_file"].get<std::string>()).string());
    EXPECT_EQ(point["max_concurrency"], i + 1);
    EXPECT_EQ(point["total_output_tokens"], 16);
  }
  for (const char* name : {"frontier", "ttft", "tpot"}) {
    for (const char* ext : {".svg", ".png"}) {
      const std::filesystem::path file = dir / (std::string(name) + ext);
      EXPECT_TRUE(std::filesystem::exists(file)) << file;
      EXPECT_GT(std::filesystem::file_size(file), 100u) << file;
    }
  }
}

// --prompts-per-concurrency: a point sends max(--num-prompts, K x its concurrency).
TEST(BenchServe, SweepScalesPromptsWithConcurrency) {
  test::TinyOpenAIServer server;
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "bench_sweep_k";
  std::filesystem::remove_all(dir);
  const RunResult r =
      run(str_cat("bench sweep --base-url http://127.0.0.1:", server.port(), " --tokenizer ",
                  test::tiny_model_dir().string(),
                  " --num-prompts 3 --random-input-len 8 --random-output-len 2",
                  " --concurrencies 1,4 --prompts-per-concurrency 2 --disable-tqdm --result-dir ",
                  dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json summary = read_json((dir / "sweep_summary.json").string());
  ASSERT_EQ(summary["points"].size(), 2u);
  EXPECT_EQ(summary["points"][0]["completed"], 3);  // max(3, 2 x 1)
  EXPECT_EQ(summary["points"][1]["completed"], 8);  // max(3, 2 x 4)
  EXPECT_NE(run(str_cat("bench sweep --base-url http://127.0.0.1:", server.port(), " --tokenizer ",
                        test::tiny_model_dir().string(),
                        " --concurrencies 1 --prompts-per-concurrency -1"))
                .exit_code,
            0);
}

}  // namespace
}  // namespace hyserve
