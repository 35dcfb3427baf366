// The OpenAI front end's request series on /metrics: vLLM's request histograms and counters
// (TTFT, inter-token latency, e2e, queue/prefill/decode/inference phases, token counts, successes
// by finish reason), pdserve's remote-prefill phases, HTTP responses by status, and one log line
// per finished choice. Every series is created with the front end (a dashboard sees them at zero
// before the first request) and resolved once, so recording never waits on the registry's lock,
// which a /metrics scrape holds while it renders.
#pragma once

#include <array>
#include <iterator>
#include <optional>

#include "common/engine/inference_service.h"
#include "common/metrics/metrics.h"

namespace pdserve {

class RequestMetrics {
 public:
  RequestMetrics(metrics::Registry& registry, const ModelInfo& model);

  void count_response(int http_status);
  // A choice's final delta (with timings.finished): its successes, latencies and phases, and
  // its log line.
  void record_finished(const SequenceDelta& delta);
  void record_inter_token_latency(double seconds);

 private:
  // Prefill, decode and inference times; for remotely prefilled requests the remote prefill,
  // the wait for the KV and the transfer.
  void record_phases(const SequenceDelta& delta);

  // The finish reasons an engine request can end with (vLLM's request_success_total labels).
  static constexpr FinishReason kFinishReasons[] = {FinishReason::kStop, FinishReason::kLength};

  metrics::Registry& registry_;
  metrics::Histogram* ttft_;
  metrics::Histogram* inter_token_;
  metrics::Histogram* inter_token_deprecated_;
  metrics::Histogram* request_tpot_;
  metrics::Histogram* e2e_;
  metrics::Histogram* queue_;
  metrics::Histogram* prefill_;
  metrics::Histogram* decode_;
  metrics::Histogram* inference_;
  metrics::Histogram* prompt_tokens_;
  metrics::Histogram* generation_tokens_;
  // By FinishReason; kNone's slot stays null (a finished request always has a reason).
  std::array<metrics::Counter*, std::size(kFinishReasons) + 1> success_{};
  metrics::Histogram* remote_prefill_;
  metrics::Histogram* kv_wait_;
  metrics::Histogram* kv_transfer_;
  metrics::Counter* kv_transfer_bytes_;
};

}  // namespace pdserve
