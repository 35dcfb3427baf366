// ClusterAdvisor against numbers computed by hand from synthetic request records, and the
// gauges it exports for an autoscaler.
#include "proxy/routing/cluster_advice.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve::proxy {
namespace {

using Clock = ClusterAdvisor::Clock;
using std::chrono::milliseconds;

AdvisorOptions test_options() {
  AdvisorOptions options;
  options.slo_ttft_ms = 1'000;
  options.slo_tpot_ms = 50;
  options.window = milliseconds(60'000);
  options.target_utilization = 0.5;
  options.kv_block_tokens = 16;
  options.decode_max_batch = 128;
  return options;
}

FinishedRequest request(int prompt_tokens, int output_tokens, double prefill_compute_ms,
                        double ttft_ms, double tpot_ms) {
  FinishedRequest finished;
  finished.prompt_tokens = prompt_tokens;
  finished.output_tokens = output_tokens;
  finished.prefill_compute_ms = prefill_compute_ms;
  finished.ttft_ms = ttft_ms;
  finished.tpot_ms = tpot_ms;
  finished.e2e_ms = 1'000;
  finished.ok = true;
  return finished;
}

// 100 requests finishing every 100 ms, each 1 s long: the first arrived 10.9 s before now.
void record_steady(ClusterAdvisor& advisor, Clock::time_point now, const FinishedRequest& each) {
  for (int i = 0; i < 100; ++i) advisor.record(each, now - milliseconds(9'900 - 100 * i));
}

ClusterLoad two_decode_nodes(int64_t blocks_each) {
  ClusterLoad load;
  load.prefill.nodes = 1;
  load.decode.nodes = 2;
  load.decode.kv_blocks_total = 2 * blocks_each;
  return load;
}

TEST(ClusterAdvisorTest, RecommendsNodesFromMeasuredCapacities) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  record_steady(advisor, now, request(1'000, 101, 500, 600, 20));
  const Advice advice = advisor.advise(two_decode_nodes(640), now);

  EXPECT_EQ(advice.requests, 100);
  EXPECT_EQ(advice.failed, 0);
  EXPECT_NEAR(advice.window_s, 10.9, 1e-6);
  EXPECT_NEAR(advice.arrival_rate, 100 / 10.9, 1e-9);
  EXPECT_DOUBLE_EQ(advice.mean_prompt_tokens, 1'000);
  EXPECT_DOUBLE_EQ(advice.mean_output_tokens, 101);
  EXPECT_DOUBLE_EQ(advice.ttft_attainment, 1.0);
  EXPECT_DOUBLE_EQ(advice.tpot_attainment, 1.0);
  EXPECT_FALSE(advice.prefill_misses_slo);
  EXPECT_FALSE(advice.decode_misses_slo);
  // 1000 tokens in 0.5 s.
  EXPECT_DOUBLE_EQ(advice.prefill_tokens_per_s_per_node, 2'000);
  // 640 blocks * 16 tokens = 10240 KV tokens per decode node; 1101 tokens a sequence -> 9.
  EXPECT_DOUBLE_EQ(advice.decode_batch_per_node, 9);
  // 9 sequences at 20 ms a token.
  EXPECT_DOUBLE_EQ(advice.decode_tokens_per_s_per_node, 450);
  // Prefill: 9.17 req/s * 1000 = 9174 tokens/s / 2000 = 4.59 nodes, at 50% -> 9.17 -> 10.
  // Decode: 9.17 * 101 = 926.6 tokens/s / 450 = 2.06 nodes, at 50% -> 4.12 -> 5.
  ASSERT_TRUE(advice.prefill_nodes && advice.decode_nodes && advice.prefill_decode_ratio);
  EXPECT_EQ(*advice.prefill_nodes, 10);
  EXPECT_EQ(*advice.decode_nodes, 5);
  EXPECT_DOUBLE_EQ(*advice.prefill_decode_ratio, 2.0);
  EXPECT_NE(advice.explanation.find("10 prefill and 5 decode nodes (now 1 and 2)"),
            std::string::npos)
      << advice.explanation;
}

TEST(ClusterAdvisorTest, BatchIsCappedByMaxBatchAndUsesItWithoutKvInformation) {
  AdvisorOptions options = test_options();
  options.decode_max_batch = 4;
  ClusterAdvisor advisor(options);
  const auto now = Clock::now();
  record_steady(advisor, now, request(100, 11, 50, 100, 10));
  EXPECT_DOUBLE_EQ(advisor.advise(two_decode_nodes(1'000), now).decode_batch_per_node, 4);
  EXPECT_DOUBLE_EQ(advisor.advise(ClusterLoad{}, now).decode_batch_per_node, 4);
  EXPECT_DOUBLE_EQ(advisor.advise(ClusterLoad{}, now).decode_tokens_per_s_per_node, 400);
}

TEST(ClusterAdvisorTest, SloAttainmentNamesThePoolThatMissesIt) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  // 3 of 10 over the TTFT SLO (1000 ms): 70% < 90%. TPOT: 1 of 10 over 50 ms: 90%, met.
  for (int i = 0; i < 10; ++i) {
    advisor.record(request(100, 10, 10, i < 3 ? 1'500 : 200, i == 9 ? 80 : 30), now);
  }
  Advice advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_DOUBLE_EQ(advice.ttft_attainment, 0.7);
  EXPECT_DOUBLE_EQ(advice.tpot_attainment, 0.9);
  EXPECT_TRUE(advice.prefill_misses_slo);
  EXPECT_FALSE(advice.decode_misses_slo);
  EXPECT_NE(advice.explanation.find("prefill pool misses its TTFT SLO"), std::string::npos);

  advisor.record(request(100, 10, 10, 200, 90), now);  // TPOT 9/11 met -> missed
  advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_TRUE(advice.decode_misses_slo);
  EXPECT_NE(advice.explanation.find("decode pool misses its TPOT SLO"), std::string::npos);
}

TEST(ClusterAdvisorTest, FailedRequestsCountAsArrivalsButNotInMeans) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  advisor.record(request(100, 10, 10, 100, 10), now);
  FinishedRequest failed = request(900, 0, 0, 0, 0);
  failed.ok = false;
  advisor.record(failed, now);
  const Advice advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_EQ(advice.requests, 2);
  EXPECT_EQ(advice.failed, 1);
  EXPECT_DOUBLE_EQ(advice.mean_prompt_tokens, 100);
  EXPECT_DOUBLE_EQ(advice.arrival_rate, 2.0);  // both arrived 1 s ago
}

TEST(ClusterAdvisorTest, OldRecordsLeaveTheWindow) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  advisor.record(request(5'000, 10, 10, 100, 10), now - milliseconds(61'000));
  advisor.record(request(100, 10, 10, 100, 10), now - milliseconds(1'000));
  const Advice advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_EQ(advice.requests, 1);
  EXPECT_DOUBLE_EQ(advice.mean_prompt_tokens, 100);
  EXPECT_NEAR(advice.window_s, 2.0, 1e-6);
}

TEST(ClusterAdvisorTest, KeepsAtMostMaxRecords) {
  AdvisorOptions options = test_options();
  options.max_records = 3;
  ClusterAdvisor advisor(options);
  const auto now = Clock::now();
  for (int i = 0; i < 5; ++i) advisor.record(request(100 * (i + 1), 10, 10, 100, 10), now);
  const Advice advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_EQ(advice.requests, 3);
  EXPECT_DOUBLE_EQ(advice.mean_prompt_tokens, 400);  // the last three: 300, 400, 500
}

TEST(ClusterAdvisorTest, NoRatioWithoutMeasuredCapacities) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  EXPECT_FALSE(advisor.advise(ClusterLoad{}, now).prefill_decode_ratio);

  advisor.record(request(100, 10, 0, 100, 10), now);  // colocated: no prefill compute
  Advice advice = advisor.advise(ClusterLoad{}, now);
  EXPECT_FALSE(advice.prefill_decode_ratio);
  EXPECT_NE(advice.explanation.find("prefill capacity is unknown"), std::string::npos);

  ClusterAdvisor single_tokens(test_options());
  single_tokens.record(request(100, 1, 10, 100, 0), now);  // no second token: no TPOT
  advice = single_tokens.advise(ClusterLoad{}, now);
  EXPECT_FALSE(advice.prefill_decode_ratio);
  EXPECT_NE(advice.explanation.find("decode capacity is unknown"), std::string::npos);
}

TEST(ClusterAdvisorTest, JsonCarriesLoadNumbersAndRecommendation) {
  ClusterAdvisor advisor(test_options());
  const auto now = Clock::now();
  record_steady(advisor, now, request(1'000, 101, 500, 600, 20));
  ClusterLoad load = two_decode_nodes(640);
  load.decode.kv_blocks_used = 320;
  load.prefill.queued_prompt_tokens = 4'000;
  const nlohmann::json body = advisor.to_json(load, now);
  EXPECT_DOUBLE_EQ(body["load"]["decode"]["kv_usage"].get<double>(), 0.25);
  EXPECT_EQ(body["load"]["prefill"]["queued_prompt_tokens"], 4'000);
  EXPECT_EQ(body["slo"]["ttft_ms"], 1'000.0);
  EXPECT_EQ(body["capacity"]["decode_tokens_per_s_per_node"], 450.0);
  EXPECT_EQ(body["recommendation"]["prefill_nodes"], 10);
  EXPECT_EQ(body["recommendation"]["decode_nodes"], 5);
  EXPECT_TRUE(body["explanation"].is_string());

  ClusterAdvisor empty(test_options());
  EXPECT_TRUE(empty.to_json(ClusterLoad{}, now)["recommendation"]["prefill_nodes"].is_null());
}

// The line of `series` (name and labels) in the registry's text, e.g. `name{pool="decode"} 5`.
std::string series_line(const metrics::Registry& registry, const std::string& series) {
  const std::string text = registry.render();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return "(no " + series + ")";
  return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}

TEST(ClusterAdvisorTest, ExportsDesiredAndCurrentPoolSizesAsGauges) {
  const auto now = Clock::now();
  const ClusterLoad load = two_decode_nodes(640);  // 1 prefill and 2 decode nodes now
  metrics::Registry registry;

  // Idle (nothing finished in the window): 0, so that an HPA's minReplicas applies.
  ClusterAdvisor advisor(test_options());
  export_advice_metrics(advisor.advise(load, now), load, registry);
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="prefill"})"),
            R"(pdserve:cluster_advice_nodes{pool="prefill"} 0)");
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="decode"})"),
            R"(pdserve:cluster_advice_nodes{pool="decode"} 0)");
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_pool_nodes{pool="prefill"})"),
            R"(pdserve:cluster_pool_nodes{pool="prefill"} 1)");
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_pool_nodes{pool="decode"})"),
            R"(pdserve:cluster_pool_nodes{pool="decode"} 2)");

  // Measured (RecommendsNodesFromMeasuredCapacities' workload): the recommendation.
  record_steady(advisor, now, request(1'000, 101, 500, 600, 20));
  export_advice_metrics(advisor.advise(load, now), load, registry);
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="prefill"})"),
            R"(pdserve:cluster_advice_nodes{pool="prefill"} 10)");
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="decode"})"),
            R"(pdserve:cluster_advice_nodes{pool="decode"} 5)");

  // Requests but no prefill capacity (prefilled on the decode nodes): hold the current sizes.
  ClusterAdvisor colocated(test_options());
  colocated.record(request(100, 10, 0, 100, 10), now);
  export_advice_metrics(colocated.advise(load, now), load, registry);
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="prefill"})"),
            R"(pdserve:cluster_advice_nodes{pool="prefill"} 1)");
  EXPECT_EQ(series_line(registry, R"(pdserve:cluster_advice_nodes{pool="decode"})"),
            R"(pdserve:cluster_advice_nodes{pool="decode"} 2)");
}

}  // namespace
}  // namespace pdserve::proxy
