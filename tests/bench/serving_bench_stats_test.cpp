// pdserve-bench-serving's numbers: percentiles against numpy's values, the summary of known
// outcomes, and vLLM's --goodput / --percentile-metrics / --metric-percentiles and result keys.
#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/serving/latency_stats.h"
#include "bench/serving/serving_benchmark.h"
#include "bench/serving/workload.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;

// Expected values from numpy 1.24: np.mean and np.percentile(a, q) (linear interpolation).
TEST(LatencyStats, MatchesNumpyPercentiles) {
  const std::vector<double> five = {15, 20, 35, 40, 50};
  const LatencySummary summary = summarize(five);
  EXPECT_EQ(summary.count, 5u);
  EXPECT_DOUBLE_EQ(summary.mean, 32.0);
  EXPECT_DOUBLE_EQ(summary.p50, 35.0);
  EXPECT_DOUBLE_EQ(summary.p90, 46.0);
  EXPECT_NEAR(summary.p99, 49.6, 1e-12);
  EXPECT_DOUBLE_EQ(summary.max, 50.0);

  const std::vector<double> shuffled = {7, 3, 10, 1, 9, 2, 8, 4, 6, 5};
  EXPECT_DOUBLE_EQ(percentile(shuffled, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(shuffled, 50), 5.5);
  EXPECT_NEAR(percentile(shuffled, 90), 9.1, 1e-12);
  EXPECT_NEAR(percentile(shuffled, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(shuffled, 100), 10.0);
  EXPECT_DOUBLE_EQ(summarize(shuffled).mean, 5.5);
}

TEST(LatencyStats, SingleAndEmptySamples) {
  const std::vector<double> one = {4.0};
  EXPECT_DOUBLE_EQ(summarize(one).p50, 4.0);
  EXPECT_DOUBLE_EQ(summarize(one).p99, 4.0);
  const LatencySummary empty = summarize({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_DOUBLE_EQ(empty.p99, 0.0);
}

RequestOutcome completed(double start_s, double ttft_s, double e2e_s, int output_tokens) {
  RequestOutcome outcome;
  outcome.success = true;
  outcome.prompt_tokens = 10;
  outcome.output_tokens = output_tokens;
  outcome.start_s = start_s;
  outcome.ttft_s = ttft_s;
  outcome.e2e_s = e2e_s;
  return outcome;
}

TEST(Summary, ThroughputTpotAndGoodputOfKnownOutcomes) {
  BenchmarkResult result;
  // TPOT = (E2E - TTFT) / (tokens - 1): 100 ms, 300 ms, none (one token).
  result.outcomes = {completed(0, 0.2, 1.2, 11), completed(0.5, 0.5, 3.5, 11),
                     completed(2, 0.1, 0.1, 1)};
  RequestOutcome failed;
  failed.error = "HTTP 500";
  failed.start_s = 2;
  failed.e2e_s = 2;  // ends at 4 s, after every completed request
  result.outcomes.push_back(failed);
  summarize_outcomes(result, Slo{.ttft_ms = 400, .tpot_ms = 200});
  EXPECT_EQ(result.completed, 3);
  EXPECT_EQ(result.failed, 1);
  EXPECT_DOUBLE_EQ(result.duration_s, 4.0);
  EXPECT_EQ(result.total_output_tokens, 23);
  EXPECT_DOUBLE_EQ(result.output_throughput, 23 / 4.0);
  EXPECT_DOUBLE_EQ(result.request_throughput, 3 / 4.0);
  EXPECT_EQ(result.tpot_ms.count, 2u);
  EXPECT_NEAR(result.tpot_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(result.ttft_ms.p50, 200.0, 1e-9);
  // Good: the first (TTFT 200, TPOT 100) and the one-token request (TTFT 100, no TPOT); the
  // second misses both objectives.
  EXPECT_EQ(result.good, 2);
  EXPECT_DOUBLE_EQ(result.goodput, 2 / 4.0);
  EXPECT_NE(format_report(result, Slo{.ttft_ms = 400}).find("Request goodput"), std::string::npos);
  EXPECT_EQ(format_report(result).find("Request goodput"), std::string::npos);

  summarize_outcomes(result, Slo{.tpot_ms = 350});  // recomputed, TPOT only
  EXPECT_EQ(result.completed, 3);
  EXPECT_EQ(result.good, 3);
}

// ---- vLLM's --goodput, --percentile-metrics, --metric-percentiles and result keys -------------

TEST(VllmOptions, GoodputItemsAsVllmTakesThem) {
  const Result<Slo> separate = parse_goodput({"ttft:500", "tpot:50"});
  ASSERT_TRUE(separate.ok()) << separate.status().to_string();
  EXPECT_EQ(separate->ttft_ms, 500.0);
  EXPECT_EQ(separate->tpot_ms, 50.0);
  EXPECT_FALSE(separate->e2el_ms.has_value());
  const Result<Slo> quoted = parse_goodput({"ttft:500 tpot:2.5  e2el:0"});
  ASSERT_TRUE(quoted.ok()) << quoted.status().to_string();
  EXPECT_EQ(quoted->tpot_ms, 2.5);
  EXPECT_EQ(quoted->e2el_ms, 0.0);  // vLLM accepts any objective >= 0

  const std::vector<std::vector<std::string>> bad = {
      {"ttft"},      {"ttft:"},  {"ttft:abc"},         {"ttft:-1"}, {"ttft:1:2"},
      {"latency:5"}, {"TTFT:5"}, {"ttft:1", "ttft:2"}, {""},        {"ttft:inf"}};
  for (const std::vector<std::string>& items : bad) {
    const Result<Slo> slo = parse_goodput(items);
    EXPECT_EQ(slo.status().code(), StatusCode::kInvalidArgument) << items[0];
    EXPECT_NE(slo.status().message().find("--goodput"), std::string::npos) << items[0];
  }
}

TEST(Summary, GoodputWithAnEndToEndObjective) {
  BenchmarkResult result;
  result.outcomes = {completed(0, 0.2, 1.2, 11), completed(0.5, 0.5, 3.5, 11),
                     completed(2, 0.1, 0.1, 1)};
  summarize_outcomes(result, Slo{.e2el_ms = 1500});
  EXPECT_EQ(result.good, 2);  // E2E 1200 and 100 ms are within, 3500 is not
  summarize_outcomes(result, Slo{.ttft_ms = 0});
  EXPECT_EQ(result.good, 0);  // an objective of 0 ms: no request's TTFT is within it
  summarize_outcomes(result, Slo{.ttft_ms = 300, .e2el_ms = 1500});
  EXPECT_EQ(result.good, 2);
}

TEST(VllmOptions, PercentileMetricsAndKeyNames) {
  EXPECT_EQ(parse_percentile_metrics("ttft,e2el").value(),
            (std::vector<std::string>{"ttft", "e2el"}));
  for (const char* bad : {"ttft,foo", "client_queue_time", "", "ttft,,itl", "TTFT"}) {
    EXPECT_EQ(parse_percentile_metrics(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(parse_metric_percentiles("50,90,99.9").value(), (std::vector<double>{50, 90, 99.9}));
  for (const char* bad : {"101", "-1", "abc", "", "99,", "nan", "50;90"}) {
    EXPECT_EQ(parse_metric_percentiles(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Python's str(): whole numbers without ".0", others as printed.
  EXPECT_EQ(percentile_key_name(99), "99");
  EXPECT_EQ(percentile_key_name(50.0), "50");
  EXPECT_EQ(percentile_key_name(100), "100");
  EXPECT_EQ(percentile_key_name(0), "0");
  EXPECT_EQ(percentile_key_name(99.9), "99.9");
  EXPECT_EQ(percentile_key_name(99.99), "99.99");
  EXPECT_EQ(percentile_key_name(0.5), "0.5");
  EXPECT_EQ(percentile_key_name(0.0001), "0.0001");
  EXPECT_EQ(percentile_key_name(1e-05), "1e-05");
}

// vLLM's keys on known outcomes. Expected values from numpy 1.24: TTFTs 15, 20, 35, 40, 50 ms
// have np.mean 32, np.median 35, np.std 12.884098726725126, np.percentile(., 99.9) 49.96.
TEST(ResultJson, VllmKeysOfKnownOutcomes) {
  BenchmarkResult result;
  result.model = "m";
  const double ttfts[] = {0.015, 0.020, 0.035, 0.040, 0.050};
  for (int i = 0; i < 5; ++i) {
    RequestOutcome outcome = completed(i * 0.1, ttfts[i], ttfts[i] + 0.4, 5);
    outcome.itl_s = {0.1, 0.1, 0.1, 0.1};
    outcome.generated_text = "text " + std::to_string(i);
    result.outcomes.push_back(outcome);
  }
  RequestOutcome failed;
  failed.error = "HTTP 500: boom";
  failed.prompt_tokens = 10;
  failed.output_tokens = 3;  // counted by the server, but the request failed
  result.outcomes.push_back(failed);
  RunOptions options;
  options.percentile_metrics = {"ttft", "e2el"};
  options.metric_percentiles = {50, 99.9};
  options.slo.ttft_ms = 30;
  summarize_outcomes(result, options.slo);
  WorkloadOptions workload;
  workload.num_prompts = 6;
  workload.request_rate = 4;
  workload.burstiness = 0.5;
  const nlohmann::json json = nlohmann::json::parse(result_json(result, workload, options).dump());

  EXPECT_NEAR(json["mean_ttft_ms"].get<double>(), 32.0, 1e-9);
  EXPECT_NEAR(json["median_ttft_ms"].get<double>(), 35.0, 1e-9);
  EXPECT_NEAR(json["std_ttft_ms"].get<double>(), 12.884098726725126, 1e-9);
  EXPECT_NEAR(json["p50_ttft_ms"].get<double>(), 35.0, 1e-9);
  EXPECT_NEAR(json["p99.9_ttft_ms"].get<double>(), 49.96, 1e-9);
  EXPECT_NEAR(json["mean_e2el_ms"].get<double>(), 432.0, 1e-9);
  EXPECT_NEAR(json["std_e2el_ms"].get<double>(), 12.884098726725126, 1e-9);
  for (const char* absent : {"mean_tpot_ms", "p99_ttft_ms", "mean_itl_ms", "p99_e2el_ms"}) {
    EXPECT_FALSE(json.contains(absent)) << absent;
  }
  EXPECT_DOUBLE_EQ(json["duration"].get<double>(), json["duration_s"].get<double>());
  EXPECT_NEAR(json["duration"].get<double>(), 0.85, 1e-12);  // when the last one ends
  EXPECT_EQ(json["completed"], 5);
  EXPECT_EQ(json["failed"], 1);
  EXPECT_EQ(json["total_input_tokens"], 50);
  EXPECT_EQ(json["total_output_tokens"], 25);
  EXPECT_NEAR(json["total_token_throughput"].get<double>(), 75 / 0.85, 1e-9);
  EXPECT_NEAR(json["request_goodput"].get<double>(), 2 / 0.85, 1e-9);  // TTFT 15 and 20 ms
  EXPECT_EQ(json["input_lens"], nlohmann::json({10, 10, 10, 10, 10, 10}));
  EXPECT_EQ(json["output_lens"], nlohmann::json({5, 5, 5, 5, 5, 0}));
  EXPECT_EQ(json["ttfts"][2], 0.035);
  EXPECT_EQ(json["itls"][0], nlohmann::json({0.1, 0.1, 0.1, 0.1}));
  EXPECT_NEAR(json["latencies"][1].get<double>(), 0.42, 1e-12);
  EXPECT_EQ(json["generated_texts"][4], "text 4");
  EXPECT_EQ(json["errors"][0], "");
  EXPECT_EQ(json["errors"][5], "HTTP 500: boom");
  EXPECT_EQ(json["model_id"], "m");
  EXPECT_EQ(json["backend"], "openai");
  EXPECT_EQ(json["num_prompts"], 6);
  EXPECT_EQ(json["request_rate"], 4.0);
  EXPECT_EQ(json["burstiness"], 0.5);
  EXPECT_TRUE(json["max_concurrency"].is_null());
  EXPECT_TRUE(json["tokenizer_id"].is_null());
  EXPECT_TRUE(std::regex_match(json["date"].get<std::string>(), std::regex("[0-9]{8}-[0-9]{6}")))
      << json["date"];

  options.slo = {};
  workload.request_rate = std::numeric_limits<double>::infinity();
  const nlohmann::json unlimited =
      nlohmann::json::parse(result_json(result, workload, options).dump());
  EXPECT_EQ(unlimited["request_rate"], "inf");
  EXPECT_TRUE(unlimited["request_goodput"].is_null());
  EXPECT_TRUE(unlimited["config"]["request_rate"].is_null());  // the existing key is unchanged
}

}  // namespace
}  // namespace pdserve::bench
