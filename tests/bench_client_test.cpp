// The pure parts of the serving benchmark client (src/client/): the arrival schedule, the
// metric definitions against hand-computed values, goodput, SSE and HTTP framing of bytes
// cut anywhere, the datasets, the /metrics counters and the result JSON's keys.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/arrival_schedule.h"
#include "client/bench_dataset.h"
#include "client/bench_metrics.h"
#include "client/bench_report.h"
#include "client/bench_runner.h"
#include "client/http_response_reader.h"
#include "client/openai_stream.h"
#include "client/prometheus_text.h"
#include "client/sse_parser.h"
#include "util/error.h"

namespace hyserve::client {
namespace {

TEST(ArrivalSchedule, InfiniteRateSendsEverythingAtZero) {
  const std::vector<double> t = arrival_times_s(5, {});
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
}

// Gaps of a gamma(k, 1 / (rate * k)) process: mean 1 / rate, variance 1 / (k * rate^2).
void expect_gap_statistics(double rate, double burstiness) {
  const int64_t n = 20001;
  const std::vector<double> t = arrival_times_s(n, {rate, burstiness, 7});
  ASSERT_EQ(t.size(), static_cast<size_t>(n));
  EXPECT_EQ(t[0], 0.0);
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) {
    ASSERT_GE(t[i], t[i - 1]);
    gaps.push_back(t[i] - t[i - 1]);
  }
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= gaps.size();
  EXPECT_NEAR(mean, 1.0 / rate, 0.03 / rate) << "burstiness " << burstiness;
  const double expected_var = 1.0 / (burstiness * rate * rate);
  EXPECT_NEAR(var, expected_var, 0.08 * expected_var) << "burstiness " << burstiness;
}

TEST(ArrivalSchedule, PoissonAndGammaGapStatistics) {
  expect_gap_statistics(10.0, 1.0);  // Poisson: exponential gaps, variance = mean^2
  expect_gap_statistics(4.0, 0.5);   // burstier
  expect_gap_statistics(4.0, 4.0);   // more regular
}

TEST(ArrivalSchedule, SameSeedSameScheduleAndBadRatesRefused) {
  EXPECT_EQ(arrival_times_s(50, {3.0, 1.0, 1}), arrival_times_s(50, {3.0, 1.0, 1}));
  EXPECT_NE(arrival_times_s(50, {3.0, 1.0, 1}), arrival_times_s(50, {3.0, 1.0, 2}));
  EXPECT_THROW(arrival_times_s(5, {0.0, 1.0, 0}), InvalidArgument);
  EXPECT_THROW(arrival_times_s(5, {1.0, 0.0, 0}), InvalidArgument);
}

TEST(BenchMetrics, PercentileInterpolatesAsNumpy) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 90 -> 3.7, 99 -> 3.97, 100 -> 4.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

RequestOutcome ok(double ttft, double latency, int64_t prompt, int64_t out,
                  std::vector<double> itl) {
  RequestOutcome o;
  o.success = true;
  o.ttft_s = ttft;
  o.latency_s = latency;
  o.prompt_len = prompt;
  o.output_tokens = out;
  o.itl_s = std::move(itl);
  return o;
}

TEST(BenchMetrics, SummaryMatchesHandComputedValues) {
  RequestOutcome failed;
  failed.error = "connection refused";
  failed.prompt_len = 7;
  // Request 1: TTFT 0.1, E2E 0.5, 5 tokens: TPOT (0.5 - 0.1) / 4 = 0.1.
  // Request 2: TTFT 0.3, E2E 0.5, 3 tokens: TPOT 0.1.  Request 3: one token, no TPOT.
  const std::vector<RequestOutcome> outcomes = {ok(0.1, 0.5, 10, 5, {0.1, 0.1, 0.1, 0.1}),
                                                ok(0.3, 0.5, 20, 3, {0.05, 0.15}),
                                                ok(0.2, 0.2, 30, 1, {}), failed};
  SummaryOptions options;
  options.percentiles = {50, 99};
  const BenchSummary s = summarize(outcomes, 2.0, options);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 60);  // failed requests count no tokens
  EXPECT_EQ(s.total_output_tokens, 9);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 34.5);
  EXPECT_FALSE(s.request_goodput);
  const MetricStats& ttft = s.stats.at("ttft");  // {0.1, 0.3, 0.2} s
  EXPECT_NEAR(ttft.mean_ms, 200.0, 1e-9);
  EXPECT_NEAR(ttft.median_ms, 200.0, 1e-9);
  EXPECT_NEAR(ttft.std_ms, std::sqrt(0.02 / 3) * 1000, 1e-9);  // population std
  ASSERT_EQ(ttft.percentiles_ms.size(), 2u);
  EXPECT_NEAR(ttft.percentiles_ms[1].second, 298.0, 1e-9);  // 0.2 + 0.98 * 0.1
  EXPECT_NEAR(s.stats.at("tpot").mean_ms, 100.0, 1e-9);
  EXPECT_NEAR(s.stats.at("tpot").std_ms, 0.0, 1e-9);
  const MetricStats& itl = s.stats.at("itl");  // {0.1 x4, 0.05, 0.15}
  EXPECT_NEAR(itl.mean_ms, 100.0, 1e-9);
  EXPECT_NEAR(itl.median_ms, 100.0, 1e-9);
  EXPECT_NEAR(s.stats.at("e2el").mean_ms, 400.0, 1e-9);
}

TEST(BenchMetrics, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<RequestOutcome> outcomes = {
      ok(0.1, 0.5, 1, 5, {}),   // TTFT 100 ms, TPOT 100 ms
      ok(0.3, 0.5, 1, 3, {}),   // TTFT 300 ms, TPOT 100 ms
      ok(0.2, 0.2, 1, 1, {}),   // TTFT 200 ms, TPOT 0 (one token)
      ok(0.1, 0.9, 1, 3, {})};  // TTFT 100 ms, TPOT 400 ms
  SummaryOptions options;
  options.goodput_slos_ms = parse_goodput({"ttft:250", "tpot:150"});
  const BenchSummary s = summarize(outcomes, 4.0, options);
  ASSERT_TRUE(s.request_goodput);
  EXPECT_DOUBLE_EQ(*s.request_goodput, 0.5);  // requests 1 and 3
  options.goodput_slos_ms = parse_goodput({"e2el:500"});
  EXPECT_DOUBLE_EQ(*summarize(outcomes, 4.0, options).request_goodput, 0.75);
}

TEST(BenchMetrics, ParsersRefuseBadInput) {
  EXPECT_EQ(parse_goodput({"ttft:500", "tpot:50.5"}),
            (std::map<std::string, double>{{"ttft", 500}, {"tpot", 50.5}}));
  EXPECT_THROW(parse_goodput({"itl:5"}), InvalidArgument);
  EXPECT_THROW(parse_goodput({"ttft"}), InvalidArgument);
  EXPECT_THROW(parse_goodput({"ttft:fast"}), InvalidArgument);
  EXPECT_THROW(parse_goodput({"ttft:-1"}), InvalidArgument);
  EXPECT_EQ(parse_metric_list("ttft,e2el"), (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_THROW(parse_metric_list("ttft,foo"), InvalidArgument);
  EXPECT_EQ(parse_percentile_list("50,90,99.9"), (std::vector<double>{50, 90, 99.9}));
  EXPECT_THROW(parse_percentile_list("0"), InvalidArgument);
  EXPECT_THROW(parse_percentile_list("101"), InvalidArgument);
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
}

TEST(BenchReport, JsonHasVllmKeysForTheChosenMetrics) {
  const std::vector<RequestOutcome> outcomes = {ok(0.1, 0.5, 10, 5, {0.1, 0.1, 0.1, 0.1})};
  SummaryOptions options;
  options.percentile_metrics = {"ttft", "e2el"};
  options.percentiles = {50, 99.9};
  RunDescription run;
  run.model_id = "/models/tiny/";
  run.request_rate = std::numeric_limits<double>::infinity();
  run.max_concurrency = 4;
  run.date = "20270101-000000";
  const auto j = result_json(summarize(outcomes, 1.0, options), options, run, outcomes);
  for (const char* key : {"completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "duration",
                          "request_throughput",
                          "output_throughput",
                          "total_token_throughput",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p50_ttft_ms",
                          "p99.9_ttft_ms",
                          "mean_e2el_ms",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "errors",
                          "prefix_cache_hit_rate"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j.contains("mean_tpot_ms"));
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["prefix_cache_hit_rate"].is_null());
  EXPECT_EQ(j["itls"][0].size(), 4u);
  EXPECT_EQ(default_result_filename(run), "openai-infqps-concurrency4-tiny-20270101-000000.json");
  const std::string table = format_report(summarize(outcomes, 1.0, options), options, run);
  EXPECT_NE(table.find("Successful requests:                     1"), std::string::npos) << table;
  EXPECT_NE(table.find("P99.9 TTFT (ms):"), std::string::npos) << table;
}

// Feeds `bytes` cut at every position into two pieces; each cut must give the same events.
void expect_events_at_every_cut(const std::string& bytes, const std::vector<std::string>& events) {
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    SseParser parser;
    std::vector<std::string> got = parser.feed(bytes.substr(0, cut));
    for (std::string& e : parser.feed(bytes.substr(cut))) got.push_back(std::move(e));
    EXPECT_EQ(got, events) << "cut at " << cut;
    EXPECT_FALSE(parser.has_partial_event());
  }
}

TEST(SseParser, EventsSurviveEveryCut) {
  expect_events_at_every_cut("data: {\"a\":1}\n\ndata: [DONE]\n\n", {"{\"a\":1}", "[DONE]"});
  // CRLF and CR line ends, comments, other fields, multi-line data, no space after the colon.
  expect_events_at_every_cut(
      ": keep-alive\r\n\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\n"
      "id: 3\rdata: cr\r\r",
      {"one\ntwo", "cr"});
}

TEST(SseParser, UnfinishedEventIsReported) {
  SseParser parser;
  EXPECT_TRUE(parser.feed("data: {\"a\"").empty());
  EXPECT_TRUE(parser.has_partial_event());
}

TEST(HttpResponseReader, ChunkedBodyAtEveryCut) {
  const std::string response =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
      "d\r\ndata: hello\n\n\r\n"
      "E;ext=1\r\ndata: [DONE]\n\n\r\n0\r\nX-Trailer: 1\r\n\r\n";
  for (size_t cut = 0; cut <= response.size(); ++cut) {
    HttpResponseReader reader;
    std::string body;
    ASSERT_TRUE(reader.feed(response.substr(0, cut), body)) << reader.error();
    ASSERT_TRUE(reader.feed(response.substr(cut), body)) << reader.error();
    EXPECT_TRUE(reader.done()) << "cut at " << cut;
    EXPECT_EQ(reader.status(), 200);
    EXPECT_EQ(reader.header("content-type"), "text/event-stream");
    EXPECT_EQ(body, "data: hello\n\ndata: [DONE]\n\n") << "cut at " << cut;
  }
}

TEST(HttpResponseReader, ContentLengthEofAndMalformed) {
  HttpResponseReader sized;
  std::string body;
  ASSERT_TRUE(sized.feed("HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nab", body));
  EXPECT_FALSE(sized.done());
  EXPECT_FALSE(sized.finish_at_eof());  // cut short
  ASSERT_TRUE(sized.feed("cde", body));
  EXPECT_TRUE(sized.done());
  EXPECT_EQ(sized.status(), 404);
  EXPECT_EQ(body, "abcde");

  HttpResponseReader to_eof;
  body.clear();
  ASSERT_TRUE(to_eof.feed("HTTP/1.0 200 OK\r\n\r\nall of it", body));
  EXPECT_TRUE(to_eof.finish_at_eof());
  EXPECT_EQ(body, "all of it");

  for (const char* bad :
       {"HTTP/1.1 2000 OK\r\n\r\n", "SMTP ready\r\n\r\n", "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}) {
    HttpResponseReader reader;
    std::string b;
    EXPECT_FALSE(reader.feed(bad, b)) << bad;
    EXPECT_FALSE(reader.error().empty()) << bad;
  }
}

TEST(PrometheusText, SumsEveryLabelSetOfOneMetric) {
  const std::string text =
      "# HELP vllm:prefix_cache_hits_total Prefix cache hits.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\n"
      "vllm:prefix_cache_hits_total{model_name=\"a\"} 30\n"
      "vllm:prefix_cache_hits_total{model_name=\"b {x}\"} 2.0\n"
      "vllm:prefix_cache_hits_total_other 1000\n"
      "vllm:prefix_cache_queries_total 100 1700000000\n";
  EXPECT_EQ(sum_samples(text, "vllm:prefix_cache_hits_total"), 32.0);
  EXPECT_EQ(sum_samples(text, "vllm:prefix_cache_queries_total"), 100.0);
  EXPECT_FALSE(sum_samples(text, "vllm:num_requests_running"));
  const auto before = read_prefix_cache_counters(text);
  ASSERT_TRUE(before);
  const PrefixCacheCounters after{300, 132};
  EXPECT_EQ(prefix_cache_hit_rate(before, after), 0.5);
  EXPECT_FALSE(prefix_cache_hit_rate(before, before));  // no queries in between
  EXPECT_FALSE(prefix_cache_hit_rate(std::nullopt, after));
  EXPECT_FALSE(read_prefix_cache_counters("up 1\n"));
}

TEST(BenchDataset, RandomPromptsHaveTheAskedLengthsAndSharedPrefix) {
  const std::vector<int32_t> vocab = {5, 6, 7, 8, 9};
  RandomDatasetOptions options;
  options.num_prompts = 50;
  options.input_len = 20;
  options.output_len = 10;
  options.prefix_len = 4;
  options.seed = 3;
  const auto fixed = make_random_requests(options, vocab);
  ASSERT_EQ(fixed.size(), 50u);
  for (const BenchRequest& r : fixed) {
    EXPECT_EQ(r.prompt_len, 24);
    EXPECT_EQ(r.prompt_ids.size(), 24u);
    EXPECT_EQ(r.output_len, 10);
    EXPECT_TRUE(
        std::equal(r.prompt_ids.begin(), r.prompt_ids.begin() + 4, fixed[0].prompt_ids.begin()));
    for (int32_t id : r.prompt_ids) EXPECT_TRUE(id >= 5 && id <= 9);
  }
  EXPECT_EQ(make_random_requests(options, vocab)[7].prompt_ids, fixed[7].prompt_ids);
  options.range_ratio = 0.5;  // input in [10, 30], output in [5, 15]
  bool varied = false;
  for (const BenchRequest& r : make_random_requests(options, vocab)) {
    EXPECT_GE(r.prompt_len, 14);
    EXPECT_LE(r.prompt_len, 34);
    EXPECT_GE(r.output_len, 5);
    EXPECT_LE(r.output_len, 15);
    varied = varied || r.prompt_len != 24;
  }
  EXPECT_TRUE(varied);
  options.range_ratio = 1.0;
  EXPECT_THROW(make_random_requests(options, vocab), InvalidArgument);
}

std::string sharegpt_fixture() {
  return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/sharegpt_small.json";
}

// Whitespace-separated words as tokens, so lengths are easy to state.
int64_t count_words(std::string_view text) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : text) {
    const bool space = c == ' ';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

TEST(BenchDataset, ShareGptTakesFirstTurnAndReplyLength) {
  ShareGptOptions options;
  options.num_prompts = 2;
  const auto requests = load_sharegpt_requests(sharegpt_fixture(), options, count_words);
  ASSERT_EQ(requests.size(), 2u);
  // Usable: a (12-word prompt, 22-word reply) and d (10-word prompt, 23-word reply); b's
  // prompt and f's reply are under 4 tokens, c and e have under two turns.
  for (const BenchRequest& r : requests) {
    EXPECT_TRUE(r.prompt_ids.empty());
    EXPECT_EQ(r.prompt_len, count_words(r.prompt_text));
    if (r.prompt_text.rfind("Tell me", 0) == 0) {
      EXPECT_EQ(r.output_len, 22);
    } else {
      EXPECT_EQ(r.prompt_text.rfind("Explain", 0), 0u) << r.prompt_text;
      EXPECT_EQ(r.output_len, 23);
    }
  }
  EXPECT_NE(requests[0].prompt_text, requests[1].prompt_text);
  // More asked than usable: reused in order. A fixed output length lifts the reply filter.
  options.num_prompts = 5;
  options.output_len = 16;
  const auto fixed = load_sharegpt_requests(sharegpt_fixture(), options, count_words);
  ASSERT_EQ(fixed.size(), 5u);
  for (const BenchRequest& r : fixed) EXPECT_EQ(r.output_len, 16);
  EXPECT_EQ(fixed[3].prompt_text, fixed[0].prompt_text);  // a, d, f usable: the 4th is the 1st
}

TEST(BenchDataset, ShareGptWithoutTokenizerNeedsOutputLength) {
  ShareGptOptions options;
  options.num_prompts = 4;
  EXPECT_THROW(load_sharegpt_requests(sharegpt_fixture(), options, nullptr), InvalidArgument);
  options.output_len = 8;
  const auto requests = load_sharegpt_requests(sharegpt_fixture(), options, nullptr);
  ASSERT_EQ(requests.size(), 4u);  // a, b, d, f: no length filter without a tokenizer
  for (const BenchRequest& r : requests) EXPECT_EQ(r.prompt_len, 0);
  EXPECT_THROW(load_sharegpt_requests("/nonexistent.json", options, nullptr), InvalidArgument);
}

TEST(StreamAccumulator, TimesChunksCarryingOutputAndTakesUsage) {
  StreamAccumulator chat(99);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 0.05);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"content":"Hel"}}]})", 0.1);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"reasoning":"hm"}}]})", 0.15);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"content":"lo"}}]})", 0.3);
  chat.on_event(R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})", 0.35);
  chat.on_event(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}})", 0.36);
  chat.on_event("[DONE]", 0.37);
  const RequestOutcome o = chat.finish(0.4, "");
  ASSERT_TRUE(o.success) << o.error;
  EXPECT_DOUBLE_EQ(o.ttft_s, 0.1);  // the role chunk carries no output
  ASSERT_EQ(o.itl_s.size(), 2u);
  EXPECT_NEAR(o.itl_s[0], 0.05, 1e-12);
  EXPECT_NEAR(o.itl_s[1], 0.15, 1e-12);
  EXPECT_EQ(o.output_tokens, 4);  // from usage
  EXPECT_EQ(o.prompt_len, 7);
  EXPECT_DOUBLE_EQ(o.latency_s, 0.4);

  StreamAccumulator completion(5);  // no usage: chunks counted, the dataset's prompt length
  completion.on_event(R"({"choices":[{"index":0,"text":"","token_ids":[3]}]})", 0.1);
  completion.on_event(R"({"choices":[{"index":0,"text":"ab"}]})", 0.2);
  completion.on_event("[DONE]", 0.3);
  const RequestOutcome c = completion.finish(0.3, "");
  ASSERT_TRUE(c.success);
  EXPECT_EQ(c.output_tokens, 2);
  EXPECT_EQ(c.prompt_len, 5);
}

TEST(StreamAccumulator, FailuresSayWhy) {
  const auto outcome = [](std::vector<std::string> events, std::string transport) {
    StreamAccumulator a(1);
    for (const std::string& e : events) a.on_event(e, 0.1);
    return a.finish(0.2, transport);
  };
  EXPECT_NE(
      outcome({R"({"error":{"message":"boom","code":500}})", "[DONE]"}, "").error.find("boom"),
      std::string::npos);
  EXPECT_NE(outcome({"{not json"}, "").error.find("malformed SSE event"), std::string::npos);
  EXPECT_NE(outcome({R"({"choices":[{"text":"a"}]})"}, "").error.find("[DONE]"), std::string::npos);
  EXPECT_NE(outcome({"[DONE]"}, "").error.find("no chunk"), std::string::npos);
  EXPECT_EQ(outcome({R"({"choices":[{"text":"a"}]})"}, "timed out").error, "timed out");
  EXPECT_EQ(error_message_of(R"({"error":{"message":"The model `x` does not exist."}})"),
            "The model `x` does not exist.");
  EXPECT_EQ(error_message_of("plain"), "plain");
}

TEST(OpenAIRequestBody, CompletionIdsAndChatText) {
  BenchRequest r;
  r.prompt_ids = {4, 5};
  r.output_len = 3;
  OpenAIRequestOptions options;
  options.model = "m";
  options.ignore_eos = true;
  auto j = nlohmann::json::parse(openai_request_body(r, options));
  EXPECT_EQ(j["prompt"], nlohmann::json::array({4, 5}));
  EXPECT_EQ(j["max_tokens"], 3);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_FALSE(j.contains("return_token_ids"));
  r.prompt_ids.clear();
  r.prompt_text = "hi";
  options.chat = true;
  j = nlohmann::json::parse(openai_request_body(r, options));
  EXPECT_EQ(j["messages"][0]["content"], "hi");
  EXPECT_EQ(j["max_completion_tokens"], 3);
}

TEST(BaseUrl, ParsesHostPortAndPrefix) {
  BaseUrl u = parse_base_url("http://localhost:8000");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "8000");
  EXPECT_EQ(u.path_prefix, "");
  u = parse_base_url("http://[::1]:9000/proxy/");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "9000");
  EXPECT_EQ(u.path_prefix, "/proxy");
  EXPECT_EQ(parse_base_url("http://example.org").port, "80");
  EXPECT_THROW(parse_base_url("https://example.org"), InvalidArgument);
  EXPECT_THROW(parse_base_url("localhost:8000"), InvalidArgument);
  EXPECT_THROW(parse_base_url("http://h:80x"), InvalidArgument);
}

}  // namespace
}  // namespace hyserve::client
