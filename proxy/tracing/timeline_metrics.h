// The PD split of one request, read from its aligned timeline, and the proxy histograms fed
// from it (vLLM-style names, seconds):
//   pdserve:proxy_time_to_first_token_seconds, pdserve:proxy_time_per_output_token_seconds,
//   pdserve:proxy_inter_token_latency_seconds, pdserve:proxy_prefill_queue_time_seconds,
//   pdserve:proxy_prefill_time_seconds, pdserve:proxy_kv_transfer_time_seconds,
//   pdserve:proxy_decode_queue_time_seconds.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/protocol/request_timeline.h"
#include "proxy/routing/cluster_advice.h"

namespace pdserve::proxy {

// Choice 0's phases; a phase the request did not go through (e.g. no KV transfer when the
// decode node prefilled) is nullopt.
struct TimelineSummary {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  double e2e_ms = 0.0;
  std::vector<double> inter_token_ms;  // gaps between consecutive tokens
  int64_t output_tokens = 0;
  int64_t prompt_tokens_computed = 0;        // Σ prefill.chunk args.prompt_tokens
  std::optional<double> prefill_queue_ms;    // prefill.queue
  std::optional<double> prefill_compute_ms;  // first prefill.chunk start -> last chunk end
  std::optional<double> kv_transfer_ms;      // kv_transfer.ms, else the kv.transfer span
  std::optional<double> decode_queue_ms;     // decode.queue
};

// From the timeline align_timeline() made.
TimelineSummary summarize_timeline(const RequestTimeline& aligned);

// The advisor's view of the request (GET /cluster/advice); absent phases count as 0.
FinishedRequest finished_request(const TimelineSummary& summary);

// Creates the histograms observe_timeline() feeds, empty (a dashboard sees them from the start).
void declare_timeline_metrics(metrics::Registry& metrics);

void observe_timeline(metrics::Registry& metrics, const TimelineSummary& summary);

}  // namespace pdserve::proxy
