// The engine-state series both node roles export (serving/engine_metrics.h): present at zero
// from construction, counters that follow the engine's totals from the baseline on, the token
// counters on decode nodes only, and the node state.
#include "serving/engine_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace pdserve {
namespace {

const std::string kLabels = "{model_name=\"m\",engine=\"0\"}";

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(EngineMetricsTest, EverySeriesAtZeroFromConstructionWithTheWarmUpExcluded) {
  metrics::Registry registry;
  ServiceStats warmed_up;
  warmed_up.generation_tokens_total = 2;
  warmed_up.prompt_tokens_total = 8;
  EngineMetrics engine(registry, "m", NodeRole::kDecode, warmed_up);
  const std::string text = registry.render();
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"}) {
    EXPECT_TRUE(has_line(text, name + kLabels + " 0")) << name << "\n" << text;
  }
  EXPECT_TRUE(has_line(text, "pdserve:node_info{role=\"decode\",model_name=\"m\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:node_state{state=\"up\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:node_state{state=\"draining\"} 0")) << text;

  ServiceStats later = warmed_up;
  later.generation_tokens_total = 12;
  later.prompt_tokens_total = 40;
  later.kv_blocks_total = 100;
  later.kv_blocks_used = 25;
  engine.publish(later, /*draining=*/true);
  engine.publish(later, /*draining=*/true);  // a second scrape adds nothing
  const std::string after = registry.render();
  EXPECT_TRUE(has_line(after, "vllm:generation_tokens_total" + kLabels + " 10")) << after;
  EXPECT_TRUE(has_line(after, "vllm:prompt_tokens_total" + kLabels + " 32")) << after;
  EXPECT_TRUE(has_line(after, "vllm:kv_cache_usage_perc" + kLabels + " 0.25")) << after;
  EXPECT_TRUE(has_line(after, "pdserve:node_state{state=\"up\"} 0")) << after;
  EXPECT_TRUE(has_line(after, "pdserve:node_state{state=\"draining\"} 1")) << after;
}

// Issue #34 item 3: import blocks freed at their hold deadline, counted on decode nodes.
TEST(EngineMetricsTest, HoldExpiriesCountOnADecodeNode) {
  metrics::Registry registry;
  EngineMetrics engine(registry, "m", NodeRole::kDecode, ServiceStats{});
  EXPECT_TRUE(has_line(registry.render(), "pdserve:kv_import_hold_expired_total 0"))
      << registry.render();
  ServiceStats later;
  later.kv_import_hold_expired_total = 3;
  engine.publish(later, /*draining=*/false);
  EXPECT_TRUE(has_line(registry.render(), "pdserve:kv_import_hold_expired_total 3"))
      << registry.render();
}

// A request's tokens are counted by its decode node only, so that a sum over all nodes counts
// each once.
TEST(EngineMetricsTest, APrefillNodeExportsNoTokenCounters) {
  metrics::Registry registry;
  EngineMetrics engine(registry, "m", NodeRole::kPrefill, ServiceStats{});
  const std::string text = registry.render();
  EXPECT_EQ(text.find("vllm:prompt_tokens_total"), std::string::npos) << text;
  EXPECT_EQ(text.find("vllm:generation_tokens_total"), std::string::npos) << text;
  EXPECT_TRUE(has_line(text, "vllm:num_requests_running" + kLabels + " 0")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:node_info{role=\"prefill\",model_name=\"m\"} 1")) << text;
}

// Issue #30: vLLM's spec-decode series on a node that speculates, none on one that does not.
TEST(EngineMetricsTest, SpecDecodeCountersFollowTheEngine) {
  metrics::Registry plain_registry;
  EngineMetrics plain(plain_registry, "m", NodeRole::kDecode, ServiceStats{});
  EXPECT_EQ(plain_registry.render().find("spec_decode"), std::string::npos);

  metrics::Registry registry;
  ServiceStats baseline;
  baseline.spec_decode_method = "ngram";
  baseline.spec_decode.accepted_per_position = {1, 0, 0};  // warm-up: excluded
  baseline.spec_decode.num_drafts = 1;
  baseline.spec_decode.num_draft_tokens = 3;
  baseline.spec_decode.num_accepted_tokens = 1;
  EngineMetrics engine(registry, "m", NodeRole::kDecode, baseline);
  const std::string text = registry.render();
  for (const char* name :
       {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total"}) {
    EXPECT_TRUE(has_line(text, name + kLabels + " 0")) << name << "\n" << text;
  }
  ServiceStats later = baseline;
  later.spec_decode.num_drafts = 5;
  later.spec_decode.num_draft_tokens = 15;
  later.spec_decode.num_accepted_tokens = 8;
  later.spec_decode.accepted_per_position = {5, 3, 1};
  engine.publish(later, false);
  const std::string after = registry.render();
  EXPECT_TRUE(has_line(after, "vllm:spec_decode_num_drafts_total" + kLabels + " 4")) << after;
  EXPECT_TRUE(has_line(after, "vllm:spec_decode_num_draft_tokens_total" + kLabels + " 12"))
      << after;
  EXPECT_TRUE(has_line(after, "vllm:spec_decode_num_accepted_tokens_total" + kLabels + " 7"))
      << after;
  EXPECT_TRUE(has_line(after,
                       "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\","
                       "engine=\"0\",position=\"0\"} 4"))
      << after;
  EXPECT_TRUE(has_line(after,
                       "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\","
                       "engine=\"0\",position=\"2\"} 1"))
      << after;
}

// Issue #32: the KV tier series, on a node with tiers only, following the store's figures.
TEST(EngineMetricsTest, KvTierSeriesExistOnlyWithTiersAndFollowTheirFigures) {
  metrics::Registry without;
  EngineMetrics plain(without, "m", NodeRole::kDecode, ServiceStats{});
  EXPECT_EQ(without.render().find("kv_tier"), std::string::npos);
  EXPECT_EQ(without.render().find("kv_offload"), std::string::npos);

  metrics::Registry registry;
  ServiceStats baseline;
  baseline.kv_tiers.enabled = true;
  baseline.kv_tiers.offloaded_bytes_total = 100;  // the warm-up's
  EngineMetrics engine(registry, "m", NodeRole::kPrefill, baseline);
  EXPECT_TRUE(has_line(registry.render(), "vllm:kv_offload_store_bytes_total" + kLabels + " 0"))
      << registry.render();
  ServiceStats later = baseline;
  later.kv_tiers.offloaded_bytes_total = 1100;
  later.kv_tiers.reloaded_bytes_total = 300;
  later.kv_tiers.queried_tokens_total = 96;
  later.kv_tiers.reloaded_tokens_total = 64;
  later.kv_tiers.host = {3, 3000, 8000, 2};
  later.kv_tiers.disk = {5, 5500, 90000, 1};
  later.kv_tiers.reloads_total = 3;
  later.kv_tiers.reloads_failed_total = 1;
  later.kv_tiers.reloads_declined_total = 4;
  later.kv_tiers.disk_write_errors_total = 2;
  engine.publish(later, false);
  engine.publish(later, false);
  const std::string text = registry.render();
  EXPECT_TRUE(has_line(text, "vllm:kv_offload_store_bytes_total" + kLabels + " 1000")) << text;
  EXPECT_TRUE(has_line(text, "vllm:kv_offload_load_bytes_total" + kLabels + " 300")) << text;
  EXPECT_TRUE(has_line(text, "vllm:external_prefix_cache_queries_total" + kLabels + " 96"));
  EXPECT_TRUE(has_line(text, "vllm:external_prefix_cache_hits_total" + kLabels + " 64"));
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_blocks{tier=\"host\"} 3")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_bytes{tier=\"disk\"} 5500")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_capacity_bytes{tier=\"disk\"} 90000")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_hit_blocks_total{tier=\"host\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_reloads_total{outcome=\"landed\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_reloads_total{outcome=\"failed\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_reloads_total{outcome=\"declined\"} 4")) << text;
  EXPECT_TRUE(has_line(text, "pdserve:kv_tier_disk_errors_total{op=\"write\"} 2")) << text;
}

}  // namespace
}  // namespace pdserve
