#include "serving/kv_tier_metrics.h"

#include <tuple>

#include "common/metrics/vllm_compat.h"

namespace pdserve {
namespace {

constexpr const char* kReloadsHelp =
    "Prefix hits in the KV tiers beyond the pool's: reloaded (landed), recomputed because the "
    "reload was estimated slower (declined), or recomputed after a failed or overdue reload.";
constexpr const char* kDiskErrorsHelp =
    "Disk tier I/O that failed (ENOSPC, EIO, unreadable or truncated files): the block left the "
    "cache, no request failed.";

}  // namespace

KvTierMetrics::TierSeries KvTierMetrics::tier_series(metrics::Registry& registry,
                                                     const std::string& tier) {
  const metrics::Labels labels{{"tier", tier}};
  return {
      registry.gauge("pdserve:kv_tier_blocks", "Prefix-cache blocks held in the KV tier.", labels),
      registry.gauge("pdserve:kv_tier_bytes", "Bytes the KV tier holds.", labels),
      registry.gauge("pdserve:kv_tier_capacity_bytes", "The KV tier's capacity.", labels),
      registry.counter("pdserve:kv_tier_hit_blocks_total",
                       "Blocks reloaded from the KV tier into the pool.", labels)};
}

KvTierMetrics::KvTierMetrics(metrics::Registry& registry, const std::string& model_name)
    : host_(tier_series(registry, "host")),
      disk_(tier_series(registry, "disk")),
      store_bytes_(registry.counter("vllm:kv_offload_store_bytes_total",
                                    "Bytes copied from the KV pool into the host tier.",
                                    metrics::vllm_labels(model_name))),
      load_bytes_(registry.counter("vllm:kv_offload_load_bytes_total",
                                   "Bytes reloaded from the KV tiers into the pool.",
                                   metrics::vllm_labels(model_name))),
      external_queries_(
          registry.counter("vllm:external_prefix_cache_queries_total",
                           "Prompt tokens looked up in the KV tiers beyond the pool's prefix hit.",
                           metrics::vllm_labels(model_name))),
      external_hits_(registry.counter("vllm:external_prefix_cache_hits_total",
                                      "Prompt tokens whose KV was reloaded from the KV tiers.",
                                      metrics::vllm_labels(model_name))),
      offloaded_blocks_(registry.counter("pdserve:kv_tier_offloaded_blocks_total",
                                         "Blocks copied from the pool into the host tier.")),
      reloaded_blocks_(registry.counter("pdserve:kv_tier_reloaded_blocks_total",
                                        "Blocks reloaded from the KV tiers into the pool.")),
      offload_seconds_(registry.counter("pdserve:kv_tier_offload_seconds_total",
                                        "Time of the offload copies (start to completion).")),
      reload_seconds_(registry.counter(
          "pdserve:kv_tier_reload_seconds_total",
          "Time of the reloads (checks, disk reads and copies, start to completion).")),
      offloads_skipped_(registry.counter("pdserve:kv_tier_offloads_skipped_total",
                                         "Blocks not offloaded because every host slot was busy.")),
      reloads_landed_(
          registry.counter("pdserve:kv_tier_reloads_total", kReloadsHelp, {{"outcome", "landed"}})),
      reloads_declined_(registry.counter("pdserve:kv_tier_reloads_total", kReloadsHelp,
                                         {{"outcome", "declined"}})),
      reloads_failed_(
          registry.counter("pdserve:kv_tier_reloads_total", kReloadsHelp, {{"outcome", "failed"}})),
      disk_write_errors_(registry.counter("pdserve:kv_tier_disk_errors_total", kDiskErrorsHelp,
                                          {{"op", "write"}})),
      disk_read_errors_(
          registry.counter("pdserve:kv_tier_disk_errors_total", kDiskErrorsHelp, {{"op", "read"}})),
      checksum_mismatches_(registry.counter(
          "pdserve:kv_tier_checksum_mismatches_total",
          "Tier blocks whose checksum did not match on the way back (dropped; recomputed).")) {}

void KvTierMetrics::publish(const KvTierStats& now, const KvTierStats& last) {
  for (auto [series, usage, before] :
       {std::tuple{&host_, &now.host, &last.host}, std::tuple{&disk_, &now.disk, &last.disk}}) {
    series->blocks.set(static_cast<double>(usage->blocks));
    series->bytes.set(static_cast<double>(usage->bytes));
    series->capacity_bytes.set(static_cast<double>(usage->capacity_bytes));
    series->hit_blocks.advance(usage->hit_blocks_total, before->hit_blocks_total);
  }
  store_bytes_.advance(now.offloaded_bytes_total, last.offloaded_bytes_total);
  load_bytes_.advance(now.reloaded_bytes_total, last.reloaded_bytes_total);
  external_queries_.advance(now.queried_tokens_total, last.queried_tokens_total);
  external_hits_.advance(now.reloaded_tokens_total, last.reloaded_tokens_total);
  offloaded_blocks_.advance(now.offloaded_blocks_total, last.offloaded_blocks_total);
  reloaded_blocks_.advance(now.reloaded_blocks_total, last.reloaded_blocks_total);
  offload_seconds_.advance(now.offload_seconds_total, last.offload_seconds_total);
  reload_seconds_.advance(now.reload_seconds_total, last.reload_seconds_total);
  offloads_skipped_.advance(now.offloads_skipped_total, last.offloads_skipped_total);
  reloads_landed_.advance(now.reloads_total - now.reloads_failed_total,
                          last.reloads_total - last.reloads_failed_total);
  reloads_declined_.advance(now.reloads_declined_total, last.reloads_declined_total);
  reloads_failed_.advance(now.reloads_failed_total, last.reloads_failed_total);
  disk_write_errors_.advance(now.disk_write_errors_total, last.disk_write_errors_total);
  disk_read_errors_.advance(now.disk_read_errors_total, last.disk_read_errors_total);
  checksum_mismatches_.advance(now.checksum_mismatches_total, last.checksum_mismatches_total);
}

}  // namespace pdserve
