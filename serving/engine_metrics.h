// The /metrics series a node's engine state feeds, shared by pdserve-decode and pdserve-prefill:
// vLLM's names, labels and types (common/metrics/vllm_compat.h) for what vLLM has, pdserve's
// for the rest. Every series exists from construction, at zero.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cluster/cluster_messages.h"
#include "common/engine/inference_service.h"
#include "common/metrics/metrics.h"
#include "serving/kv_tier_metrics.h"

namespace pdserve {

class EngineMetrics {
 public:
  // `baseline`: the engine's totals now; the counters count from there (a node's warm-up is not
  // traffic). Only a decode node exports the token counters: every client request passes
  // through exactly one decode node, which counts its whole prompt and every token, so a sum
  // over all nodes counts each once.
  EngineMetrics(metrics::Registry& registry, const std::string& model_name, NodeRole role,
                const ServiceStats& baseline);

  // Copies `stats` into the gauges and advances the counters by what the engine's totals grew
  // since the previous call; `draining`: the proxy drained this node. Thread-safe: concurrent
  // scrapes add each increase once.
  void publish(const ServiceStats& stats, bool draining);

 private:
  metrics::Gauge& running_;
  metrics::Gauge& waiting_;
  metrics::Gauge& kv_usage_;
  metrics::Gauge& kv_blocks_total_;
  metrics::Gauge& kv_blocks_used_;
  metrics::Gauge& kv_blocks_cached_;
  metrics::Counter& prefix_queries_;
  metrics::Counter& prefix_hits_;
  metrics::Counter& preemptions_;
  metrics::Gauge& state_up_;
  metrics::Gauge& state_draining_;
  // Decode node only (null on a prefill node).
  metrics::Counter* prompt_tokens_ = nullptr;
  metrics::Counter* generation_tokens_ = nullptr;
  metrics::Counter* kv_checksum_mismatches_ = nullptr;
  metrics::Counter* kv_refetches_ = nullptr;
  metrics::Counter* remote_prefill_fallbacks_ = nullptr;
  metrics::Counter* remote_prefills_served_from_cache_ = nullptr;
  metrics::Counter* kv_import_hold_expired_ = nullptr;
  // A node that speculates (ServiceStats::spec_decode_method set): vLLM's spec-decode series.
  metrics::Counter* spec_drafts_ = nullptr;
  metrics::Counter* spec_draft_tokens_ = nullptr;
  metrics::Counter* spec_accepted_tokens_ = nullptr;
  std::vector<metrics::Counter*> spec_accepted_per_position_;
  std::unique_ptr<KvTierMetrics> kv_tiers_;  // a node with lower KV tiers only
  std::mutex mutex_;
  ServiceStats last_;  // guarded by mutex_
};

}  // namespace pdserve
