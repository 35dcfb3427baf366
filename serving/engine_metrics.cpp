#include "serving/engine_metrics.h"

#include <string>

#include "common/metrics/vllm_compat.h"

namespace pdserve {
namespace {

constexpr const char* kNodeStateHelp =
    "1 for the node's state: up (serving), draining (the proxy drained it: no new work).";

// A counter that may not be registered (null).
void advance(metrics::Counter* counter, int64_t now, int64_t before) {
  if (counter != nullptr) counter->advance(now, before);
}

}  // namespace

EngineMetrics::EngineMetrics(metrics::Registry& registry, const std::string& model_name,
                             NodeRole role, const ServiceStats& baseline)
    : running_(registry.gauge("vllm:num_requests_running",
                              "Number of requests in model execution batches.",
                              metrics::vllm_labels(model_name))),
      waiting_(registry.gauge("vllm:num_requests_waiting",
                              "Number of requests waiting to be processed.",
                              metrics::vllm_labels(model_name))),
      kv_usage_(registry.gauge("vllm:kv_cache_usage_perc",
                               "KV-cache usage. 1 means 100 percent usage.",
                               metrics::vllm_labels(model_name))),
      kv_blocks_total_(registry.gauge("pdserve:kv_cache_blocks_total", "KV blocks in the pool.")),
      kv_blocks_used_(
          registry.gauge("pdserve:kv_cache_blocks_used", "KV blocks held by sequences.")),
      kv_blocks_cached_(
          registry.gauge("pdserve:kv_cache_blocks_cached",
                         "Free KV blocks that keep prefix-cache content (evictable).")),
      prefix_queries_(
          registry.counter("vllm:prefix_cache_queries_total",
                           "Prefix cache queries, in terms of number of queried tokens.",
                           metrics::vllm_labels(model_name))),
      prefix_hits_(registry.counter("vllm:prefix_cache_hits_total",
                                    "Prefix cache hits, in terms of number of cached tokens.",
                                    metrics::vllm_labels(model_name))),
      preemptions_(registry.counter("vllm:num_preemptions_total",
                                    "Cumulative number of preemption from the engine.",
                                    metrics::vllm_labels(model_name))),
      state_up_(registry.gauge("pdserve:node_state", kNodeStateHelp, {{"state", "up"}})),
      state_draining_(
          registry.gauge("pdserve:node_state", kNodeStateHelp, {{"state", "draining"}})),
      last_(baseline) {
  state_up_.set(1.0);
  registry
      .gauge("pdserve:node_info", "The node's role and served model (always 1).",
             {{"role", std::string(node_role_name(role))}, {"model_name", model_name}})
      .set(1.0);
  if (baseline.kv_tiers.enabled) kv_tiers_ = std::make_unique<KvTierMetrics>(registry, model_name);
  if (role != NodeRole::kDecode) return;
  if (!baseline.spec_decode_method.empty()) {
    spec_drafts_ =
        &registry.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
                          metrics::vllm_labels(model_name));
    spec_draft_tokens_ =
        &registry.counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
                          metrics::vllm_labels(model_name));
    spec_accepted_tokens_ =
        &registry.counter("vllm:spec_decode_num_accepted_tokens_total",
                          "Number of accepted tokens.", metrics::vllm_labels(model_name));
    for (size_t position = 0; position < baseline.spec_decode.accepted_per_position.size();
         ++position) {
      metrics::Labels labels = metrics::vllm_labels(model_name);
      labels.emplace_back("position", std::to_string(position));
      spec_accepted_per_position_.push_back(&registry.counter(
          "vllm:spec_decode_num_accepted_tokens_per_pos_total",
          "Accepted tokens per draft's position in the speculative sequences.", labels));
    }
  }
  prompt_tokens_ =
      &registry.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                        metrics::vllm_labels(model_name));
  generation_tokens_ =
      &registry.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
                        metrics::vllm_labels(model_name));
  kv_checksum_mismatches_ = &registry.counter(
      "pdserve:kv_checksum_mismatches_total",
      "Imported KV that failed its block checksums (then fetched again or prefilled here).");
  kv_refetches_ = &registry.counter(
      "pdserve:kv_refetches_total",
      "Imported KV that failed its checksums and was fetched again from another prefill node.");
  remote_prefill_fallbacks_ =
      &registry.counter("pdserve:remote_prefill_fallbacks_total",
                        "Remote prefills that failed and were prefilled here instead.");
  remote_prefills_served_from_cache_ = &registry.counter(
      "pdserve:remote_prefills_served_from_cache_total",
      "Resumed streams routed with a remote prefill whose KV was all cached here already.");
  kv_import_hold_expired_ = &registry.counter(
      "pdserve:kv_import_hold_expired_total",
      "Blocks reserved for a remote prefill freed only at the hold deadline: nothing confirmed "
      "that no put of the prefill node could still land.");
}

void EngineMetrics::publish(const ServiceStats& stats, bool draining) {
  state_up_.set(draining ? 0.0 : 1.0);
  state_draining_.set(draining ? 1.0 : 0.0);
  running_.set(stats.num_running);
  waiting_.set(stats.num_waiting);
  kv_usage_.set(stats.kv_blocks_total > 0
                    ? static_cast<double>(stats.kv_blocks_used) / stats.kv_blocks_total
                    : 0.0);
  kv_blocks_total_.set(stats.kv_blocks_total);
  kv_blocks_used_.set(stats.kv_blocks_used);
  kv_blocks_cached_.set(stats.kv_blocks_cached);

  std::lock_guard lock(mutex_);
  advance(&prefix_queries_, stats.prefix_cache_queried_tokens, last_.prefix_cache_queried_tokens);
  advance(&prefix_hits_, stats.prefix_cache_hit_tokens, last_.prefix_cache_hit_tokens);
  advance(&preemptions_, stats.preemptions_total, last_.preemptions_total);
  advance(prompt_tokens_, stats.prompt_tokens_total, last_.prompt_tokens_total);
  advance(generation_tokens_, stats.generation_tokens_total, last_.generation_tokens_total);
  advance(kv_checksum_mismatches_, stats.kv_checksum_mismatches_total,
          last_.kv_checksum_mismatches_total);
  advance(kv_refetches_, stats.kv_refetches_total, last_.kv_refetches_total);
  advance(remote_prefill_fallbacks_, stats.remote_prefill_fallbacks_total,
          last_.remote_prefill_fallbacks_total);
  advance(remote_prefills_served_from_cache_, stats.remote_prefills_served_from_cache_total,
          last_.remote_prefills_served_from_cache_total);
  advance(kv_import_hold_expired_, stats.kv_import_hold_expired_total,
          last_.kv_import_hold_expired_total);
  advance(spec_drafts_, stats.spec_decode.num_drafts, last_.spec_decode.num_drafts);
  advance(spec_draft_tokens_, stats.spec_decode.num_draft_tokens,
          last_.spec_decode.num_draft_tokens);
  advance(spec_accepted_tokens_, stats.spec_decode.num_accepted_tokens,
          last_.spec_decode.num_accepted_tokens);
  const auto& now_per_position = stats.spec_decode.accepted_per_position;
  const auto& before_per_position = last_.spec_decode.accepted_per_position;
  for (size_t position = 0;
       position < spec_accepted_per_position_.size() && position < now_per_position.size() &&
       position < before_per_position.size();
       ++position) {
    advance(spec_accepted_per_position_[position], now_per_position[position],
            before_per_position[position]);
  }
  if (kv_tiers_) kv_tiers_->publish(stats.kv_tiers, last_.kv_tiers);
  last_ = stats;
}

}  // namespace pdserve
