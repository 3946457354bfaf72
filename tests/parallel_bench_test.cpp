// hyserve_parallel_bench on CPU ranks (Gloo): the tool the multi-GPU runs use gives one JSON
// line per case with consistent figures (collectives, the merge, KV tokens, prefill TTFT,
// decode TPOT on tiny configs), and refuses --device cuda without 2 GPUs.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_binary.h"

namespace hyserve {
namespace {

std::vector<nlohmann::json> bench_lines(const std::string& args) {
  const test::RunResult r =
      test::run_command(std::string(HYSERVE_PARALLEL_BENCH) + " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(ParallelBench, CollectivesReportBusBandwidthByNcclTestsRules) {
  const auto lines = bench_lines("--device cpu --ranks 4 --max-bytes 1048576");
  ASSERT_EQ(lines.size(), 3u);  // 1 MiB: all_reduce, all_gather, all_to_all
  for (const nlohmann::json& j : lines) {
    const double algbw = j["algbw_GBps"], busbw = j["busbw_GBps"];
    EXPECT_GT(algbw, 0.0);
    EXPECT_NEAR(busbw / algbw, j["op"] == "all_reduce" ? 1.5 : 0.75, 1e-9) << j.dump();
    EXPECT_EQ(j["bytes"], 1048576);
  }
}

TEST(ParallelBench, ExactMergeSendsAboutTenTimesFewerBytes) {
  const auto lines = bench_lines("--case merge --ranks 8 --rows 4 --context 32768 --topk 2048");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["merge"], "exact");
  EXPECT_EQ(lines[0]["bytes_per_row_per_rank"], 4 * (384 + 1));
  EXPECT_EQ(lines[1]["bytes_per_row_per_rank"], 8 * 2048);
  EXPECT_EQ(lines[0]["resent_rows"], 0);
}

TEST(ParallelBench, KvTokensPerDcpGroupGrowWithDcp) {
  const auto lines = bench_lines("--case kv-tokens --ranks 4 --config " HYSERVE_SOURCE_DIR
                                 "/tests/fixtures/deepseek_v32_tiny/config.json --kv-gib 1");
  ASSERT_EQ(lines.size(), 2u);
  const double tp = lines[0]["tokens_per_dcp_group"], dcp = lines[1]["tokens_per_dcp_group"];
  EXPECT_DOUBLE_EQ(dcp, 4 * tp);
}

TEST(ParallelBench, PrefillTimesHeadAndTokenShardedTtft) {
  const auto lines = bench_lines(
      "--case prefill --ranks 2 --prompts 100,200 --chunk 64 --config " HYSERVE_SOURCE_DIR
      "/tests/fixtures/kimi_linear_tiny/config.json");
  ASSERT_EQ(lines.size(), 4u);  // head-sharded 100, 200; token-sharded 100, 200
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& j = lines[i];
    EXPECT_EQ(j["sharding"], i < 2 ? "head" : "token") << j.dump();
    EXPECT_EQ(j["prompt_tokens"], i % 2 == 0 ? 100 : 200);
    const double ttft = j["ttft_ms"], rate = j["tokens_per_s"];
    EXPECT_GT(ttft, 0.0);
    EXPECT_NEAR(rate * ttft / 1e3, j["prompt_tokens"].get<double>(), 1e-6 * rate);
  }
  // With --dcp: DCP's merged prefill and the gathered-context form.
  const auto dcp = bench_lines(
      "--case prefill --ranks 2 --dcp 2 --prompts 150 --chunk 64 --config " HYSERVE_SOURCE_DIR
      "/tests/fixtures/kimi_linear_tiny/config.json");
  ASSERT_EQ(dcp.size(), 2u);
  EXPECT_EQ(dcp[0]["sharding"], "dcp-merged");
  EXPECT_EQ(dcp[1]["sharding"], "gathered");
}

TEST(ParallelBench, DecodeTimesTensorAndContextParallelTpot) {
  const auto lines = bench_lines(
      "--case decode --ranks 2 --contexts 100,300 --batches 1,3 --steps 2 "
      "--config " HYSERVE_SOURCE_DIR "/tests/fixtures/kimi_linear_tiny/config.json");
  ASSERT_EQ(lines.size(), 8u);  // TP then DCP 2, each 2 contexts x 2 batches
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& j = lines[i];
    const int64_t context = j["context"], batch = j["batch"], dcp = j["dcp"];
    EXPECT_EQ(dcp, i < 4 ? 1 : 2) << j.dump();
    EXPECT_EQ(j["kv_tokens_per_gpu"], batch * ((context + dcp - 1) / dcp));
    EXPECT_GT(j["tpot_ms"].get<double>(), 0.0);
  }
}

TEST(ParallelBench, RefusesCudaWithoutTwoGpus) {
  const test::RunResult r =
      test::run_command(std::string(HYSERVE_PARALLEL_BENCH) + " --device cuda 2>&1");
  if (r.exit_code == 0) GTEST_SKIP() << "this machine has 2 GPUs or more";
  EXPECT_NE(r.output.find("needs at least 2 GPUs"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyserve
