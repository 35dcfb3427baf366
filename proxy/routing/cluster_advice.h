// GET /cluster/advice: how the cluster keeps up with its workload, and how many prefill and
// decode nodes the observed workload needs, in the spirit of DistServe's placement: each phase
// gets the nodes its own load needs, measured per node, instead of a fixed ratio.
//
// From the requests finished in a recent window (record) the advisor derives the arrival rate
// λ (req/s), the mean prompt and output tokens P and O, the SLO attainment of TTFT and TPOT,
// and two per-node capacities:
//  * prefill tokens/s per node = Σ prompt tokens / Σ prefill compute seconds (a prefill node
//    works on its prompts one step at a time, so this is its rate);
//  * decode tokens/s per node = B × 1000 / mean TPOT ms, where B is the batch a decode node
//    can hold: min(decode_max_batch, KV tokens per decode node / (P + O)) (decode is memory
//    bound: a step's time hardly grows with the batch, so throughput grows with it).
// Needed nodes: prefill λ·P / prefill tokens/s, decode λ·O / decode tokens/s, each divided by
// target_utilization (headroom for queueing) and rounded up; their ratio is the recommended
// prefill:decode ratio. A pool whose SLO attainment is below slo_target_fraction "misses its
// SLO". Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/metrics/metrics.h"

namespace pdserve::proxy {

// One request's outcome, from its timeline (all durations in milliseconds).
struct FinishedRequest {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2e_ms = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  double prefill_queue_ms = 0;
  double prefill_compute_ms = 0;
  double kv_transfer_ms = 0;
  double decode_queue_ms = 0;
  bool ok = false;
};

struct AdvisorOptions {
  double slo_ttft_ms = 2'000;        // --slo-ttft-ms
  double slo_tpot_ms = 100;          // --slo-tpot-ms
  double slo_target_fraction = 0.9;  // a pool meeting its SLO for fewer requests misses it
  std::chrono::milliseconds window{60'000};
  size_t max_records = 10'000;      // the oldest records go first beyond this
  double target_utilization = 0.8;  // plan nodes to run this busy, leaving room for bursts
  int kv_block_tokens = 16;         // the nodes' --block-size
  int decode_max_batch = 128;       // the nodes' --max-num-seqs
};

// A pool's load now (from the registry: heartbeats plus the proxy's own accounting).
struct PoolLoad {
  int nodes = 0;
  int in_flight = 0;                 // requests this proxy has there
  int64_t queued_prompt_tokens = 0;  // prompt tokens sent there and not yet done
  int running = 0;
  int waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
};

struct ClusterLoad {
  PoolLoad prefill;
  PoolLoad decode;
};

struct Advice {
  // Workload over the window.
  int requests = 0;  // finished in the window (ok or not)
  int failed = 0;
  double window_s = 0;  // from the first arrival in the window to now
  double arrival_rate = 0;
  double mean_prompt_tokens = 0;
  double mean_output_tokens = 0;
  // SLO attainment: the fraction of ok requests within the target.
  double ttft_attainment = 0;
  double tpot_attainment = 0;
  bool prefill_misses_slo = false;
  bool decode_misses_slo = false;
  // Measured capacities (0: not measured yet).
  double prefill_tokens_per_s_per_node = 0;
  double decode_batch_per_node = 0;
  double decode_tokens_per_s_per_node = 0;
  // Recommendation (empty when a capacity is unknown).
  std::optional<int> prefill_nodes;
  std::optional<int> decode_nodes;
  std::optional<double> prefill_decode_ratio;
  std::string explanation;
};

class ClusterAdvisor {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ClusterAdvisor(AdvisorOptions options) : options_(options) {}

  // A request finished now (its arrival is now - e2e_ms).
  void record(const FinishedRequest& request) { record(request, Clock::now()); }
  void record(const FinishedRequest& request, Clock::time_point finished_at);

  Advice advise(const ClusterLoad& load, Clock::time_point now);
  // The GET /cluster/advice body: load, SLOs, the numbers used and the advice, with prose.
  nlohmann::json to_json(const ClusterLoad& load, Clock::time_point now);

  const AdvisorOptions& options() const { return options_; }

 private:
  struct Entry {
    FinishedRequest request;
    Clock::time_point finished_at;
  };

  AdvisorOptions options_;
  std::mutex mutex_;
  std::deque<Entry> entries_;  // oldest first
};

// The advice as gauges, for a HorizontalPodAutoscaler through prometheus-adapter (docs/METRICS.md):
// pdserve:cluster_advice_nodes{pool} is the pool's desired size: the recommendation; 0 when no
// request finished in the window (idle: the HPA's minReplicas applies); the current size when a
// capacity is unknown (hold). pdserve:cluster_pool_nodes{pool} is the current size (routable
// nodes: draining ones do not count).
void export_advice_metrics(const Advice& advice, const ClusterLoad& load,
                           metrics::Registry& registry);

}  // namespace pdserve::proxy
