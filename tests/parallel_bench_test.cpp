// hyserve_parallel_bench on CPU ranks (Gloo): the tool the multi-GPU runs use gives one JSON
// line per case with consistent figures, and refuses --device cuda without 2 GPUs.
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

TEST(ParallelBench, RefusesCudaWithoutTwoGpus) {
  const test::RunResult r =
      test::run_command(std::string(HYSERVE_PARALLEL_BENCH) + " --device cuda 2>&1");
  if (r.exit_code == 0) GTEST_SKIP() << "this machine has 2 GPUs or more";
  EXPECT_NE(r.output.find("needs at least 2 GPUs"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyserve
