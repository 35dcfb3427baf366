// The /metrics series of a node's lower KV tiers (issue #32; docs/METRICS.md), registered only
// on a node that has them: vLLM's names where its KV offloading has the figure
// (vllm:kv_offload_*_bytes_total, vllm:external_prefix_cache_*_total), pdserve:kv_tier_* for
// the rest, per tier where the figure is a tier's.
#pragma once

#include <string>

#include "common/engine/kv_tier.h"
#include "common/metrics/metrics.h"

namespace pdserve {

class KvTierMetrics {
 public:
  KvTierMetrics(metrics::Registry& registry, const std::string& model_name);

  // Gauges from `now`, counters advanced by what grew since `last`. Not thread-safe (the
  // caller serializes publishes).
  void publish(const KvTierStats& now, const KvTierStats& last);

 private:
  struct TierSeries {
    metrics::Gauge& blocks;
    metrics::Gauge& bytes;
    metrics::Gauge& capacity_bytes;
    metrics::Counter& hit_blocks;
  };
  static TierSeries tier_series(metrics::Registry& registry, const std::string& tier);

  TierSeries host_;
  TierSeries disk_;
  metrics::Counter& store_bytes_;
  metrics::Counter& load_bytes_;
  metrics::Counter& external_queries_;
  metrics::Counter& external_hits_;
  metrics::Counter& offloaded_blocks_;
  metrics::Counter& reloaded_blocks_;
  metrics::Counter& offload_seconds_;
  metrics::Counter& reload_seconds_;
  metrics::Counter& offloads_skipped_;
  metrics::Counter& reloads_landed_;
  metrics::Counter& reloads_declined_;
  metrics::Counter& reloads_failed_;
  metrics::Counter& disk_write_errors_;
  metrics::Counter& disk_read_errors_;
  metrics::Counter& checksum_mismatches_;
};

}  // namespace pdserve
