#include "proxy/routing/cluster_advice.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << value;
  return out.str();
}

Json pool_json(const PoolLoad& pool) {
  return {{"nodes", pool.nodes},
          {"proxy_in_flight", pool.in_flight},
          {"queued_prompt_tokens", pool.queued_prompt_tokens},
          {"running", pool.running},
          {"waiting", pool.waiting},
          {"kv_blocks_total", pool.kv_blocks_total},
          {"kv_blocks_used", pool.kv_blocks_used},
          {"kv_usage", pool.kv_blocks_total > 0 ? static_cast<double>(pool.kv_blocks_used) /
                                                      static_cast<double>(pool.kv_blocks_total)
                                                : 0.0}};
}

template <typename T>
Json optional_json(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

}  // namespace

void ClusterAdvisor::record(const FinishedRequest& request, Clock::time_point finished_at) {
  std::lock_guard lock(mutex_);
  entries_.push_back({request, finished_at});
  while (entries_.size() > options_.max_records) entries_.pop_front();
}

Advice ClusterAdvisor::advise(const ClusterLoad& load, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  while (!entries_.empty() && now - entries_.front().finished_at > options_.window) {
    entries_.pop_front();
  }
  Advice advice;
  int ok_requests = 0;
  int ttft_met = 0;
  int tpot_met = 0;
  int tpot_measured = 0;
  double prompt_tokens = 0;
  double output_tokens = 0;
  double prefill_tokens = 0;
  double prefill_compute_s = 0;
  double tpot_sum_ms = 0;
  Clock::time_point first_arrival = now;
  for (const Entry& entry : entries_) {
    const FinishedRequest& request = entry.request;
    ++advice.requests;
    const auto arrival =
        entry.finished_at - std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double, std::milli>(request.e2e_ms));
    first_arrival = std::min(first_arrival, arrival);
    if (!request.ok) {
      ++advice.failed;
      continue;
    }
    ++ok_requests;
    prompt_tokens += request.prompt_tokens;
    output_tokens += request.output_tokens;
    if (request.ttft_ms <= options_.slo_ttft_ms) ++ttft_met;
    // TPOT exists only for requests with a second token.
    if (request.output_tokens > 1) {
      ++tpot_measured;
      tpot_sum_ms += request.tpot_ms;
      if (request.tpot_ms <= options_.slo_tpot_ms) ++tpot_met;
    }
    if (request.prefill_compute_ms > 0) {
      prefill_tokens += request.prompt_tokens;
      prefill_compute_s += request.prefill_compute_ms / 1000.0;
    }
  }
  advice.window_s = std::chrono::duration<double>(now - first_arrival).count();
  if (advice.requests == 0 || advice.window_s <= 0) {
    advice.explanation = "No request finished in the last " +
                         fixed(std::chrono::duration<double>(options_.window).count(), 0) +
                         " s: nothing to measure yet.";
    return advice;
  }
  advice.arrival_rate = advice.requests / advice.window_s;
  if (ok_requests == 0) {
    advice.explanation = "All " + std::to_string(advice.requests) +
                         " requests in the window failed: no capacity can be measured.";
    return advice;
  }
  advice.mean_prompt_tokens = prompt_tokens / ok_requests;
  advice.mean_output_tokens = output_tokens / ok_requests;
  advice.ttft_attainment = static_cast<double>(ttft_met) / ok_requests;
  advice.tpot_attainment = tpot_measured > 0 ? static_cast<double>(tpot_met) / tpot_measured : 1.0;
  advice.prefill_misses_slo = advice.ttft_attainment < options_.slo_target_fraction;
  advice.decode_misses_slo = advice.tpot_attainment < options_.slo_target_fraction;

  if (prefill_compute_s > 0)
    advice.prefill_tokens_per_s_per_node = prefill_tokens / prefill_compute_s;
  const double mean_tpot_ms = tpot_measured > 0 ? tpot_sum_ms / tpot_measured : 0;
  double batch = options_.decode_max_batch;
  if (load.decode.nodes > 0 && load.decode.kv_blocks_total > 0) {
    const double kv_tokens_per_node = static_cast<double>(load.decode.kv_blocks_total) *
                                      options_.kv_block_tokens / load.decode.nodes;
    const double tokens_per_sequence =
        std::max(1.0, advice.mean_prompt_tokens + advice.mean_output_tokens);
    batch = std::min(batch, std::floor(kv_tokens_per_node / tokens_per_sequence));
  }
  advice.decode_batch_per_node = std::max(batch, 0.0);
  if (mean_tpot_ms > 0) {
    advice.decode_tokens_per_s_per_node = advice.decode_batch_per_node * 1000.0 / mean_tpot_ms;
  }

  std::string prose =
      "Over the last " + fixed(advice.window_s, 1) + " s, " + std::to_string(advice.requests) +
      " requests arrived at " + fixed(advice.arrival_rate, 2) + " req/s with " +
      fixed(advice.mean_prompt_tokens, 1) + " prompt and " + fixed(advice.mean_output_tokens, 1) +
      " output tokens on average. TTFT met " + fixed(options_.slo_ttft_ms, 0) + " ms for " +
      fixed(100 * advice.ttft_attainment, 1) + "% of requests, TPOT met " +
      fixed(options_.slo_tpot_ms, 0) + " ms for " + fixed(100 * advice.tpot_attainment, 1) + "%.";
  if (advice.prefill_misses_slo) prose += " The prefill pool misses its TTFT SLO.";
  if (advice.decode_misses_slo) prose += " The decode pool misses its TPOT SLO.";

  if (advice.prefill_tokens_per_s_per_node <= 0 || advice.decode_tokens_per_s_per_node <= 0) {
    prose += advice.prefill_tokens_per_s_per_node <= 0
                 ? " No request was prefilled on a prefill node, so prefill capacity is unknown"
                 : " No request decoded a second token, so decode capacity is unknown";
    prose += " and no ratio is recommended.";
    advice.explanation = std::move(prose);
    return advice;
  }
  const double prefill_demand = advice.arrival_rate * advice.mean_prompt_tokens;
  const double decode_demand = advice.arrival_rate * advice.mean_output_tokens;
  const double prefill_needed = prefill_demand / advice.prefill_tokens_per_s_per_node;
  const double decode_needed = decode_demand / advice.decode_tokens_per_s_per_node;
  advice.prefill_nodes =
      std::max(1, static_cast<int>(std::ceil(prefill_needed / options_.target_utilization)));
  advice.decode_nodes =
      std::max(1, static_cast<int>(std::ceil(decode_needed / options_.target_utilization)));
  advice.prefill_decode_ratio = static_cast<double>(*advice.prefill_nodes) / *advice.decode_nodes;
  prose += " Prefill needs " + fixed(prefill_demand, 0) +
           " prompt tokens/s and a prefill node does " +
           fixed(advice.prefill_tokens_per_s_per_node, 0) + ", so " + fixed(prefill_needed, 2) +
           " nodes; decode needs " + fixed(decode_demand, 0) +
           " output tokens/s and a decode node holding " + fixed(advice.decode_batch_per_node, 0) +
           " sequences at " + fixed(mean_tpot_ms, 1) + " ms per token does " +
           fixed(advice.decode_tokens_per_s_per_node, 0) + ", so " + fixed(decode_needed, 2) +
           " nodes. At " + fixed(100 * options_.target_utilization, 0) +
           "% utilization: " + std::to_string(*advice.prefill_nodes) + " prefill and " +
           std::to_string(*advice.decode_nodes) + " decode nodes (now " +
           std::to_string(load.prefill.nodes) + " and " + std::to_string(load.decode.nodes) + ").";
  advice.explanation = std::move(prose);
  return advice;
}

Json ClusterAdvisor::to_json(const ClusterLoad& load, Clock::time_point now) {
  const Advice advice = advise(load, now);
  return {{"load", {{"prefill", pool_json(load.prefill)}, {"decode", pool_json(load.decode)}}},
          {"slo",
           {{"ttft_ms", options_.slo_ttft_ms},
            {"tpot_ms", options_.slo_tpot_ms},
            {"target_fraction", options_.slo_target_fraction},
            {"window_s", std::chrono::duration<double>(options_.window).count()},
            {"ttft_attainment", advice.ttft_attainment},
            {"tpot_attainment", advice.tpot_attainment},
            {"prefill_misses_slo", advice.prefill_misses_slo},
            {"decode_misses_slo", advice.decode_misses_slo}}},
          {"workload",
           {{"requests", advice.requests},
            {"failed", advice.failed},
            {"window_s", advice.window_s},
            {"arrival_rate", advice.arrival_rate},
            {"mean_prompt_tokens", advice.mean_prompt_tokens},
            {"mean_output_tokens", advice.mean_output_tokens}}},
          {"capacity",
           {{"prefill_tokens_per_s_per_node", advice.prefill_tokens_per_s_per_node},
            {"decode_batch_per_node", advice.decode_batch_per_node},
            {"decode_tokens_per_s_per_node", advice.decode_tokens_per_s_per_node},
            {"target_utilization", options_.target_utilization}}},
          {"recommendation",
           {{"prefill_nodes", optional_json(advice.prefill_nodes)},
            {"decode_nodes", optional_json(advice.decode_nodes)},
            {"prefill_decode_ratio", optional_json(advice.prefill_decode_ratio)}}},
          {"explanation", advice.explanation}};
}

void export_advice_metrics(const Advice& advice, const ClusterLoad& load,
                           metrics::Registry& registry) {
  for (const auto& [pool, recommended, current] :
       {std::tuple{"prefill", advice.prefill_nodes, load.prefill.nodes},
        std::tuple{"decode", advice.decode_nodes, load.decode.nodes}}) {
    const int desired = recommended ? *recommended : advice.requests == 0 ? 0 : current;
    registry
        .gauge("pdserve:cluster_advice_nodes",
               "Nodes GET /cluster/advice wants in the pool (0: idle, the current size: unknown).",
               {{"pool", pool}})
        .set(desired);
    registry
        .gauge("pdserve:cluster_pool_nodes", "Routable nodes in the pool (draining ones excluded).",
               {{"pool", pool}})
        .set(current);
  }
}

}  // namespace pdserve::proxy
